#!/usr/bin/env python3
"""The prepared device check: ``python3 tools/dev.py gpu-check`` on a machine with one NVIDIA GPU.

Parts, each under its own time limit (``--dry-run`` prints them), all within ``TOTAL`` seconds (8 minutes):

1. **setup**: ``.venv-gpu`` with the system's site packages (a GPU image's CuPy, NumPy, PyArrow are reused), the
   project installed editable without build isolation, and whatever is missing installed with pip (CuPy as
   ``cupy-cuda12x``; a folder ``.gpu-wheels/`` of wheels is used instead of an index when present: a GPU machine
   without one gets it from ``--prepare-wheels 3.12`` run on a machine with one); ``redis-server`` from the PATH or
   apt-get.
2. **pytest**: ``pytest -m gpu`` over the test files that have GPU tests (JUnit XML kept), and the Triton tier's
   (``tests/triton``: a kernel compiled for the device, tuned by the embedded farm on ``cuda:0`` and served to
   ``@triton.autotune`` with no benchmark) when ``.venv-gpu`` has torch and triton (a GPU image's, through the
   system site packages).
3. **bench**: ``bench/gpu.py``: trial overhead of END_TO_END and DEVICE timing against CUDA-event kernel time, and
   the winners by shape of the five operations with their ratios to the CuPy/cuBLAS references.
4. **farm** (``tools/gpu_farm.py``): a private redis-server, one ``farm worker --device cuda:0``, ``farm tune`` of
   the example catalog's CUDA problems (decisions published), ``farm archive export`` and ``farm status``. Without
   redis-server, the embedded farm tunes the same catalog into a cache folder, exported the same way.

Everything lands in ``--out`` (default ``gpu-report/``): ``summary.md``, ``summary.json``, ``logs/<part>.log``,
``pytest.xml``, ``bench/``, ``farm/``. A part that outlives its limit is stopped (its process group gets SIGTERM,
then SIGKILL) and marked ``timed out``; what it wrote is kept and the next part runs. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-gpu"
VPY = VENV / "bin" / "python"
WHEELS = ROOT / ".gpu-wheels"
TOTAL = 480.0
LIMITS = {"setup": 70.0, "pytest": 120.0, "bench": 140.0, "farm": 130.0}  # + 20 s for probes and the report
# import name -> what pip installs when it is missing
NEEDS = {"cupy": "cupy-cuda12x", "numpy": "numpy", "click": "click", "rich": "rich", "celery": "celery",
         "redis": "redis", "pyarrow": "pyarrow", "pytest": "pytest", "pytest_timeout": "pytest-timeout"}


@dataclass
class Part:
    name: str
    limit: float
    status: str = "not run"  # ok | failed (rc N) | timed out | not run
    seconds: float = 0.0
    note: str = ""


def use_environment(venv: Path) -> None:
    """Point the parts at another environment (its bin/python and bin/farm)."""
    global VENV, VPY
    VENV, VPY = venv.absolute(), venv.absolute() / "bin" / "python"


def gpu_test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if "mark.gpu" in p.read_text(encoding="utf-8"))


def triton_tier() -> list[str]:
    """``tests/triton`` when the GPU environment has torch and triton (the Triton tier), else nothing."""
    if not VPY.exists():
        return []
    probe = subprocess.run([str(VPY), "-c", "import torch, triton"], capture_output=True, timeout=120)
    return ["tests/triton"] if probe.returncode == 0 else []


def plan(out: Path) -> list[tuple[str, float, list[str]]]:
    """(part, seconds allowed, what it runs) for --dry-run and the summary."""
    from gpu_farm import FARM_POLICY

    py, farm = str(VPY), str(VENV / "bin" / "farm")
    return [
        ("setup", LIMITS["setup"], [
            f"{sys.executable} -m venv --system-site-packages {VENV}  (if missing)",
            f"{py} -m pip install --no-build-isolation --no-deps -e {ROOT}",
            f"{py} -m pip install [--no-index --find-links {WHEELS}] <missing of: {', '.join(NEEDS.values())}>",
            "apt-get install -y redis-server  (if redis-server is not on the PATH)"]),
        ("pytest", LIMITS["pytest"], [f"{py} -m pytest -m gpu -q --timeout 75 --junitxml {out}/pytest.xml {' '.join(gpu_test_files())} [tests/triton with FARM_TRITON_TIER=1, when {py} has torch and triton]"]),
        ("bench", LIMITS["bench"], [f"{py} bench/gpu.py --require-device --out {out}/bench --deadline {LIMITS['bench'] - 25:.0f}"]),
        ("farm", LIMITS["farm"], [
            f"redis-server --port <free> --bind 127.0.0.1 --dir {out}/farm (private)",
            f"{farm} worker --device cuda:0 --broker redis://127.0.0.1:<port>/0 --redis redis://127.0.0.1:<port>/1",
            f"{farm} tune {out}/farm/cuda-catalog.toml --broker ... --redis ... --timeout {LIMITS['farm'] - 45:.0f} --json "
            f"(examples/catalog.toml's CUDA problems, policy {FARM_POLICY})",
            f"{farm} archive export --redis ... --out {out}/farm/archive; {farm} status --redis ... --json",
            f"(no redis-server: {farm} tune ... --device cuda:0 --cache-dir {out}/farm/cache; archive export --from-cache)"]),
    ]


def run_limited(cmd: list[str], log: Path, deadline: float, env: dict[str, str] | None = None,
                stdout: Path | None = None) -> tuple[int | None, str]:
    """Run ``cmd`` in its own process group until ``deadline`` (monotonic); append its output to ``log`` (and its
    stdout to ``stdout`` when given). Returns (exit code, "") or (None, "timed out") after stopping the group."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as err, (stdout.open("wb") if stdout else log.open("ab")) as out:
        err.write(f"\n+ {' '.join(cmd)}\n".encode())
        err.flush()
        process = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT, env=env, start_new_session=True)
        try:
            return process.wait(max(0.1, deadline - time.monotonic())), ""
        except subprocess.TimeoutExpired:
            stop_group(process)
            err.write(b"\n[gpu-check] stopped at its time limit\n")
            return None, "timed out"


def stop_group(process: subprocess.Popen[bytes], grace: float = 8.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def missing_modules() -> list[str]:
    code = f"import importlib.util, json; print(json.dumps([n for n in {list(NEEDS)!r} if importlib.util.find_spec(n) is None]))"
    done = subprocess.run([str(VPY), "-c", code], capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout) if done.returncode == 0 else list(NEEDS)


def setup(part: Part, logs: Path, deadline: float) -> None:
    log = logs / "setup.log"
    if not VPY.exists():
        code, why = run_limited([sys.executable, "-m", "venv", "--system-site-packages", str(VENV)], log, deadline)
        if code != 0:
            part.status, part.note = why or f"failed (rc {code})", "cannot create .venv-gpu: see logs/setup.log"
            return
        inherit_site_packages()
    code, why = run_limited([str(VPY), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "-e", str(ROOT)],
                            log, deadline)
    if why:
        part.status, part.note = why, "pip install -e: see logs/setup.log"
        return
    if code != 0:
        link_sources()
        part.note = "sources linked (pip install -e failed: see logs/setup.log)"
    missing = missing_modules()
    if missing:
        source = ["--no-index", "--find-links", str(WHEELS)] if WHEELS.is_dir() else ["--timeout", "10", "--retries", "1"]
        code, why = run_limited([str(VPY), "-m", "pip", "install", "-q", *source, *(NEEDS[m] for m in missing)], log, deadline)
        still = missing_modules()
        part.note = "; ".join(filter(None, [part.note, f"installed {', '.join(sorted(set(missing) - set(still))) or 'nothing'}"]))
        if still:
            part.status, part.note = why or "failed", part.note + f"; still missing: {', '.join(still)}"
            return
    from gpu_farm import redis_binary

    if redis_binary() is None and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run_limited(["apt-get", "install", "-y", "-qq", "redis-server"], log, deadline, env=env)
    from gpu_farm import redis_binary

    found = redis_binary()
    redis = f"redis-server {found[0]}" if found else "no redis-server: the farm part runs embedded"
    part.note = "; ".join(filter(None, [part.note, redis]))
    part.status = "ok"


def prepare_wheels(python: str = "3.12") -> int:
    """On a machine with a package index: the farm's wheels for an offline GPU machine's Python into .gpu-wheels/,
    and this machine's redis-server with its less common libraries into .gpu-wheels/redis/ (carry the folder along;
    CuPy is not among them: GPU images ship one, and its wheel is too large to carry)."""
    platforms = [a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64") for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", python,
           "--implementation", "cp", *platforms, "-d", str(WHEELS), "celery>=5.4", "redis>=5", "pytest-timeout>=2.3"]
    print("+", " ".join(cmd), flush=True)
    code = subprocess.call(cmd)
    server = shutil.which("redis-server")
    if server is None:
        print("gpu-check: no redis-server here to carry (the farm part then runs embedded)")
        return code
    folder = WHEELS / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(os.path.realpath(server), folder / "redis-server")
    ldd = subprocess.run(["ldd", server], capture_output=True, text=True).stdout
    for name, path in re.findall(r"^\s*(\S+) => (\S+)", ldd, re.M):
        if name.startswith(("liblzf", "libjemalloc", "libatomic")):
            shutil.copy2(os.path.realpath(path), folder / name)
    print(f"gpu-check: carried {', '.join(sorted(p.name for p in folder.iterdir()))} in {folder}")
    return code


def link_sources() -> None:
    """The project without pip (no setuptools/wheel offline): its folders linked under their import names
    (pyproject's package-dir) on .venv-gpu's path, and a ``farm`` script. Its version then reads 0+unknown."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]
    src = VENV / "src"
    src.mkdir(exist_ok=True)
    for name, folder in package_dir.items():
        link = src / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(ROOT / folder, target_is_directory=True)
    site_packages = next((VENV / "lib").glob("python*/site-packages"))
    (site_packages / "_gpu_check_sources.pth").write_text(f"{src}\n", encoding="utf-8")
    script = VENV / "bin" / "farm"
    script.write_text(f"#!{VPY}\nimport sys\nfrom farm_cli import main\nsys.exit(main())\n", encoding="utf-8")
    script.chmod(0o755)


def inherit_site_packages() -> None:
    """When this runs inside a virtual environment (a GPU image's Python often is one: its CuPy lives there, not in
    the base interpreter that --system-site-packages reaches), .venv-gpu sees that environment's packages too."""
    if sys.prefix == sys.base_prefix:
        return
    import site

    target = next((VENV / "lib").glob("python*/site-packages"))
    (target / "_gpu_check_parent.pth").write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")


def environment(out: Path) -> dict[str, str]:
    info = {"host": platform.node(), "python": sys.version.split()[0], "commit": _git("rev-parse", "HEAD"),
            "dirty": str(bool(_git("status", "--porcelain")))}
    smi = shutil.which("nvidia-smi")
    if smi:
        done = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
        info["gpu"] = done.stdout.strip() or done.stderr.strip()
    else:
        info["gpu"] = "nvidia-smi not found"
    if VPY.exists():
        code = "import cupy; print('cupy', cupy.__version__, 'runtime', cupy.cuda.runtime.runtimeGetVersion())"
        done = subprocess.run([str(VPY), "-c", code], capture_output=True, text=True, timeout=60)
        said = (done.stdout + done.stderr).strip().splitlines()
        info["cupy"] = said[-1] if said else "?"
    (out / "env.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    return info


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def junit_verdict(xml: Path, status: str) -> tuple[str, str]:
    """pytest's counts; on a GPU machine a skipped GPU test is a failure (CuPy or the device is missing)."""
    if not xml.exists():
        return status, "no pytest.xml"
    suite = ElementTree.parse(xml).getroot()
    if suite.tag != "testsuite":
        inner = suite.find("testsuite")
        suite = inner if inner is not None else suite
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    note = ", ".join(f"{v} {k}" for k, v in counts.items())
    if status == "ok" and (counts["skipped"] or not counts["tests"]):
        return "failed (skipped GPU tests)", note
    return status, note


def summarize(out: Path, parts: list[Part], info: dict[str, str], started: float) -> None:
    lines = ["# GPU check", "", f"Total {time.monotonic() - started:.0f} s of {TOTAL:.0f} s allowed.", "",
             *(f"- {k}: {v}" for k, v in info.items()), "", "| part | status | seconds | limit | note |",
             "|---|---|---:|---:|---|"]
    lines += [f"| {p.name} | {p.status} | {p.seconds:.0f} | {p.limit:.0f} | {p.note} |" for p in parts]
    pytest_log = out / "logs" / "pytest.log"
    if pytest_log.exists():
        tail = [line for line in pytest_log.read_text(errors="replace").splitlines() if line.strip()][-15:]
        lines += ["", "## pytest -m gpu (tail)", "", "```", *tail, "```"]
    bench_md = out / "bench" / "bench.md"
    if bench_md.exists():
        lines += ["", bench_md.read_text(encoding="utf-8")]
    elif (out / "bench" / "bench.jsonl").exists():
        lines += ["", "bench stopped before rendering: raw rows in bench/bench.jsonl"]
    from gpu_farm import farm_summary

    lines += farm_summary(out / "farm")
    (out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "summary.json").write_text(json.dumps({"env": info, "parts": [asdict(p) for p in parts]}, indent=2), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-report")
    parser.add_argument("--dry-run", action="store_true", help="print what would run and each part's time limit")
    parser.add_argument("--only", action="append", choices=list(LIMITS), help="run only this part (repeatable)")
    parser.add_argument("--prepare-wheels", metavar="PYTHON", help="download the farm's wheels for an offline GPU "
                        f"machine running this Python version (e.g. 3.12) into {WHEELS.name}/, then stop")
    parser.add_argument("--farm-part", type=float, help=argparse.SUPPRESS)  # internal: run the farm part for N s
    parser.add_argument("--farm-device", default="cuda:0", help=argparse.SUPPRESS)  # cpu:0: the part's smoke test
    parser.add_argument("--python", type=Path, help="use this environment's interpreter instead of .venv-gpu (no setup)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if args.python is not None:
        use_environment(args.python.parent.parent)
    if args.prepare_wheels:
        return prepare_wheels(args.prepare_wheels)
    if args.farm_part is not None:
        from gpu_farm import farm_run

        return farm_run(out, args.farm_part, str(VENV / "bin" / "farm"), args.farm_device)
    if args.dry_run:
        print(f"gpu-check: at most {TOTAL:.0f} s in all, report in {out}/ (summary.md, summary.json, logs/)")
        for name, limit, cmds in plan(out):
            print(f"\n[{name}] at most {limit:.0f} s")
            for cmd in cmds:
                print(f"  {cmd}")
        return 0
    started = time.monotonic()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    wanted = args.only or [name for name in LIMITS if not (name == "setup" and args.python is not None)]
    parts = [Part(name, limit) for name, limit in LIMITS.items() if name in wanted]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for part in parts:
        begin = time.monotonic()
        deadline = min(begin + part.limit, started + TOTAL - 20)
        log = out / "logs" / f"{part.name}.log"
        if part.name == "setup":
            setup(part, out / "logs", deadline)
        else:
            cmd = {
                "pytest": [str(VPY), "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "--timeout", "75", "--junitxml",
                           str(out / "pytest.xml"), *gpu_test_files(), *triton_tier()],
                "bench": [str(VPY), "bench/gpu.py", "--require-device", "--out", str(out / "bench"), "--deadline", f"{max(10.0, deadline - begin - 25):.0f}"],
                "farm": [str(VPY), str(Path(__file__).resolve()), "--out", str(out / "farm"), "--python", str(VPY),
                         "--farm-part", f"{deadline - begin - 10:.0f}"],
            }[part.name]
            code, why = run_limited(cmd, log, deadline, {**env, "FARM_TRITON_TIER": "1"} if part.name == "pytest" else env)
            part.status = why or ("ok" if code == 0 else f"failed (rc {code})")
            if part.name == "pytest":
                part.status, part.note = junit_verdict(out / "pytest.xml", part.status)
            elif part.status != "ok":
                said = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
                part.note = said[-1][-200:].replace("|", "/") if said else ""
        part.seconds = time.monotonic() - begin
        print(f"gpu-check: {part.name}: {part.status} in {part.seconds:.0f} s {part.note}", flush=True)
        summarize(out, parts, {}, started)
    summarize(out, parts, environment(out), started)
    print(f"gpu-check: report in {out}/summary.md")
    return 0 if all(p.status == "ok" for p in parts) else 1


if __name__ == "__main__":
    sys.exit(main())
