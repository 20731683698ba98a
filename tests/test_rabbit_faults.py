"""A RabbitMQ broker node killed with SIGKILL mid-run and restarted on its data: with the farm's quorum queues every
problem is still decided exactly once, within twice the fault-free run's wall time plus one hard time limit, not
counting the broker's own downtime (from the kill until the restarted node accepts connections: RabbitMQ's boot took
5-12 s on a loaded 2-core machine, which no farm can run through). The node is private (tests/rabbitmq.py, the
session's node, a vhost per run), never the machine's shared RabbitMQ."""

from __future__ import annotations

import time

import pytest
from farm_helpers import write_catalog
from faultkit import assert_exactly_once, fault_fleet, wait_busy
from test_faults import CATALOG, PROBLEMS, Coordinator, finished_cleanly

pytestmark = pytest.mark.servers


def run(node, tmp_path, name: str, fault) -> tuple[float, float]:
    """(wall seconds less the broker's downtime, the hard time limit of one group task) of the catalog's run on a
    fresh vhost of ``node`` with ``fault`` injected (it returns the seconds the broker was down, or None)."""
    with node.vhost() as url, fault_fleet(tmp_path / name, ("cpu:0", "cpu:1"), url) as f:
        coordinator = Coordinator(f, write_catalog(tmp_path / f"{name}.toml", CATALOG))
        started = time.monotonic()
        coordinator.start()
        wait_busy(f)
        down = fault(node) or 0.0
        summary = coordinator.join_summary()
        wall = time.monotonic() - started - down
        hard = f.settings.time_limits(coordinator.catalog.policy)[1]
        finished_cleanly(summary)
        assert_exactly_once(f, PROBLEMS)
        types = node.queue_types(url.rsplit("/", 1)[1])
        assert {t for q, t in types.items() if q.startswith("farm.fp.")} == {"quorum"}, types
    return wall, hard


def test_a_rabbitmq_node_killed_and_restarted_on_its_data_loses_and_duplicates_nothing(rabbitmq_srv, tmp_path):
    baseline, _ = run(rabbitmq_srv, tmp_path, "quiet", lambda node: None)

    def kill_and_restart(node) -> float:
        killed = time.monotonic()
        node.kill()
        node.start()  # on the same data: the quorum queues and their messages come back; returns once it serves
        return time.monotonic() - killed

    faulted, hard = run(rabbitmq_srv, tmp_path, "killed", kill_and_restart)
    assert faulted <= 2 * baseline + hard, (faulted, baseline, hard)  # the target for every fault scenario
