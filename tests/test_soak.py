"""The chaos soak's short version (bench/soak.py is the long one, tests/chaos.py the fleet and the injector): a few
hundred trivial problems on two real workers for about a minute, while a seeded injector kills a worker, restarts
the decisions Redis and the broker (Redis, or a private RabbitMQ node) on their data and freezes the coordinator, each kind at least once. Every problem
is decided and each decision published exactly once; a problem not published would be listed with its reason."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.servers

PROBLEMS = 400


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_minute_of_seeded_chaos_loses_and_duplicates_no_decision(tmp_path, broker):
    from chaos import KINDS, run_soak
    from rabbitmq import require_rabbitmq

    if broker == "rabbitmq":  # the soak starts (and kills) a node of its own
        require_rabbitmq("the soak cannot start its own node")
    lines: list[str] = []
    result = run_soak(tmp_path, PROBLEMS, pace_ms=150, seed=28, every=3.0, broker=broker, freeze=4.0, down=1.5,
                      timeout=600, log=lines.append)
    assert result["injector_error"] is None, (result["injector_error"], lines)
    assert {f["kind"] for f in result["faults"]} == set(KINDS), lines  # the seed's deck: every kind within 4 faults
    assert result["finished"] and result["coordinator_exit"] == 0, result["lost_reasons"]
    assert result["lost"] == 0 and result["lost_reasons"] == {}, result["lost_reasons"]
    assert result["decided"] == PROBLEMS and result["publications"] == PROBLEMS
    assert result["duplicated"] == 0 and result["unpublished_fields"] == []
