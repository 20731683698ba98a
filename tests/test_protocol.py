"""The wire protocol (version 2): tasks name candidates and carry a budget, results carry typed outcomes; both
round-trip through JSON, and a message of another version or shape is refused naming the field."""

from __future__ import annotations

import json

import pytest

from farm.trials import Outcome, TrialVerdict
from farm_fleet.protocol import (
    PROTOCOL_VERSION,
    STATUS_NOT_TRIED,
    STATUS_OK,
    GroupResult,
    GroupTask,
    ProtocolError,
    set_difference,
)

TASK = GroupTask("run-1", "p1", "g1", "softmax", "cpu", {"rows": 4, "cols": 8, "dtype": "float32"},
                 (("online", "1"), ("blocked", "2")), {"budget": 3.0}, "abcd" * 4, ("mykernels",), None, 1.25)
RESULT = GroupResult(
    "run-1", "p1", "g1", STATUS_OK, "17:farm-stack-key-v1...", 0, ("ref", "online", "blocked"), (1e-3, 2e-3),
    (Outcome(1, "online", ((1e-3, 5e-4),), True, revision="1", max_abs_error=0.0, max_rel_error=1e-7),
     Outcome(2, "blocked", (), False, TrialVerdict.REJECTED, "wrong output: 3 of 32 differ", revision="2")),
    None, {"worker": "w0", "attempt": 1}, 0.5, 0.375, True,
)


def wire(message: dict) -> dict:
    return json.loads(json.dumps(message))


def test_a_task_round_trips_through_json_with_names_revisions_and_budget() -> None:
    data = wire(TASK.to_dict())
    assert data["protocol"] == PROTOCOL_VERSION == 2
    assert data["candidates"] == [{"name": "online", "revision": "1"}, {"name": "blocked", "revision": "2"}]
    assert data["budget"] == 1.25 and "indices" not in data
    assert GroupTask.from_dict(data) == TASK
    first = GroupTask(**{**TASK.__dict__, "budget": None})
    assert GroupTask.from_dict(wire(first.to_dict())) == first


def test_a_result_round_trips_through_json_with_typed_outcomes() -> None:
    data = wire(RESULT.to_dict())
    assert [(o["name"], o["revision"], o["verdict"], o["note"]) for o in data["outcomes"]] == [
        ("online", "1", "passed", ""), ("blocked", "2", "rejected", "wrong output: 3 of 32 differ")]
    assert (data["search_seconds"], data["budget_exhausted"]) == (0.375, True)
    assert GroupResult.from_dict(data) == RESULT


def test_a_group_not_sent_for_lack_of_budget_has_its_own_status() -> None:
    result = GroupResult.not_tried(TASK, "budget of 3s exhausted")
    assert (result.status, result.error, result.budget_exhausted) == (STATUS_NOT_TRIED, "budget of 3s exhausted", True)
    assert GroupResult.from_dict(wire(result.to_dict())) == result


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(protocol=1), "protocol version 1"),
        (lambda d: d.pop("candidates"), "'candidates' is missing"),
        (lambda d: d.update(candidates=[3]), "'candidates' holds 3"),
        (lambda d: d.update(candidates=[{"name": "a"}]), "'revision' is missing"),
        (lambda d: d.update(budget="soon"), "'budget' = 'soon'"),
    ],
)
def test_a_malformed_task_is_refused_naming_the_field(change, message: str) -> None:
    data = TASK.to_dict()
    change(data)
    with pytest.raises(ProtocolError, match=message):
        GroupTask.from_dict(data)


def test_a_result_with_an_unknown_verdict_is_refused() -> None:
    data = RESULT.to_dict()
    data["outcomes"][0]["verdict"] = "maybe"
    with pytest.raises(ProtocolError, match="malformed outcome"):
        GroupResult.from_dict(data)


def test_a_task_carries_the_coordinators_set_part_by_part() -> None:
    task = GroupTask(**{**TASK.__dict__, "expects": {"reference": "ref", "values tiled": "tiled[block=16|32]"}})
    assert GroupTask.from_dict(wire(task.to_dict())) == task
    assert "expects" not in TASK.to_dict() and GroupTask.from_dict(wire(TASK.to_dict())).expects is None
    data = task.to_dict()
    data["expects"] = {"reference": 3}
    with pytest.raises(ProtocolError, match="expects must map part names to strings"):
        GroupTask.from_dict(data)


def test_a_set_difference_names_the_operation_and_every_part_that_differs() -> None:
    here = {"reference": "ref", "candidate online": "aa", "space tiled": "cc",
            "values tiled": "tiled[block=16|32] where block <= 64 #ab12"}
    there = {**here, "candidate online": "ab", "candidate fused": "dd",
             "values tiled": "tiled[block=16|32|64] where block <= 64 #ab12"}
    assert set_difference("softmax", "w0@host", here, dict(here)) is None
    said = set_difference("softmax", "w0@host", here, there)
    assert said == (
        "set differs: softmax on worker w0@host differs from the coordinator's (candidate 'fused' only on the "
        "coordinator; candidate 'online' code or options differ; space 'tiled' values tiled[block=16|32] here, "
        "tiled[block=16|32|64] on the coordinator): restart the worker with the coordinator's version of the "
        "module (--kernels)")
