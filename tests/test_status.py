"""`farm status` against a real redis-server: worker states, queue depths, decisions and runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from servers import farm_env

from farm.stores.base import DecisionRecord
from farm.stores.redis import RedisDecisions
from farm_coordinator.runlog import RedisRunLog
from farm_coordinator.status import collect
from farm_fleet import presence
from farm_fleet.settings import Settings

FP = "fingerprint-text-of-a-gpu-model"


def worker(worker_id: str, state: str, updated: float) -> presence.WorkerInfo:
    from farm.environment import fingerprint_digest

    return presence.WorkerInfo(worker_id, "host", "cuda:0", "cuda", fingerprint_digest(FP), "NVIDIA H200", "0.1.0",
                               state, 1, updated, f"farm.worker.{worker_id}")


def test_status_reports_states_queues_decisions_and_runs(redis_srv, redis_db):
    settings = Settings(prefix="st")
    now = time.time()
    for info in (worker("a", presence.HEALTHY, now), worker("b", presence.QUARANTINED, now),
                 worker("c", presence.BUSY, now - 60)):
        presence.announce(redis_db, settings, info)
    from farm.environment import fingerprint_digest
    from farm.identity import CacheKey, Candidate
    from farm.policy import AccuracyKey, StackPolicy

    digest = fingerprint_digest(FP)
    key = CacheKey("operator", "op", FP, "w", "ctx", 0, (Candidate("ref"), Candidate("a")),
                   AccuracyKey.of(StackPolicy())).encode()
    RedisDecisions(client=redis_db, settings=settings).publish(DecisionRecord(key, 1, 0, "x", True, 0.5, now), FP, "p")
    broker = redis_srv.client(0)
    broker.rpush(settings.fingerprint_queue(digest), "m1", "m2")
    log = RedisRunLog(redis_db, settings)
    log.start("run-1", "catalog.toml", 10)
    log.update("run-1", 4, 1)

    status = collect(redis_db, settings, broker)
    states = {w["worker_id"]: w["state"] for w in status["workers"]}
    assert states == {"a": "healthy", "b": "quarantined", "c": "stale"}
    (fp,) = status["fingerprints"]
    assert fp["digest"] == digest and fp["models"] == ["NVIDIA H200"]
    assert fp["workers"] == {"healthy": 1, "quarantined": 1, "stale": 1}
    assert (fp["queued"], fp["decisions"]) == (2, 1)
    (run,) = status["runs"]
    assert (run["run"], run["state"], run["done"], run["groups"]) == ("run-1", "running", "4", "10")


def test_the_status_command_prints_json_for_scripts(redis_srv, redis_db):
    presence.announce(redis_db, Settings(prefix="st"), worker("a", presence.HEALTHY, time.time()))
    done = subprocess.run([sys.executable, "-m", "farm_cli", "status", "--redis", redis_srv.url(1), "--json"],
                          capture_output=True, text=True, env=farm_env({"FARM_PREFIX": "st"}), timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [w["worker_id"] for w in data["workers"]] == ["a"]


def test_the_status_command_says_when_redis_is_unreachable():
    from servers import free_port

    done = subprocess.run([sys.executable, "-m", "farm_cli", "status", "--redis", f"redis://127.0.0.1:{free_port()}/0"],
                          capture_output=True, text=True, env=farm_env(), timeout=60)
    assert done.returncode == 2
    assert "cannot reach Redis" in done.stderr


def test_status_tables_print_names_with_brackets_as_written(redis_srv, redis_db):
    from rich.console import Console

    from farm_coordinator.status import render

    settings = Settings(prefix="stb")
    presence.announce(redis_db, settings, worker("w[gpu=0]", presence.HEALTHY, time.time()))
    log = RedisRunLog(redis_db, settings)
    log.start("run[bold]1", "catalogs/[red]site[/red].toml", 10)
    console = Console(width=300, record=True)
    console.print(render(collect(redis_db, settings, None)))
    text = console.export_text()
    assert "w[gpu=0]" in text and "run[bold]1" in text and "catalogs/[red]site[/red].toml" in text, text
