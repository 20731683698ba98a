"""Tuning regime = serving regime, with real processes: a private redis-server, `farm worker`s pinned to their
cores, and application processes that take a CPU set before NumPy loads (as ``taskset`` would).

Two workers pinned to one core each publish, for a BLAS-bound workload, a decision whose fingerprint is the one an
application on one core with one BLAS thread computes for itself; that application reproduces the winner by
tuning in-process and is served the published decision, while an application on two cores with two BLAS threads
has another fingerprint and is never served it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from farm_helpers import WORKER_ENV, Fleet, write_catalog
from servers import TESTS, farm_env, start_worker, wait_worker_ready

from farm_coordinator.catalog import load_catalog
from farm_coordinator.run import RunOptions, tune
from farm_coordinator.status import collect
from farm_fleet import presence
from farm_fleet.settings import Settings

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs for two pinned workers"),
]

KERNELS = ("farm_regimeops",)
BLAS = """
[[problems]]
operation = "regimetest_blas"
workloads = [{ n = 96, dtype = "float64" }]
"""
SPEC = {"n": 96, "dtype": "float64"}


@contextlib.contextmanager
def regime_fleet(redis, directory: Path, workers: tuple[tuple[str, tuple[str, ...]], ...]) -> Iterator[Fleet]:
    """Workers ``(device, extra arguments)`` loading farm_regimeops, under a fresh key prefix."""
    prefix = f"r{uuid.uuid4().hex[:8]}"
    redis.client(0).flushall()
    env = farm_env({**WORKER_ENV, "FARM_PREFIX": prefix})
    settings = Settings.from_env(env, broker_url=redis.url(0), redis_url=redis.url(1))
    f = Fleet(redis, settings, directory, env)
    try:
        for device, extra in workers:
            worker = start_worker(device, f.broker, f.results_url, directory, env, kernels=KERNELS, extra=extra)
            f.workers.append(worker)
            wait_worker_ready(worker, f.client(), prefix)
        yield f
    finally:
        for worker in f.workers:
            worker.stop()


def application(cpus: list[int], env: dict[str, str], tune: dict | None = None) -> dict:
    """Run tests/regime_app.py on ``cpus``; its JSON answer."""
    done = subprocess.run([sys.executable, str(TESTS / "regime_app.py"), json.dumps({"cpus": cpus, "tune": tune})],
                          capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    answer: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def published(f: Fleet) -> dict[str, str]:
    """digest -> fingerprint text, as the workers announced them."""
    texts: dict[str, str] = f.client().hgetall(f.settings.fingerprints_key)
    return texts


@pytest.fixture(scope="module")
def pinned(redis_srv, tmp_path_factory):
    """cpu:0 and cpu:1, each owning its one core (the default --cores)."""
    with regime_fleet(redis_srv, tmp_path_factory.mktemp("regime"), (("cpu:0", ()), ("cpu:1", ()))) as f:
        yield f


def test_pinned_workers_announce_one_core_and_one_thread_per_pool_and_status_shows_it(pinned):
    workers = {w.device: w for w in presence.live_workers(pinned.client(), pinned.settings)}
    assert {d: w.cores for d, w in workers.items()} == {"cpu:0": "0", "cpu:1": "1"}
    assert {(w.blas_threads, w.openmp_threads) for w in workers.values()} == {(1, 1)}
    status = collect(pinned.client(), pinned.settings)
    assert {w["device"]: w["regime"] for w in status["workers"]} == {
        "cpu:0": "cores 0 (1); blas 1; openmp 1", "cpu:1": "cores 1 (1); blas 1; openmp 1"}
    table = subprocess.run([sys.executable, "-m", "farm_cli", "status", "--redis", pinned.results_url],
                           capture_output=True, text=True, env={**pinned.env, "COLUMNS": "250"}, timeout=120)
    assert table.returncode == 0, table.stderr
    assert "regime" in table.stdout and "cores 1 (1); blas 1; openmp 1" in table.stdout


def test_the_workers_fingerprint_is_the_one_an_application_in_the_same_regime_computes(pinned):
    (fingerprint,) = published(pinned).values()  # both workers: one regime, one fingerprint
    assert "cpus=1; blas=1" in fingerprint and "openmp=1" in fingerprint
    for cpu in (0, 1):
        assert application([cpu], pinned.env)["fingerprint"] == fingerprint
    unpinned = application([0, 1], pinned.env)
    assert unpinned["fingerprint"] != fingerprint
    assert unpinned["regime"].startswith("cpus=2; blas=2")


def test_a_blas_bound_decision_is_reproduced_and_served_in_its_regime_only(pinned, tmp_path):
    catalog = write_catalog(tmp_path / "blas.toml", BLAS)
    summary = tune(load_catalog(catalog, KERNELS), pinned.coordinator(), pinned.settings, RunOptions(force=True))
    (agg,) = summary.aggregates
    record = agg.record
    assert record is not None and record.name == "blas_matmul" and record.verified
    assert record.meta["confirmation"] == "confirmed"
    assert record.ratio < 1.0

    # In-process tuning in the same regime (one core, one BLAS thread), with no fleet: the same winner, under
    # the same cache key (so the same fingerprint).
    alone = application([0], pinned.env, {"catalog": str(catalog), "spec": SPEC})
    assert alone["source"] == "TUNED" and alone["name"] == record.name and alone["verified"]
    assert alone["cache_key"] == record.cache_key
    assert alone["ratio"] < 1.0

    # With the fleet: the application in the workers' regime is served their decision ...
    served = application([1], pinned.env, {"catalog": str(catalog), "spec": SPEC, "redis": pinned.results_url})
    assert served["source"] == "FLEET_CACHE" and served["name"] == record.name
    # ... and one in another regime is not: it tunes for itself, under another key.
    other = application([0, 1], pinned.env, {"catalog": str(catalog), "spec": SPEC, "redis": pinned.results_url})
    # (Its winner is its own: two BLAS threads on two busy cores can make even this choice go the other way.)
    assert other["source"] == "TUNED" and other["cache_key"] != record.cache_key


def test_a_worker_declared_with_two_cores_serves_applications_on_two_cores(redis_srv, tmp_path):
    with regime_fleet(redis_srv, tmp_path, (("cpu:0", ("--cores", "2")),)) as f:
        (info,) = presence.live_workers(f.client(), f.settings)
        assert (info.cores, info.blas_threads, info.openmp_threads) == ("0-1", 2, 2)
        (fingerprint,) = published(f).values()
        assert application([0, 1], f.env)["fingerprint"] == fingerprint
        assert application([0], f.env)["fingerprint"] != fingerprint


def test_a_worker_refuses_cores_it_cannot_have(tmp_path):
    cpu = max(os.sched_getaffinity(0)) + 1
    done = subprocess.run([sys.executable, "-m", "farm_cli", "worker", "--device", "cpu:0", "--cores", f"0,{cpu}",
                           "--broker", "redis://127.0.0.1:1/0", "--redis", "redis://127.0.0.1:1/1"],
                          capture_output=True, text=True, env=farm_env(), timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert "--cores" in done.stderr and str(cpu) in done.stderr
