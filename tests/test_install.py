"""A clean install works: the sdist, `pip install '<sdist>[farm]'` (no dev extras) into a fresh virtual environment,
then that environment's `farm worker`, `farm flower` and `farm tune` against a real private redis-server.

The sdist is built from a copy of the working tree (setuptools from pyproject.toml's [build-system], in a build
environment of its own) and must carry the tests, examples and docs; a subset of its own tests runs from it.
pip reaches the package index (its cache is reused), so this is one of the slower tests.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from farm_helpers import write_catalog
from servers import WorkerProcess, free_port, wait_for, wait_worker_ready

pytestmark = pytest.mark.servers

ROOT = Path(__file__).resolve().parent.parent
IGNORED = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache",
                                 ".ruff_cache", ".hypothesis", "build", "dist", "*.egg-info", ".farm-cache",
                                 "export", "archives", ".env")
CATALOG = """
[[problems]]
operation = "softmax"
workloads = [{ rows = 8, cols = 16, dtype = "float32" }]

[[problems]]
operation = "transpose"
workloads = [{ rows = 16, cols = 9, dtype = "float64" }]
"""


@dataclass
class Installed:
    venv: Path
    sdist: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def run(*cmd: str | Path, timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def clean_env() -> dict[str, str]:
    """No PYTHONPATH into the repository, no test operations: only what the installed distribution provides."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=IGNORED)
    build = base / "build-env"
    run(sys.executable, "-m", "venv", build)
    requires = __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    run(build / "bin" / "python", "-m", "pip", "install", "-q", *requires)
    dist = base / "dist"
    name = run(build / "bin" / "python", "-c", f"from setuptools import build_meta as m; print(m.build_sdist({str(dist)!r}))",
               cwd=source).stdout.strip().splitlines()[-1]
    venv = base / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", f"{dist / name}[farm]", env=clean_env(), cwd=base)
    yield Installed(venv, dist / name)


def test_the_sdist_carries_the_tests_examples_docs_and_deployment_files(installed):
    with tarfile.open(installed.sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    expected = {"LICENSE", "README.md", "pyproject.toml", "MANIFEST.in", "compose.yaml", "compose.cpu.yaml",
                ".env.example", "tools/dev.py", "examples/catalog.toml", "docs/deployment.md", "tests/conftest.py",
                "tests/servers.py", "tests/farm_helpers.py", "tests/farm_testops.py", "docker/worker.Dockerfile",
                "requirements/farm.lock", "requirements/cuda.lock", "farm/__main__.py", "cli/__init__.py"}
    assert expected - names == set()
    assert not {n for n in names if n == ".env" or "__pycache__" in n or n.startswith(".venv")}


def test_a_clean_install_has_consistent_dependencies_and_both_entry_points(installed):
    env = clean_env()
    run(installed.bin("python"), "-m", "pip", "check", env=env)
    # The original crash: kombu's Redis transport imports `packaging`, which only kombu[redis] declares.
    run(installed.bin("python"), "-c", "import kombu.transport.redis, celery, flower, pyarrow, redis", env=env)
    assert "version 0.1.0" in run(installed.bin("farm"), "--version", env=env).stdout
    assert "version 0.1.0" in run(installed.bin("python"), "-m", "farm", "--version", env=env, cwd="/").stdout
    assert "version 0.1.0" in run(installed.bin("python"), "-m", "farm_cli", "--version", env=env, cwd="/").stdout
    dev_only = run(installed.bin("python"), "-c", "import importlib.util as u; print([m for m in "
                   "('pytest', 'hypothesis', 'yaml', 'mypy') if u.find_spec(m)])", env=env).stdout.strip()
    assert dev_only == "[]", "the clean install pulled in development packages"


def http_get(port: int, path: str, auth: str | None) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
        connection.request("GET", path, headers=headers)
        return connection.getresponse().status
    except OSError:
        return 0
    finally:
        connection.close()


def test_a_clean_install_runs_a_worker_flower_and_a_tune_against_a_real_redis(installed, redis_db, redis_srv, tmp_path):
    env = {**clean_env(), "PYTHONUNBUFFERED": "1"}
    broker, results = redis_srv.url(0), redis_srv.url(1)
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([installed.bin("farm"), "worker", "--device", "cpu:0", "--broker", broker,
                                    "--redis", results], stdout=out, stderr=subprocess.STDOUT, env=env,
                                   cwd=tmp_path, start_new_session=True)
    worker = WorkerProcess("cpu:0", process, log)
    port = free_port()
    auth = "operator:install-test-pass-1234"
    flower_log = tmp_path / "flower.log"
    with open(flower_log, "wb") as out:
        flower = subprocess.Popen([installed.bin("farm"), "flower", "--broker", broker, "--address", "127.0.0.1",
                                   "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                  env={**env, "FARM_FLOWER_BASIC_AUTH": auth}, cwd=tmp_path, start_new_session=True)
    try:
        wait_worker_ready(worker, redis_db, "farm")

        def flower_up() -> bool:
            if flower.poll() is not None:
                pytest.fail(f"farm flower exited {flower.returncode}:\n{flower_log.read_text()[-3000:]}")
            return http_get(port, "/healthcheck", None) == 200

        wait_for(flower_up, 60, "Flower to answer")
        assert http_get(port, "/api/workers", None) == 401
        assert http_get(port, "/", auth) == 200

        catalog = write_catalog(tmp_path / "catalog.toml", CATALOG)
        done = run(installed.bin("farm"), "tune", catalog, "--broker", broker, "--redis", results, "--json",
                   "--timeout", "240", env=env, cwd=tmp_path, timeout=300)
        report = json.loads(done.stdout)
        assert len(report["decisions"]) == 2
        assert [r for r in report["decisions"] if r["record"] is None or r["error"]] == []
        status = json.loads(run(installed.bin("farm"), "status", "--redis", results, "--json", env=env).stdout)
        assert status, "farm status printed nothing"
    finally:
        for p in (flower, process):
            if p.poll() is None:
                os.killpg(p.pid, 15)
        for p in (flower, process):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)


def test_the_sdist_runs_its_own_tests(installed, tmp_path):
    with tarfile.open(installed.sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    env = clean_env()
    run(installed.bin("python"), "-m", "pip", "install", "-q", "pytest", "pytest-timeout", "hypothesis", env=env)
    # From the unpacked sdist, against the installed distribution (pytest's rootdir conftest adds only tests/).
    done = run(installed.bin("pytest"), "-q", "-p", "no:cacheprovider", "tests/test_identity.py",
               "tests/test_policy.py", "tests/test_kernels_registry.py", env=env, cwd=unpacked)
    assert " passed" in done.stdout and "failed" not in done.stdout


# -- optional extras: file-only commands never import redis; a missing extra is one line -------------------------

BLOCKED = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # `import name` now raises ModuleNotFoundError, as without the extra
from farm_cli import main
main(args=sys.argv[2:], prog_name="farm")
"""


def farm_without(modules: str, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKED, modules, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})


def test_archive_commands_that_need_only_files_run_without_redis(tmp_path):
    from archive_helpers import FP_A, entry, hand_archive, key_for

    a = hand_archive(tmp_path / "a", FP_A, [entry(key_for(FP_A, "n=1")), entry(key_for(FP_A, "n=2"))])
    b = hand_archive(tmp_path / "b", FP_A, [entry(key_for(FP_A, "n=1"), winner=2, created=2000.0)])
    steps = [
        ("archive", "inspect", a, "--json"),
        ("archive", "merge", tmp_path / "merged", a, b),
        ("archive", "diff", a, b, "--json"),
        ("archive", "import", a, "--into-cache", tmp_path / "cache", "--force"),
        ("archive", "export", "--from-cache", tmp_path / "cache", "--out", tmp_path / "exported"),
    ]
    for step in steps:
        done = farm_without("redis,celery,kombu", *step, cwd=tmp_path)
        assert done.returncode == 0, (step, done.stderr[-3000:])
    assert "exported 2 decisions" in done.stdout


@pytest.mark.parametrize(("blocked", "args", "extra"), [
    ("celery", ("worker", "--device", "cpu:0", "--broker", "redis://127.0.0.1:9/0", "--redis", "redis://127.0.0.1:9/1"),
     "farm"),
    ("redis", ("status", "--redis", "redis://127.0.0.1:9/1"), "farm"),
    ("pyarrow", ("archive", "inspect", "archive"), "farm"),
])
def test_a_missing_extra_is_one_line_naming_the_install_command(tmp_path, blocked, args, extra):
    from archive_helpers import FP_A, entry, hand_archive, key_for

    hand_archive(tmp_path / "archive", FP_A, [entry(key_for(FP_A, "n=1"))])
    done = farm_without(blocked, *args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (f"farm: error: this command needs {blocked}, which is not installed: "
                           f"pip install 'tuning-farm[{extra}]'\n")


def test_a_cuda_worker_without_cupy_ends_with_the_probes_install_hint(tmp_path):
    done = farm_without("cupy", "worker", "--device", "cuda:0", "--broker", "redis://127.0.0.1:9/0", "--redis",
                        "redis://127.0.0.1:9/1", cwd=tmp_path)
    assert done.returncode == 2
    # The probe runs in a child process (CUDA is never initialized in the worker's parent); its message comes back.
    (line,) = done.stderr.splitlines()
    assert line.startswith("farm: error: --device cuda:0: ") and "pip install 'tuning-farm[cuda]'" in line
    assert "CalledProcessError" not in done.stderr
