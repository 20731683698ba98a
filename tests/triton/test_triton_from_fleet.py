"""The whole loop with real processes: an application misses a Triton launch and reports it, ``farm tune
--from-fleet`` tunes it on a real ``farm worker`` (Celery, Triton's interpreter), and a fresh application gets
the published config from the fleet's Redis with no benchmark."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from farm_helpers import WORKER_ENV
from servers import farm_env, start_worker, wait_worker_ready
from tier import FLEET_POLICY, HERE, POLICY, app


@pytest.mark.servers
def test_a_reported_triton_miss_is_tuned_from_the_fleet_and_served_without_a_benchmark(redis_srv, tmp_path: Path) -> None:
    from triton_kernels import CONFIGS

    prefix = f"tt{secrets.token_hex(4)}"
    redis_srv.client(0).flushall()
    env = farm_env({**WORKER_ENV, "FARM_PREFIX": prefix, "TRITON_INTERPRET": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])
    broker, results = redis_srv.url(0), redis_srv.url(1)
    (tmp_path / "policy.toml").write_text(POLICY)
    (tmp_path / "fleet.toml").write_text(FLEET_POLICY)
    worker = start_worker("cpu:0", broker, results, tmp_path, env, kernels=("triton_ops",))
    try:
        wait_worker_ready(worker, redis_srv.client(1), prefix)
        missed = app(tmp_path, 1500, "--cpu0", "--on-miss", "first", "--report-to", results, environ={"FARM_PREFIX": prefix})
        assert missed == {"config": str(CONFIGS[0]), "correct": True, "hits": 0, "misses": 1}

        done = subprocess.run([sys.executable, "-m", "farm_cli", "tune", "--from-fleet", str(tmp_path / "fleet.toml"),
                               "--kernels", "triton_ops", "--broker", broker, "--redis", results],
                              capture_output=True, text=True, env={**env, "COLUMNS": "250"}, cwd=tmp_path, timeout=400)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + worker.output()[-3000:]
        assert "1 of 1 reported problems decided; 1 reports acknowledged" in done.stdout, done.stdout

        served = app(tmp_path, 1500, "--cpu0", "--fleet", results, environ={"FARM_PREFIX": prefix})
        assert served["hits"] == 1 and served["misses"] == 0 and served["correct"] is True
        assert served["config"] in (str(CONFIGS[2]), str(CONFIGS[3]))  # the fast ones; 48 cannot compile
    finally:
        worker.stop()
