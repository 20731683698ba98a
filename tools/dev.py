#!/usr/bin/env python3
"""Set up the project and run it: ``python3 tools/dev.py demo`` or ``python3 tools/dev.py test``.

``python3 tools/dev.py test --lowest [pytest args]`` runs the floors job instead: a second environment
(``.venv-lowest``) with every direct dependency pinned to the floor pyproject.toml declares, and the tests in
``LOWEST_TESTS`` (or the given ones) run in it. ``python3 tools/dev.py test --triton [pytest args]`` runs the
Triton tier: ``.venv-triton`` (torch and triton, built once) and ``tests/triton`` under Triton's interpreter
(``-m gpu``: the device variants, compiled).

Needs only Python 3.11+ and the system package manager: it creates ``.venv``, installs the farm with its
development extras, installs ``redis-server``, ``rabbitmq-server`` and ``chromium``/``chromium-driver`` with apt-get
when tests need them and they are missing, then runs.
Standard library only, on purpose.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
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


# -- the floors job (issue 14): every direct dependency at its declared floor ----------------------------------

LOWEST_VENV = ROOT / ".venv-lowest"
# A representative subset, to fit CI time: every place where the floors matter (Celery/kombu transport options and
# redelivery, redis-py, pyarrow archives, Flower, the CLI) with real servers and workers; the pure-logic rest of the
# suite does not touch a third-party API that changed between the floors and the latest versions.
LOWEST_TESTS = [
    "tests/test_farm_fleet.py",
    "tests/test_farm_recovery.py",
    "tests/test_redis_store.py",
    "tests/test_archive.py",
    "tests/test_archive_runtime.py",
    "tests/test_archive_refusals.py",
    "tests/test_archive_cli.py",
    "tests/test_flower.py",
    "tests/test_worker_tasks.py",
    "tests/test_kernels_host.py",
]
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$")


def floor_pins(pyproject: Path = ROOT / "pyproject.toml", extras: tuple[str, ...] = ("farm",)) -> list[str]:
    """``name==floor`` for every direct dependency (core and ``extras``) that declares a ``>=`` floor."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    pins: dict[str, str] = {}
    for requirement in requirements:
        m = REQUIREMENT.match(requirement.split(";")[0])
        if m is None:
            sys.exit(f"dev.py: {pyproject.name}: cannot read the requirement {requirement!r}")
        name, spec = m[1].lower().replace("_", "-"), m[3]
        if name == project["name"]:
            continue
        floor = re.search(r">=\s*([^,\s]+)", spec)
        if floor is None:
            sys.exit(f"dev.py: {pyproject.name}: {requirement!r} declares no floor (name>=version)")
        pins[name] = f"{name}=={floor[1]}"
    return sorted(pins.values())


def ensure_lowest_venv() -> Path:
    """.venv-lowest with the project installed against its floors (reinstalled when pyproject.toml changes)."""
    python = LOWEST_VENV / "bin" / "python"
    constraints = LOWEST_VENV / "floors.txt"
    pins = "\n".join(floor_pins()) + "\n"
    if not python.exists():
        run(sys.executable, "-m", "venv", str(LOWEST_VENV))
    if not constraints.exists() or constraints.read_text() != pins:
        print("floors:", " ".join(pins.split()), flush=True)
        run(str(python), "-m", "pip", "install", "-q", "--upgrade", "pip")
        tmp = constraints.with_suffix(".tmp")
        tmp.write_text(pins)
        run(str(python), "-m", "pip", "install", "-q", "-c", str(tmp), "-e", f"{ROOT}[dev]")
        tmp.replace(constraints)
    return python


def test_lowest(rest: list[str]) -> int:
    ensure_redis()
    python = ensure_lowest_venv()
    run(str(python), "-c", "import importlib.metadata as m; print(' '.join(f'{d}=={m.version(d)}' for d in "
        "('numpy', 'click', 'rich', 'celery', 'kombu', 'redis', 'pyarrow', 'flower')))")
    args = [a for a in rest if a.startswith("-")]
    paths = [a for a in rest if not a.startswith("-")] or LOWEST_TESTS
    return subprocess.call([str(python), "-m", "pytest", *args, *paths])


# -- the Triton tier (issue 25): torch + triton in their own cached environment -------------------------------

TRITON_VENV = ROOT / ".venv-triton"
# torch pins the triton it was built with; the tier installs exactly these (about 5.4 GB, once).
TRITON_REQUIREMENTS = ("torch==2.14.1",)
TRITON_TESTS = ["tests/triton"]


def ensure_triton_venv() -> Path:
    """.venv-triton with torch, the triton torch wants and the project (editable, with its dev extras).
    Built once: a stamp records the requirements and pyproject.toml; torch itself is reinstalled only when
    TRITON_REQUIREMENTS change."""
    python = TRITON_VENV / "bin" / "python"
    torch_stamp = TRITON_VENV / ".torch-installed"
    stamp = TRITON_VENV / ".installed"
    wanted_torch = " ".join(TRITON_REQUIREMENTS)
    packages = " ".join(sorted(p.parent.name for p in ROOT.glob("*/__init__.py")))
    wanted = f"{(ROOT / 'pyproject.toml').stat().st_mtime_ns} {packages}"
    if not python.exists():
        run(sys.executable, "-m", "venv", str(TRITON_VENV))
    if not torch_stamp.exists() or torch_stamp.read_text() != wanted_torch:
        run(str(python), "-m", "pip", "install", "-q", "--upgrade", "pip")
        run(str(python), "-m", "pip", "install", "-q", *TRITON_REQUIREMENTS)
        torch_stamp.write_text(wanted_torch)
    if not stamp.exists() or stamp.read_text() != wanted:
        run(str(python), "-m", "pip", "install", "-q", "-e", f"{ROOT}[dev]")
        stamp.write_text(wanted)
    return python


def test_triton(rest: list[str]) -> int:
    """The Triton tier: tests/triton in .venv-triton with Triton's interpreter (TRITON_INTERPRET=1, no GPU).
    ``-m gpu`` runs the device variants instead (without the interpreter)."""
    ensure_redis()
    try:
        python = ensure_triton_venv()
        run(str(python), "-c", "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)")
    except subprocess.CalledProcessError as e:
        ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
        print(f"dev.py: the Triton tier's environment ({TRITON_VENV.name}) could not be built: {e}"
              + ("" if ci else "; skipped (it fails under CI=true)"), flush=True)
        return 1 if ci else 0
    gpu = any(a == "gpu" for a in rest)
    env = dict(os.environ, FARM_TRITON_TIER="1")
    env.pop("TRITON_INTERPRET", None)
    if not gpu:  # the interpreter tier: the device variants need real compilation
        env["TRITON_INTERPRET"] = "1"
    given = [a for a in rest if not a.startswith("-") and (ROOT / a.split("::")[0]).exists()]  # test paths
    args = [a for a in rest if a not in given] + ([] if gpu else ["-m", "not gpu"])  # options and their values
    paths = given or TRITON_TESTS
    return subprocess.call([str(python), "-m", "pytest", "-p", "no:cacheprovider", *args, *paths], env=env)


# -- lock files of the images (issue 14) -----------------------------------------------------------------------

LOCKS = {"farm.lock": ("farm",), "cuda.lock": ("farm", "cuda"), "cuda13.lock": ("farm", "cuda13")}


def lock() -> int:
    """Regenerate requirements/*.lock (exact versions and hashes for Python 3.11 on Linux) with pip-compile."""
    if sys.version_info[:2] != (3, 11):
        sys.exit("dev.py lock: run it with Python 3.11 (the images' Python): the locks resolve for the running one")
    tools = ROOT / ".venv-tools"
    if not (tools / "bin" / "pip-compile").exists():
        run(sys.executable, "-m", "venv", str(tools))
        run(str(tools / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip", "pip-tools")
    for name, extras in LOCKS.items():
        run(str(tools / "bin" / "pip-compile"), "-q", "--generate-hashes", "--allow-unsafe", "--strip-extras",
            "--no-emit-index-url", "--no-emit-find-links", "--upgrade", *(f"--extra={e}" for e in extras),
            f"--output-file=requirements/{name}", "pyproject.toml", "requirements/common.in")
    run(str(tools / "bin" / "pip-compile"), "-q", "--generate-hashes", "--allow-unsafe", "--strip-extras",
        "--no-emit-index-url", "--no-emit-find-links", "--upgrade", "--output-file=requirements/build.lock",
        "requirements/build.in")
    return 0


# The folders and the import names they install as (pyproject.toml [tool.setuptools.package-dir]).
PACKAGES = {"farm": "farm", "kernels": "farm_kernels", "fleet": "farm_fleet", "archive_tools": "farm_archives",
            "workers": "farm_workers", "coordinator": "farm_coordinator", "cli": "farm_cli",
            "triton_adapter": "farm_triton"}


def typecheck() -> None:
    """mypy --strict (pyproject.toml) over every package under its import name: mypy cannot follow the editable
    install's mapping of folders to names, so .mypy-src/ holds one link per package (farm_kernels -> ../kernels)
    and mypy runs there; otherwise every import between our packages would be an unchecked Any."""
    links = ROOT / ".mypy-src"
    links.mkdir(exist_ok=True)
    for folder, name in PACKAGES.items():
        link = links / name
        if not link.is_symlink():
            link.symlink_to(Path("..") / folder)
    run(str(BIN / "mypy"), "--config-file", str(ROOT / "pyproject.toml"), *PACKAGES.values(), cwd=str(links))


def ensure_redis() -> None:
    if shutil.which("redis-server") is None:
        apt_install("redis-server")


def ensure_rabbitmq() -> None:
    """The RabbitMQ tests start a private node of their own (tests/rabbitmq.py RabbitMQNode: own node name, ports,
    data and cookie; never the machine's RabbitMQ on 5672): they need rabbitmq-server installed, nothing running."""
    if shutil.which("rabbitmq-server") is None and not Path("/usr/lib/rabbitmq/bin/rabbitmq-server").exists():
        _install_for_tests("the RabbitMQ tests", "rabbitmq-server")


def ensure_browser() -> None:
    """The report's page is tested in a real headless Chromium (tests/browser.py): the distribution's chromium
    and chromedriver, never a browser download."""
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        _install_for_tests("the report's browser tests", "chromium", "chromium-driver")


def _install_for_tests(what: str, *packages: str) -> None:
    """apt-get install ``packages``; without apt-get say what to install and go on (``what`` then skips, or fails
    when CI=true)."""
    if shutil.which("apt-get") is None:
        print(f"dev.py: {what} need {' '.join(packages)}: install them with your system package manager "
              "(they skip without them, and fail when CI=true)")
        return
    apt_install(*packages)


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "test"
    rest = argv[1:]
    if command == "gpu-check":  # its own environment (.venv-gpu): a GPU machine may have no package index
        return subprocess.call([sys.executable, str(ROOT / "tools" / "gpu_check.py"), *rest])
    os.chdir(ROOT)
    if command == "test" and "--lowest" in rest:
        return test_lowest([a for a in rest if a != "--lowest"])
    if command == "test" and "--triton" in rest:
        return test_triton([a for a in rest if a != "--triton"])
    ensure_venv()
    if command == "demo":
        return subprocess.call([str(BIN / "farm"), "tune", "examples/catalog.toml", *rest])
    if command == "test":
        ensure_redis()
        ensure_rabbitmq()
        ensure_browser()
        run(str(BIN / "ruff"), "check", ".")
        typecheck()
        return subprocess.call([str(BIN / "python"), "-m", "pytest", *rest])
    if command == "lock":
        return lock()
    if command == "bench":
        code = 0
        for script in sorted((ROOT / "bench").glob("*.py")):
            code |= subprocess.call([str(BIN / "python"), str(script), *rest])
        return code
    sys.exit(f"dev.py: unknown command {command!r} (demo, test, test --lowest, test --triton, lock, bench, gpu-check)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
