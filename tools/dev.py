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


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "test"
    rest = argv[1:]
    if command == "gpu-check":  # its own environment (.venv-gpu): a GPU machine may have no package index
        return subprocess.call([sys.executable, str(ROOT / "tools" / "gpu_check.py"), *rest])
    ensure_venv()
    os.chdir(ROOT)
    if command == "demo":
        return subprocess.call([str(BIN / "farm"), "tune", "examples/catalog.toml", *rest])
    if command == "test":
        ensure_redis()
        run(str(BIN / "ruff"), "check", ".")
        run(str(BIN / "mypy"))
        return subprocess.call([str(BIN / "python"), "-m", "pytest", *rest])
    if command == "bench":
        code = 0
        for script in sorted((ROOT / "bench").glob("*.py")):
            code |= subprocess.call([str(BIN / "python"), str(script), *rest])
        return code
    sys.exit(f"dev.py: unknown command {command!r} (demo, test, bench, gpu-check)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
