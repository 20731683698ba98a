"""Recovery with real processes: a worker SIGKILLed mid-run loses no decision and duplicates none."""

from __future__ import annotations

import pytest
from farm_helpers import fleet, write_catalog
from servers import wait_for

from farm.stores.redis import RedisDecisions
from farm_coordinator.catalog import load_catalog
from farm_coordinator.run import RunOptions, tune
from farm_fleet import presence
from farm_fleet.protocol import GroupKey

pytestmark = pytest.mark.servers

# Large enough that every group keeps a worker busy for a while (the reference loops in Python).
SLOW = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 150000, dtype = "float64" }, { n = 150001, dtype = "float64" }, { n = 150002, dtype = "float64" }]
"""


def test_a_worker_killed_mid_run_loses_no_decision_and_duplicates_none(redis_srv, tmp_path):
    with fleet(redis_srv, tmp_path / "fleet", ("cpu:0", "cpu:1")) as f:
        victim = f.workers[0]
        catalog = load_catalog(write_catalog(tmp_path / "c.toml", SLOW), ("farm_testops",))
        client = f.client()

        import threading

        outcome: dict[str, object] = {}

        def run() -> None:
            try:
                outcome["summary"] = tune(catalog, f.coordinator(), f.settings, RunOptions(timeout=150))
            except BaseException as e:  # surfaced below
                outcome["error"] = e

        coordinator = threading.Thread(target=run)
        coordinator.start()

        def victim_busy() -> bool:
            return any(w.device == "cpu:0" and w.state == presence.BUSY
                       for w in presence.live_workers(client, f.settings))

        wait_for(victim_busy, 60, "cpu:0 to start a trial")
        victim.kill()
        coordinator.join(180)
        assert not coordinator.is_alive()
        assert "error" not in outcome, outcome.get("error")
        summary = outcome["summary"]

        assert summary.published == 3
        assert all(a.error is None for a in summary.aggregates)
        decisions = RedisDecisions(client=client, settings=f.settings)
        (digest,) = decisions.fingerprints()
        records = list(decisions.records(digest))
        assert len(records) == 3
        assert {r.meta["spec"]["n"] for r in records} == {150000, 150001, 150002}
        assert len(client.xrange(f.settings.events_key)) == 3
        # The victim died holding a task: a group (redelivered and run again by the survivor) or a confirmation
        # (given up on, the decision published unconfirmed).
        # A group whose turn came after its problem's budget was spent (a slow machine) was never sent: the
        # coordinator recorded it not tried, with no attempt.
        attempts = [r.provenance["attempt"] for a in summary.aggregates for r in a.results.values()
                    if r.provenance.get("attempt") is not None]
        abandoned = [a for a in summary.aggregates if "went away" in str(a.record.meta.get("confirmation"))]
        assert max(attempts, default=0) >= 2 or abandoned


def test_a_device_failure_quarantines_the_worker_and_another_worker_of_the_fingerprint_runs_the_task(redis_srv, tmp_path):
    with fleet(redis_srv, tmp_path / "fleet", ("cpu:0",)) as f:
        catalog = load_catalog(write_catalog(tmp_path / "c.toml", """
[[problems]]
operation = "farmtest_device"
workloads = [{ n = 400, dtype = "float64" }]
"""), ("farm_testops",))
        client = f.client()
        import threading

        outcome: dict[str, object] = {}
        coordinator = threading.Thread(
            target=lambda: outcome.update(summary=tune(catalog, f.coordinator(), f.settings, RunOptions(timeout=150))))
        coordinator.start()

        def state_of_cpu0() -> str | None:
            for w in presence.live_workers(client, f.settings):
                if w.device == "cpu:0":
                    return w.state
            return None

        wait_for(lambda: state_of_cpu0() == presence.QUARANTINED, 60, "cpu:0 to quarantine itself")
        wait_for(lambda: "stopped consuming" in f.workers[0].output(), 30, "cpu:0 to stop consuming")
        f.start("cpu:1")
        coordinator.join(180)
        assert not coordinator.is_alive()
        (agg,) = outcome["summary"].aggregates
        assert agg.record is not None
        assert agg.record.name == "loses_the_device_on_cpu0"
        (result,) = agg.results.values()
        assert result.provenance["device"] == "cpu:1"
        assert state_of_cpu0() == presence.QUARANTINED  # still announced, still unhealthy
        from farm_coordinator.status import collect

        states = {w["device"]: w["state"] for w in collect(client, f.settings)["workers"]}
        assert states["cpu:0"] == "quarantined"
        assert states["cpu:1"] in ("healthy", "busy")  # busy until its postrun hook, right after the result


ONE = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 2000, dtype = "float64" }]
"""


def test_a_rerun_reuses_only_successful_group_results_and_runs_failed_groups_again(redis_srv, tmp_path):
    import json

    from farm_fleet.protocol import GroupResult

    with fleet(redis_srv, tmp_path / "fleet", ("cpu:0",)) as f:
        catalog = load_catalog(write_catalog(tmp_path / "c.toml", ONE), ("farm_testops",))
        client = f.client()
        first = tune(catalog, f.coordinator(), f.settings)
        assert (first.ran, first.reused, first.published) == (2, 0, 1)
        (agg,) = first.aggregates
        pid, digest = agg.problem.problem_id, agg.problem.target.digest
        round_ = client.get(f.settings.key("round", pid))
        # The decision is gone (say, deleted by an operator) and group g1 had failed (say, a broken build).
        client.hdel(f.settings.problems_key(digest), pid)
        g1 = GroupResult.from_dict(json.loads(client.get(f.settings.result_key(GroupKey(round_, pid, "g1")))))
        failed = GroupResult(g1.run, g1.problem_id, g1.group, "failed", error="the build was broken")
        client.set(f.settings.result_key(GroupKey(round_, pid, "g1")), json.dumps(failed.to_dict()))

        again = tune(catalog, f.coordinator(), f.settings)
        assert (again.ran, again.reused, again.published) == (1, 1, 1)
        (agg,) = again.aggregates
        assert agg.results["g1"].status == "ok"
        assert int(client.get(f.settings.attempts_key(GroupKey(round_, pid, "g1")))) == 1  # the failure was forgotten


def test_a_coordinator_waiting_for_another_ones_lease_sleeps_instead_of_spinning(redis_srv, tmp_path):
    import threading
    import time

    from farm.stores.base import DecisionRecord
    from farm_coordinator.plan import expand

    with fleet(redis_srv, tmp_path / "fleet", ("cpu:0",)) as f:
        catalog = load_catalog(write_catalog(tmp_path / "c.toml", ONE), ("farm_testops",))
        client = f.client()
        parts = f.coordinator()
        (problem,) = expand(catalog, parts.fleet.targets(), "other")
        client.set(f.settings.lease_key(problem.problem_id), "other#1", px=120_000)  # another live coordinator
        dispatcher = parts.dispatcher
        loops = [0]
        real = dispatcher.in_flight

        def counted() -> int:
            loops[0] += 1
            return real()

        dispatcher.in_flight = counted
        outcome: dict[str, object] = {}

        def run() -> None:
            started = time.thread_time()
            outcome["summary"] = tune(catalog, parts, f.settings)
            outcome["cpu"] = time.thread_time() - started

        coordinator = threading.Thread(target=run)
        coordinator.start()
        wait_for(lambda: loops[0] >= 3, 30, "the coordinator to wait a few rounds")
        # The other coordinator publishes and lets go of its lease.
        RedisDecisions(client=client, settings=f.settings).publish(
            DecisionRecord("k", 0, 0, "slow_reference", True, 1.0, time.time(), {}), problem.target.fingerprint,
            problem.problem_id)
        client.delete(f.settings.lease_key(problem.problem_id))
        coordinator.join(60)
        assert not coordinator.is_alive()
        summary = outcome["summary"]
        assert [p.problem_id for p in summary.already_decided] == [problem.problem_id]
        assert summary.ran == 0
        # A loop that spins would have run thousands of times; a waiting one wakes once per upkeep.
        assert loops[0] < 100, loops[0]


def test_ctrl_c_revokes_the_runs_tasks_releases_its_leases_exits_130_and_a_rerun_resumes(redis_srv, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    with fleet(redis_srv, tmp_path / "fleet", ("cpu:0",)) as f:
        catalog = write_catalog(tmp_path / "c.toml", SLOW)
        client = f.client()

        def tune_process() -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, "-m", "farm_cli", "tune", str(catalog), "--broker", f.broker, "--redis",
                 f.results_url, "--kernels", "farm_testops", "--json"],
                env=f.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

        first = tune_process()
        wait_for(lambda: any(True for _ in client.scan_iter(f"{f.settings.prefix}:result:*")), 120,
                 "a first group result")
        os.killpg(first.pid, signal.SIGINT)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 130, err
        assert "interrupted" in err and "run the same command again to resume" in err
        assert "Traceback" not in err
        assert list(client.scan_iter(f"{f.settings.prefix}:lease:*")) == []
        (run,) = [client.hgetall(k) for k in client.scan_iter(f"{f.settings.prefix}:run:*")]
        assert run["state"] == "interrupted"

        second = tune_process()
        out, err = second.communicate(timeout=240)
        assert second.returncode == 0, err
        store = RedisDecisions(client=client, settings=f.settings)
        assert sum(1 for d in store.fingerprints() for _ in store.records(d)) == 3
        # Revoked tasks never started; the group running at Ctrl-C finished once and was reused.
        attempts = [int(client.get(k)) for k in client.scan_iter(f"{f.settings.prefix}:attempts:*")
                    if not k.endswith(":confirm")]
        assert len(attempts) == 6 and set(attempts) == {1}, attempts
