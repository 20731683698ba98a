"""Run claims (farm_fleet.results): a group runs once even when two deliveries of it are in flight. Against a
private redis-server, with workers announced the way the fleet announces them; the real-worker cases are in
test_farm_singleflight.py."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time

import pytest

from farm_fleet import presence
from farm_fleet.protocol import STATUS_OK, GroupKey, GroupResult
from farm_fleet.results import Begun, RedisResults, Runner
from farm_fleet.settings import Settings

pytestmark = pytest.mark.servers

KEY = GroupKey("round", "p1", "g0")
SETTINGS = Settings(prefix="t", heartbeat_seconds=5.0)


def gone_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def announce(client, worker: str, incarnation: str, updated: float | None = None) -> None:
    info = presence.WorkerInfo(worker, "host", "cpu:0", "cpu", "fp", "model", "v", presence.BUSY, 1,
                               time.time() if updated is None else updated, f"farm.worker.{worker}",
                               incarnation=incarnation)
    presence.announce(client, SETTINGS, info)


def result(group: str = "g0") -> GroupResult:
    return GroupResult("round", "p1", group, STATUS_OK, provenance={"worker": "other"})


class Watched(RedisResults):
    """Counts the liveness checks, so a test knows a delivery is waiting before it lets the run finish."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.looked = threading.Event()

    def runs(self, holder: Runner, me: Runner, claim: str) -> bool:
        alive = super().runs(holder, me, claim)
        self.looked.set()
        return alive


@pytest.fixture
def results(redis_db):
    return Watched(redis_db, SETTINGS)


def claim_of(redis_db) -> Runner | None:
    raw = redis_db.get(SETTINGS.running_key(KEY))
    return None if raw is None else Runner.decode(raw)


def begin_in_thread(results, runner: Runner) -> tuple[threading.Thread, dict]:
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(begun=results.begin(KEY, runner, 60.0)), daemon=True)
    thread.start()
    return thread, out


def test_the_first_delivery_takes_the_claim_for_the_tasks_time_and_counts_its_attempt(results, redis_db):
    me = Runner.here("w1")
    assert results.begin(KEY, me, 5.0) == Begun(attempt=1)
    assert claim_of(redis_db) == me and me.space
    assert 0 < redis_db.pttl(SETTINGS.running_key(KEY)) <= 5000  # ends with the task's hard limit at the latest
    assert redis_db.get(SETTINGS.claims_key("w1")) == SETTINGS.running_key(KEY)


def test_a_stored_result_ends_the_claim_and_answers_every_later_delivery(results, redis_db):
    me = Runner.here("w1")
    results.begin(KEY, me, 60.0)
    results.put_if_absent(result())
    assert claim_of(redis_db) is None
    assert results.begin(KEY, Runner.here("w2"), 60.0) == Begun(result=result())
    assert redis_db.get(SETTINGS.attempts_key(KEY)) == "1"


def test_a_delivery_that_finds_a_live_runner_waits_and_answers_with_its_result(results, redis_db):
    holder = Runner("w0", "inc0", 1, "another machine")
    announce(redis_db, "w0", "inc0")
    results.begin(KEY, holder, 60.0)
    thread, out = begin_in_thread(results, Runner.here("w1"))
    assert results.looked.wait(30), "the second delivery never looked at the runner"
    assert thread.is_alive() and claim_of(redis_db) == holder
    results.put_if_absent(result())
    thread.join(30)
    assert out["begun"] == Begun(result=result())
    assert redis_db.get(SETTINGS.attempts_key(KEY)) == "1"  # ran once


def test_a_waiting_delivery_runs_the_group_once_its_runner_releases_it(results, redis_db):
    holder = Runner("w0", "inc0", 1, "another machine")
    announce(redis_db, "w0", "inc0")
    results.begin(KEY, holder, 60.0)
    me = Runner.here("w1")
    thread, out = begin_in_thread(results, me)
    assert results.looked.wait(30)
    results.release(KEY, me)  # only the claim's own runner releases it
    assert claim_of(redis_db) == holder
    results.release(KEY, holder)  # e.g. its device was quarantined mid-group
    thread.join(30)
    assert out["begun"] == Begun(attempt=2) and claim_of(redis_db) == me


@pytest.mark.parametrize("holder, beat_age", [
    (dataclasses.replace(Runner.here("w0"), pid=gone_pid()), 0.0),
    (Runner("w0", "inc0", 1, "another machine"), 100.0),
    (Runner("w0", "inc-old", 1, "another machine"), 0.0),
    (Runner("w9", "inc9", 1, "another machine"), 0.0),
], ids=["a process of this machine that exited", "a worker whose heartbeat stopped",
        "a worker restarted under the same id", "a worker that is not announced"])
def test_a_claim_whose_runner_is_gone_is_taken_over_at_once(results, redis_db, holder, beat_age):
    announce(redis_db, "w0", "inc0", updated=time.time() - beat_age)
    redis_db.set(SETTINGS.running_key(KEY), holder.encode())
    redis_db.set(SETTINGS.claims_key(holder.worker), SETTINGS.running_key(KEY))
    redis_db.set(SETTINGS.attempts_key(KEY), 1)
    me = Runner.here("w1")
    assert results.begin(KEY, me, 60.0) == Begun(attempt=2)
    assert claim_of(redis_db) == me


def test_a_claim_whose_worker_has_moved_on_to_another_group_is_taken_over_at_once(results, redis_db):
    holder = Runner("w0", "inc0", 1, "another machine")
    announce(redis_db, "w0", "inc0")
    results.begin(KEY, holder, 60.0)  # its run ended in an outage: the release was lost
    results.begin(GroupKey("round", "p2", "g0"), holder, 60.0)  # and it runs one group at a time
    assert results.begin(KEY, Runner.here("w1"), 60.0) == Begun(attempt=2)


def test_an_unreadable_claim_is_taken_over(results, redis_db):
    redis_db.set(SETTINGS.running_key(KEY), "{not json")
    assert results.begin(KEY, Runner.here("w1"), 60.0) == Begun(attempt=1)


def test_a_new_pool_process_releases_the_claim_its_killed_predecessor_held(results, redis_db):
    me = Runner.here("w1")
    dead = dataclasses.replace(me, pid=gone_pid())
    results.begin(KEY, dead, 60.0)
    other = GroupKey("round", "p2", "g0")
    results.begin(other, Runner("w2", me.incarnation, gone_pid(), me.space), 60.0)  # another worker's claim
    results.release_orphan(me)
    assert claim_of(redis_db) is None
    assert redis_db.exists(SETTINGS.running_key(other))  # not this worker's to release


def test_a_new_pool_process_keeps_a_claim_whose_process_still_runs(results, redis_db):
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as sibling:
        holder = dataclasses.replace(Runner.here("w1"), pid=sibling.pid)
        results.begin(KEY, holder, 60.0)
        results.release_orphan(Runner.here("w1"))
        assert claim_of(redis_db) == holder
        sibling.stdin.close()


def test_a_failed_tasks_groups_are_recorded_failed_unless_another_delivery_runs_them(results, redis_db):
    announce(redis_db, "w0", "inc0")
    holder = Runner("w0", "inc0", 1, "another machine")
    results.begin(KEY, holder, 60.0)
    me = Runner.here("w1")
    assert results.running_elsewhere(KEY, me) == holder
    assert results.running_elsewhere(KEY, Runner("w0", "inc0", 2, "another machine")) is None  # its own worker
    results.put_if_absent(result())
    assert results.running_elsewhere(KEY, me) is None
