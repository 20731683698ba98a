"""The README's fleet recipe, end to end with real processes: a private redis-server, a `farm worker` (one core,
one thread per pool: regime ``cpus=1; blas=1; openmp=1``), `farm tune` through the fleet, then an application.

A plain ``python app.py`` on a bigger CPU set runs another regime: it gets no fleet hit, and the fleet tier says so
once, naming both regimes and how to match them. Run in the workers' regime (``taskset -c 0 python app.py``), the
same application is served the fleet's decision. `farm status` shows the regime each fingerprint decided in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
from farm_helpers import WORKER_ENV, write_catalog
from servers import TESTS, farm_env, start_worker, wait_worker_ready

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one for the worker's regime"),
    pytest.mark.skipif(shutil.which("taskset") is None, reason="the recipe runs the application with taskset"),
]

SPEC = {"rows": 64, "cols": 64, "dtype": "float64"}
POLICY = "samples = 3\nbudget = 2.0\n"  # timing settings only: the cache key is the default StackPolicy's
CATALOG = """
[[problems]]
operation = "softmax"
devices = ["cpu"]
workloads = [{ rows = 64, cols = 64, dtype = "float64" }]
"""


def app(redis_url: str, env: dict[str, str], cwd, taskset: str | None = None) -> tuple[dict, str]:
    """Run tests/fleet_app.py (under ``taskset -c CPUS`` when given): its stats and its stderr."""
    command = [sys.executable, str(TESTS / "fleet_app.py"), redis_url, json.dumps(SPEC)]
    if taskset is not None:
        command = ["taskset", "-c", taskset, *command]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_an_application_gets_fleet_hits_in_the_workers_regime_and_a_warning_naming_both_regimes_outside_it(
        redis_srv, tmp_path):
    prefix = f"recipe{uuid.uuid4().hex[:6]}"
    redis_srv.client(0).flushall()
    env = farm_env({**WORKER_ENV, "FARM_PREFIX": prefix})
    broker, decisions = redis_srv.url(0), redis_srv.url(1)
    worker = start_worker("cpu:0", broker, decisions, tmp_path, env, kernels=())
    try:
        wait_worker_ready(worker, redis_srv.client(1), prefix)
        tuned = subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(write_catalog(tmp_path / "c.toml", CATALOG, POLICY)),
                                "--broker", broker, "--redis", decisions], capture_output=True, text=True, env=env,
                               cwd=tmp_path, timeout=600)
        assert tuned.returncode == 0, tuned.stderr[-4000:]

        status = subprocess.run([sys.executable, "-m", "farm_cli", "status", "--redis", decisions, "--json"],
                                capture_output=True, text=True, env=env, timeout=120)
        assert status.returncode == 0, status.stderr
        (decided,) = [f for f in json.loads(status.stdout)["fingerprints"] if f["decisions"]]
        assert decided["regime"].startswith("cpus=1; blas=1") and "openmp=1" in decided["regime"]

        plain, warned = app(decisions, env, tmp_path)  # `python app.py`: every CPU of this machine, pools to match
        assert plain["fleet_hits"] == 0 and plain["tunes"] == 1
        lines = [line for line in warned.splitlines() if "fleet miss across regimes" in line]
        assert len(lines) == 1, warned
        assert "`cpus=1; blas=1" in lines[0] and f"`cpus={len(os.sched_getaffinity(0))}; blas=" in lines[0]
        assert "softmax" in lines[0] and "taskset -c 0 python app.py" in lines[0] and "--cores" in lines[0]

        matched, quiet = app(decisions, env, tmp_path, taskset="0")  # the recipe: the application in the workers' regime
        assert matched["fleet_hits"] == 1 and matched["tunes"] == 0, quiet
        assert "fleet miss across regimes" not in quiet
    finally:
        worker.stop()
