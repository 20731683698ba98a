#!/usr/bin/env python3
"""Set up the project and run it: ``python3 tools/dev.py demo`` or ``python3 tools/dev.py test``.

Needs only Python 3.11+ and the system package manager: it creates ``.venv``, installs the farm with its
development extras, installs ``redis-server`` with apt-get when tests need it and it is missing, then runs.
Standard library only, on purpose.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"


def run(*cmd: str, **kw: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def apt_install(*packages: str) -> None:
    apt = shutil.which("apt-get")
    if apt is None:
        sys.exit(f"dev.py: please install {' '.join(packages)} with your system package manager")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(*sudo, apt, "update", "-qq", env=env)
    run(*sudo, apt, "install", "-y", "-qq", *packages, env=env)


def ensure_venv() -> None:
    if not (BIN / "python").exists():
        try:
            run(sys.executable, "-m", "venv", str(VENV))
        except subprocess.CalledProcessError:
            shutil.rmtree(VENV, ignore_errors=True)
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            apt_install(f"python{version}-venv")
            run(sys.executable, "-m", "venv", str(VENV))
    # The editable install maps the top-level packages that existed when it ran: reinstall when they change.
    stamp = VENV / ".installed"
    packages = " ".join(sorted(p.parent.name for p in ROOT.glob("*/__init__.py")))
    want = f"{(ROOT / 'pyproject.toml').stat().st_mtime_ns} {packages}"
    if not stamp.exists() or stamp.read_text() != want:
        run(str(BIN / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip")
        run(str(BIN / "python"), "-m", "pip", "install", "-q", "-e", f"{ROOT}[dev]")
        stamp.write_text(want)


def ensure_redis() -> None:
    if shutil.which("redis-server") is None:
        apt_install("redis-server")


def ensure_rabbitmq() -> None:
    """The RabbitMQ tests use 127.0.0.1:5672 (guest/guest) with a vhost of their own. Where no server answers
    there, start a private one (data and logs under .venv/rabbitmq); without rabbitmq-server say so and go on
    (those tests skip, or fail when CI=true)."""
    import socket
    import time

    with socket.socket() as s:
        s.settimeout(1.0)
        if s.connect_ex(("127.0.0.1", 5672)) == 0:
            return
    server = shutil.which("rabbitmq-server")
    if server is None:
        print("dev.py: rabbitmq-server is not installed: the RabbitMQ tests will skip (apt-get install rabbitmq-server)")
        return
    base = VENV / "rabbitmq"
    base.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, RABBITMQ_MNESIA_BASE=str(base / "mnesia"), RABBITMQ_LOG_BASE=str(base / "log"),
               RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT="5672")
    run(server, "-detached", env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex(("127.0.0.1", 5672)) == 0:
                return
        time.sleep(1.0)
    print("dev.py: the private RabbitMQ did not start within 60 s; see .venv/rabbitmq/log")


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "test"
    rest = argv[1:]
    ensure_venv()
    os.chdir(ROOT)
    if command == "demo":
        return subprocess.call([str(BIN / "farm"), "tune", "examples/catalog.toml", *rest])
    if command == "test":
        ensure_redis()
        ensure_rabbitmq()
        run(str(BIN / "ruff"), "check", ".")
        run(str(BIN / "mypy"))
        return subprocess.call([str(BIN / "python"), "-m", "pytest", *rest])
    if command == "bench":
        code = 0
        for script in sorted((ROOT / "bench").glob("*.py")):
            code |= subprocess.call([str(BIN / "python"), str(script), *rest])
        return code
    sys.exit(f"dev.py: unknown command {command!r} (demo, test, bench)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
