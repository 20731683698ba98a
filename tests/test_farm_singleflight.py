"""Resume and single flight with real processes: a coordinator SIGKILLed mid-run and started again finishes
only what is missing; two coordinators on one catalog run every group once; two deliveries of one group in flight
at once run it once (run claims), and a runner killed mid-group is taken over by the delivery waiting on it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from farm_helpers import fleet, write_catalog
from servers import wait_for

from farm.policy import StackPolicy
from farm.stores.redis import RedisDecisions
from farm_fleet import presence
from farm_fleet.protocol import GROUP_TASK, STATUS_OK, GroupKey, GroupTask
from farm_fleet.results import RedisResults, Runner

pytestmark = pytest.mark.servers

SLOW = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 120000, dtype = "float64" }, { n = 120001, dtype = "float64" },
             { n = 120002, dtype = "float64" }, { n = 120003, dtype = "float64" }]
"""
PROBLEMS, GROUPS = 4, 8  # 4 problems x 2 priority groups. A problem's groups share its 2 s budget, in turn: on a
# loaded machine the first group's slow reference may spend it, and the second is then recorded not tried without
# being sent (nothing to count). What must hold is that no group runs twice.


def coordinator(f, catalog) -> subprocess.Popen[str]:
    env = dict(f.env, FARM_LEASE_TTL="2")
    return subprocess.Popen(
        [sys.executable, "-m", "farm_cli", "tune", str(catalog), "--broker", f.broker, "--redis", f.results_url,
         "--kernels", "farm_testops", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def executions(f) -> dict[str, int]:
    """How many times each group's trials started (the worker counts an attempt before running them)."""
    client = f.client()
    return {k: int(client.get(k)) for k in client.scan_iter(f"{f.settings.prefix}:attempts:*")
            if not k.endswith(":confirm")}


def decisions(f) -> list:
    store = RedisDecisions(client=f.client(), settings=f.settings)
    return [r for digest in store.fingerprints() for r in store.records(digest)]


def test_a_coordinator_killed_mid_run_and_restarted_does_not_repeat_finished_groups(redis_srv, tmp_path):
    with fleet(redis_srv, tmp_path / "fleet", ("cpu:0", "cpu:1")) as f:
        catalog = write_catalog(tmp_path / "c.toml", SLOW)
        first = coordinator(f, catalog)
        client = f.client()
        wait_for(lambda: len(list(client.scan_iter(f"{f.settings.prefix}:result:*"))) >= 2, 120,
                 "two group results from the first coordinator")
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=30)
        before = len(decisions(f))
        assert before < 4, "the first coordinator finished before it was killed; the test proves nothing"

        second = coordinator(f, catalog)
        out, err = second.communicate(timeout=240)
        assert second.returncode == 0, err
        assert len(decisions(f)) == 4
        counts = executions(f)
        assert PROBLEMS <= len(counts) <= GROUPS, counts  # every first group; a second one while the budget lasts
        assert set(counts.values()) == {1}, counts


def test_two_coordinators_on_one_catalog_run_every_group_once(redis_srv, tmp_path):
    with fleet(redis_srv, tmp_path / "fleet", ("cpu:0", "cpu:1")) as f:
        catalog = write_catalog(tmp_path / "c.toml", SLOW)
        a, b = coordinator(f, catalog), coordinator(f, catalog)
        for process in (a, b):
            _, err = process.communicate(timeout=240)
            assert process.returncode == 0, err
        assert len(decisions(f)) == 4
        counts = executions(f)
        assert PROBLEMS <= len(counts) <= GROUPS, counts  # every first group; a second one while the budget lasts
        assert set(counts.values()) == {1}, counts
        assert len(f.client().xrange(f.settings.events_key)) == 4  # each decision published once


# -- run claims: two deliveries of one group in flight at once (a takeover, a resend) run it once -------------

GATED = GroupKey("claims-run", "p1", "g0")


def gated_fleet(f, tmp_path, devices=("cpu:0", "cpu:1")):
    """Workers whose gated candidate runs until ``tmp_path / "gate"`` exists; (workers by device, the gate)."""
    f.env["FARMTEST_GATE"] = str(tmp_path / "gate")
    for device in devices:
        f.start(device)
    return {w.device: w for w in presence.live_workers(f.client(), f.settings)}, tmp_path / "gate"


def deliver(f, worker: presence.WorkerInfo, delivery: str) -> None:
    """Send the gated group to ``worker``'s own queue, with time limits no loaded machine reaches."""
    from celery import Celery

    from farm_fleet.celeryconf import celery_config

    policy = StackPolicy(samples=3, warmups=1, budget=2.0, max_relative_mad=1.0).to_dict()
    task = GroupTask(GATED.run, GATED.problem_id, GATED.group, "farmtest_gate", "cpu", {"n": 1000, "dtype": "float64"},
                     (("waits_for_the_gate", "1"),), policy, worker.fingerprint, ("farm_testops",))
    app = Celery("claims", set_as_current=False)
    app.conf.update(celery_config(f.settings))
    app.send_task(GROUP_TASK, args=[[task.to_dict()]], queue=worker.queue, task_id=delivery, soft_time_limit=150,
                  time_limit=180)
    app.close()


def finished(worker, delivery: str) -> bool:
    return f"[{delivery}] succeeded" in worker.output()


def second_delivery_waiting(f, tmp_path) -> tuple[Path, Runner]:
    """cpu:0 runs the gated group (its gate shut) and cpu:1, given the group too, waits on that run: (the gate,
    cpu:0's runner)."""
    workers, gate = gated_fleet(f, tmp_path)
    client = f.client()
    deliver(f, workers["cpu:0"], "delivery-1")
    wait_for(lambda: client.exists(f.settings.running_key(GATED)), 60, "cpu:0 to claim the group")
    holder = Runner.decode(client.get(f.settings.running_key(GATED)))
    deliver(f, workers["cpu:1"], "delivery-2")
    wait_for(lambda: "waiting for its result" in f.workers[1].output(), 60, "cpu:1 to wait for cpu:0's run")
    return gate, holder


def test_two_deliveries_of_one_group_in_flight_at_once_run_it_once_and_both_answer(redis_srv, tmp_path):
    with fleet(redis_srv, tmp_path / "fleet", ()) as f:
        gate, _ = second_delivery_waiting(f, tmp_path)
        client = f.client()
        gate.touch()
        wait_for(lambda: finished(f.workers[0], "delivery-1") and finished(f.workers[1], "delivery-2"), 60,
                 "both deliveries to finish")
        result = RedisResults(client, f.settings).get(GATED)
        assert result is not None and result.status == STATUS_OK
        assert result.provenance["device"] == "cpu:0" and result.provenance["attempt"] == 1
        assert client.get(f.settings.attempts_key(GATED)) == "1"  # ran once
        assert not client.exists(f.settings.running_key(GATED))


def test_a_delivery_waiting_on_a_runner_killed_mid_group_runs_the_group_itself(redis_srv, tmp_path):
    with fleet(redis_srv, tmp_path / "fleet", ()) as f:
        gate, holder = second_delivery_waiting(f, tmp_path)
        client = f.client()
        os.kill(holder.pid, signal.SIGKILL)  # cpu:0's pool process, mid-group; its worker lives on
        gate.touch()
        # cpu:0's delivery goes back to its queue (rejected on the lost process). Whichever delivery looks first
        # takes the dead runner's claim over; the other waits for it and answers with its result.
        wait_for(lambda: finished(f.workers[0], "delivery-1") and finished(f.workers[1], "delivery-2"), 60,
                 "both deliveries to finish")
        result = RedisResults(client, f.settings).get(GATED)
        assert result is not None and result.status == STATUS_OK
        assert result.provenance["attempt"] == 2 and result.provenance["pid"] != holder.pid
        assert client.get(f.settings.attempts_key(GATED)) == "2"  # the killed run and one more


def test_a_pool_process_killed_mid_group_has_its_claim_released_by_the_next_one(redis_srv, tmp_path):
    with fleet(redis_srv, tmp_path / "fleet", ()) as f:
        workers, gate = gated_fleet(f, tmp_path, ("cpu:0",))
        client = f.client()
        deliver(f, workers["cpu:0"], "delivery-1")
        wait_for(lambda: client.exists(f.settings.running_key(GATED)), 60, "cpu:0 to claim the group")
        holder = Runner.decode(client.get(f.settings.running_key(GATED)))
        os.kill(holder.pid, signal.SIGKILL)
        # The pool's next process releases the claim before it takes any task: a delivery waiting on another
        # machine, where the dead pid means nothing, would run the group now instead of at the hard limit.
        wait_for(lambda: "released the run claim" in f.workers[0].output(), 60, "the next pool process to release it")
        gate.touch()
        wait_for(lambda: finished(f.workers[0], "delivery-1"), 60, "the redelivery to run the group")
        result = RedisResults(client, f.settings).get(GATED)
        assert result is not None and result.status == STATUS_OK and result.provenance["attempt"] == 2


# -- fencing: leases carry tokens that only grow; publication refuses a stale one atomically --------------------

FINGERPRINT = "8:backend16:device-class-text"


def record(created: float = 100.0, verified: bool = True, name: str = "fast"):
    from farm.identity import CacheKey, Candidate
    from farm.policy import AccuracyKey, StackPolicy
    from farm.stores.base import DecisionRecord

    key = CacheKey("operator", "op", FINGERPRINT, "w", "ctx", 0, (Candidate("ref"), Candidate("fast")),
                   AccuracyKey.of(StackPolicy())).encode()
    return DecisionRecord(key, 1, 0, name, verified, 0.5, created, {"run": f"run-{created}"})


@pytest.fixture
def layout(redis_db):
    from farm_coordinator.leases import RedisLeases
    from farm_fleet.settings import Settings

    settings = Settings(prefix="t", lease_ttl=30.0)
    return settings, RedisLeases(redis_db, settings), RedisDecisions(client=redis_db, settings=settings)


def test_each_lease_taken_on_a_problem_carries_a_larger_token(layout, redis_db):
    from farm_coordinator.leases import token_of

    _, leases, _ = layout
    first = leases.acquire(["p1"], "a")["p1"]
    assert leases.acquire(["p1"], "b") == {}  # held
    redis_db.delete("t:lease:p1")  # expired
    second = leases.acquire(["p1"], "b")["p1"]
    assert token_of(second) > token_of(first)
    assert leases.renew({"p1": first}) == {"p1"}  # the old holder's lease is lost, even under the same name
    assert leases.renew({"p1": second}) == set()


def test_a_publication_under_a_stale_lease_is_refused_and_leaves_no_trace(layout, redis_db):
    _, leases, decisions = layout
    stale = leases.acquire(["p1"], "a")["p1"]
    redis_db.delete("t:lease:p1")
    fresh = leases.acquire(["p1"], "b")["p1"]
    ok, reason = decisions.publish(record(200.0), FINGERPRINT, "p1", fence=leases.fence("p1", stale))
    assert not ok and reason.startswith("refused: stale lease")
    assert redis_db.xlen("t:events") == 0 and decisions.get(record().cache_key) is None
    assert decisions.publish(record(100.0), FINGERPRINT, "p1", fence=leases.fence("p1", fresh)) == (True, "new")
    # The publication consumed the lease: a retried call (its reply lost) cannot publish twice.
    again = decisions.publish(record(100.0), FINGERPRINT, "p1", fence=leases.fence("p1", fresh))
    assert again[1].startswith("refused")
    assert redis_db.xlen("t:events") == 1
    assert redis_db.get("t:lease:p1") is None


@pytest.mark.parametrize("stored, says", [
    ("5", "not an object"),
    ("not json", "unreadable JSON"),
    ('{"verified": true, "created": "yesterday"}', "created is not a finite number"),
    ('{"verified": true, "created": 1e300}', "created is in the future"),
    ('{"verified": "yes", "created": 1}', "verified is not a boolean"),
])
def test_a_malformed_stored_record_is_replaced_and_the_event_says_so(layout, redis_db, stored, says):
    from farm.environment import fingerprint_digest
    from farm.stores.redis import field_for

    settings, _, decisions = layout
    r = record(100.0, verified=False)
    redis_db.hset(settings.decisions_key(fingerprint_digest(FINGERPRINT)), field_for(r.cache_key), stored)
    ok, reason = decisions.publish(r, FINGERPRINT, "p1")
    assert ok and reason == f"replaced malformed record ({says})"
    assert decisions.get(r.cache_key) == r
    (_, event), = redis_db.xrange("t:events")
    assert event["reason"] == reason


# -- presence heals; a restarted worker is a new incarnation ----------------------------------------------------

def test_a_heartbeat_rewrites_an_expired_worker_record_whole_and_a_restart_is_a_new_incarnation(redis_db):
    import dataclasses
    import time

    from farm_coordinator.fleet import RedisFleet
    from farm_fleet import presence
    from farm_fleet.settings import Settings

    settings = Settings(prefix="t")
    info = presence.WorkerInfo("w1", "host", "cpu:0", "cpu", "digest", "model", "1", presence.HEALTHY, 1, time.time(),
                               "farm.worker.w1")
    presence.announce(redis_db, settings, info)
    fleet = RedisFleet(redis_db, settings)
    incarnation = redis_db.hget(settings.worker_key("w1"), "incarnation")
    assert incarnation == presence.INCARNATION and fleet.alive("w1", incarnation)
    redis_db.delete(settings.worker_key("w1"))  # expired while frozen
    assert not fleet.alive("w1", incarnation)
    presence.beat(redis_db, settings, "w1")
    healed = presence.WorkerInfo.from_fields(redis_db.hgetall(settings.worker_key("w1")))
    assert (healed.device, healed.fingerprint, healed.state, healed.queue) == ("cpu:0", "digest", "healthy", "farm.worker.w1")
    assert fleet.alive("w1", incarnation)
    presence.announce(redis_db, settings, dataclasses.replace(info, incarnation="restarted"))
    assert fleet.alive("w1", "restarted") and not fleet.alive("w1", incarnation)
