"""The fleet's compile queue: a real ``farm worker --compile`` process (Celery, prefork) on a private redis-server
compiles what ``farm compile --broker --redis`` sends, storing cubins and verdicts in the Redis kernel cache; a
second fleet compile sends nothing. No GPU: NVRTC comes from the nvidia-cuda-nvrtc-cu12 wheel."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from nvrtc_support import skip_without_nvrtc
from servers import WorkerProcess, farm_env, wait_for

from farm_cli import main
from farm_coordinator.compilefleet import compile_on_fleet, compile_workers
from farm_fleet.errors import CompileTimeout
from farm_fleet.settings import Settings
from farm_kernels import matmul
from farm_kernels.cuda import compile as stage
from farm_kernels.cuda import kcache
from farm_workers.compile import compile_batch

ARCH = "sm_90"


@pytest.fixture(autouse=True)
def needs_nvrtc() -> None:
    skip_without_nvrtc()


@pytest.fixture
def compile_worker(redis_srv: Any, redis_db: Any, tmp_path: Path) -> Iterator[WorkerProcess]:
    log = tmp_path / "compile-worker.log"
    args = [sys.executable, "-m", "farm_cli", "worker", "--compile", "--cores", "2",
            "--broker", redis_srv.url(0), "--redis", redis_srv.url(1)]
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=farm_env(), cwd=tmp_path,
                                   start_new_session=True)
    worker = WorkerProcess("compile", process, log)
    try:
        yield worker
    finally:
        worker.stop()


def test_farm_compile_on_the_fleet_is_served_by_a_compile_worker_and_a_second_run_sends_nothing(
        redis_srv: Any, redis_db: Any, compile_worker: WorkerProcess, tmp_path: Path) -> None:
    catalog = tmp_path / "c.toml"
    catalog.write_text('[[problems]]\noperation = "matmul"\ndevices = ["cuda"]\n'
                       'workloads = [{ m = 64, n = 64, k = 64, dtype = "float32" }]\n')
    args = ["compile", str(catalog), "--arch", ARCH, "--broker", redis_srv.url(0), "--redis", redis_srv.url(1),
            "--timeout", "240", "--json"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output + compile_worker.output()
    counts = json.loads(first.output)
    configs = len(list(matmul.cuda_tunable().spaces[0].feasible_ranks()))
    assert (counts["configs"], counts["compiled"], counts["cached"], counts["infeasible"]) == (configs, configs, 0, 1)
    assert len(redis_db.keys(kcache.REDIS_PREFIX + "*")) == configs
    second = json.loads(CliRunner().invoke(main, args).output)
    assert (second["compiled"], second["cached"]) == (0, configs)
    assert compile_worker.process.poll() is None, compile_worker.output()


def test_a_fleet_compile_without_a_compile_worker_times_out_naming_the_queue(redis_srv: Any, redis_db: Any) -> None:
    settings = Settings.from_env(broker_url=redis_srv.url(0), redis_url=redis_srv.url(1))
    jobs = stage.jobs_for([matmul.cuda_tunable()], ARCH)[:1]
    with pytest.raises(CompileTimeout, match="farm.compile.*farm worker --compile"):
        compile_on_fleet(jobs, settings, timeout=0.5)


def test_the_compile_task_skips_what_the_cache_already_holds(redis_srv: Any, redis_db: Any) -> None:
    cache = kcache.open_cache(redis_url=redis_srv.url(1))
    jobs = [j.to_json() for j in stage.jobs_for([matmul.cuda_tunable()], ARCH)[:2]]
    assert compile_batch(jobs, cache) == 2
    assert compile_batch(jobs, cache) == 0  # a redelivered task rewrites nothing


def test_farm_worker_needs_a_device_unless_it_serves_the_compile_queue() -> None:
    done = CliRunner().invoke(main, ["worker", "--broker", "redis://127.0.0.1:1/0", "--redis", "redis://127.0.0.1:1/1"])
    assert done.exit_code == 2 and "--device is required (or --compile)" in done.output


def test_the_coordinators_compile_stage_goes_to_the_compile_queue_once_a_compile_worker_answers(
        redis_srv: Any, redis_db: Any, compile_worker: WorkerProcess, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from farm_coordinator import precompile
    from farm_coordinator.catalog import load_catalog
    from farm_coordinator.plan import Target

    settings = Settings.from_env(broker_url=redis_srv.url(0), redis_url=redis_srv.url(1))
    (node,) = wait_for(lambda: compile_workers(settings), 120, "the compile worker to answer a ping")
    assert node.startswith("compile@")
    catalog = tmp_path / "c.toml"
    catalog.write_text('[[problems]]\noperation = "matmul"\ndevices = ["cuda"]\n'
                       'workloads = [{ m = 64, n = 64, k = 64, dtype = "float32" }]\n')
    here: list[int] = []
    monkeypatch.setattr(precompile, "local_compiler", lambda cache, processes: here.append(processes))

    cache = kcache.open_cache(redis_url=redis_srv.url(1))
    compiler = precompile.fleet_compiler(settings, cache, 1, timeout=240)
    target = Target("f" * 16, "NVIDIA H200; sm_90; 132 SMs", "cuda", ("w0",))
    done = precompile.precompile(load_catalog(catalog, ()), [target], compiler)
    configs = len(list(matmul.cuda_tunable().spaces[0].feasible_ranks()))
    summary = done.summaries[ARCH]
    assert (summary.configs, summary.compiled, summary.infeasible) == (configs, configs, 1), compile_worker.output()
    assert len(redis_db.keys(kcache.REDIS_PREFIX + "*")) == configs  # stored by the compile worker
    assert list(done.for_target(target.digest, "matmul")) == ["gemm[tile=128,coarsen=16]"]
    assert here == []  # a compile worker serves the queue: nothing compiled here


def test_without_a_compile_worker_no_node_answers_the_ping(redis_srv: Any, redis_db: Any) -> None:
    settings = Settings.from_env(broker_url=redis_srv.url(0), redis_url=redis_srv.url(1))
    assert compile_workers(settings, timeout=0.2) == []
