"""Recovery with real processes: a worker SIGKILLed mid-run loses no decision and duplicates none."""

from __future__ import annotations

import pytest
from farm_helpers import fleet, write_catalog
from servers import wait_for

from farm.stores.redis import RedisDecisions
from farm_coordinator.catalog import load_catalog
from farm_coordinator.run import tune
from farm_fleet import presence

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
                outcome["summary"] = tune(catalog, settings=f.settings, timeout=150, **f.coordinator())
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
        attempts = [r.provenance.get("attempt") for a in summary.aggregates for r in a.problem.results.values()]
        abandoned = [a for a in summary.aggregates if "went away" in str(a.record.meta.get("confirmation"))]
        assert max(attempts) >= 2 or abandoned


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
            target=lambda: outcome.update(summary=tune(catalog, settings=f.settings, timeout=150, **f.coordinator())))
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
        (result,) = agg.problem.results.values()
        assert result.provenance["device"] == "cpu:1"
        assert state_of_cpu0() == presence.QUARANTINED  # still announced, still unhealthy
        from farm_coordinator.status import collect

        states = {w["device"]: w["state"] for w in collect(client, f.settings)["workers"]}
        assert states["cpu:0"] == "quarantined"
        assert states["cpu:1"] in ("healthy", "busy")  # busy until its postrun hook, right after the result
