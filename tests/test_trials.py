"""The trial protocol shared by the controller and the farm: reference and candidate trials, and the decision."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from fakes import FAST, FakeRunner

from farm.engine import Validation
from farm.errors import FailureKind, TuneFailure
from farm.policy import StackPolicy
from farm.trials import (
    Outcome,
    TrialVerdict,
    ValidationUnavailable,
    candidate_trials,
    decide,
    reference_noise,
    reference_trials,
)

NAMES = ["ref", "a", "b"]
NO_DEADLINE = math.inf


def test_reference_trials_warm_up_validate_then_time_samples() -> None:
    runner = FakeRunner({0: [5.0, 5.0, 1.0, 2.0, 3.0]})
    times = reference_trials(runner, StackPolicy(warmups=2, samples=3), 0, "ref")
    assert times == [1.0, 2.0, 3.0]
    assert runner.calls == [("measure", 0), ("measure", 0), ("validate", 0, 0)] + [("measure", 0)] * 3


def test_an_unsupported_reference_is_validation_unavailable_only_when_required() -> None:
    with pytest.raises(ValidationUnavailable):
        reference_trials(FakeRunner(verdicts={0: Validation.UNSUPPORTED}), FAST, 0, "ref")
    assert len(reference_trials(FakeRunner(verdicts={0: Validation.UNSUPPORTED}), FAST.replace(require_validation=False), 0, "ref")) == 3


@pytest.mark.parametrize(
    ("failure", "kind"),
    [(TuneFailure.device("lost"), FailureKind.DEVICE), (TuneFailure.rejected("bad"), FailureKind.REJECTED), (KeyError("k"), FailureKind.REJECTED)],
)
def test_a_reference_failure_is_rejected_unless_it_is_a_device_failure(failure: BaseException, kind: FailureKind) -> None:
    with pytest.raises(TuneFailure) as info:
        reference_trials(FakeRunner({0: failure}), FAST, 0, "ref")
    assert info.value.kind is kind


def test_candidate_trials_collect_reference_candidate_pairs() -> None:
    outcome = candidate_trials(FakeRunner({0: 2.0, 1: [9.0, 1.0, 0.5, 1.5]}), FAST, 0, 1, NAMES, NO_DEADLINE)
    assert outcome == Outcome(1, "a", ((2.0, 1.0), (2.0, 0.5), (2.0, 1.5)), True)
    assert (outcome.verdict, outcome.failure) == (TrialVerdict.PASSED, None)


def test_a_device_failure_in_candidate_trials_propagates() -> None:
    with pytest.raises(TuneFailure) as info:
        candidate_trials(FakeRunner({1: TuneFailure.device("lost")}), FAST, 0, 1, NAMES, NO_DEADLINE)
    assert info.value.kind is FailureKind.DEVICE


class CheckingRunner(FakeRunner):
    """A runner that, like RuntimeTrials, keeps its latest output comparison in ``last_check``."""

    def validate(self, reference: int, candidate: int, tolerance: object) -> Validation:
        self.last_check = SimpleNamespace(problem=None, max_abs_error=0.25 * candidate, max_rel_error=0.5 * candidate)
        return super().validate(reference, candidate, tolerance)  # type: ignore[arg-type]


def test_an_outcome_reports_its_own_comparison_errors_not_the_previous_candidates() -> None:
    runner = CheckingRunner({2: RuntimeError("never validated")})
    a = candidate_trials(runner, FAST, 0, 1, NAMES, NO_DEADLINE)
    b = candidate_trials(runner, FAST, 0, 2, NAMES, NO_DEADLINE)
    assert (a.max_abs_error, a.max_rel_error) == (0.25, 0.5)
    assert b.verdict is TrialVerdict.REJECTED and b.note == "RuntimeError: never validated"
    assert b.failure == "rejected: RuntimeError: never validated"
    assert (b.max_abs_error, b.max_rel_error) == (None, None)


def test_an_outcome_round_trips_through_its_dict() -> None:
    outcome = Outcome(2, "b", ((1.0, 0.5), (1.0, 0.25)), True, TrialVerdict.REJECTED, "x", True, 1e-6, 1e-5, "3")
    assert Outcome.from_dict(json.loads(json.dumps(outcome.to_dict()))) == outcome
    assert outcome.to_dict()["verdict"] == "rejected" and outcome.to_dict()["revision"] == "3"
    timed = Outcome(1, "a", ((1.0, 0.5),), False)
    assert timed.verdict is TrialVerdict.UNVERIFIED and Outcome.from_dict(timed.to_dict()) == timed


def test_an_unknown_verdict_is_refused() -> None:
    data = Outcome(1, "a", (), False, TrialVerdict.SKIPPED, "not eligible").to_dict()
    with pytest.raises(ValueError):
        Outcome.from_dict({**data, "verdict": "maybe"})


def test_decide_picks_the_best_acceptable_outcome_in_plan_order() -> None:
    outcomes = [
        Outcome(1, "a", ((1.0, 0.8),) * 3, True),
        Outcome(2, "b", ((1.0, 0.4),) * 3, True),
        Outcome(3, "c", (), False, TrialVerdict.REJECTED, "wrong output"),
    ]
    selection, judged = decide(0, ["ref", "a", "b", "c"], outcomes, StackPolicy())
    assert (selection.index, selection.ratio) == (2, 0.4)
    assert [j.note for j in judged] == [
        "beaten: ratio 0.800, b is faster",
        "selected: ratio 0.400",
        "rejected: wrong output",
    ]


def test_reference_noise_is_the_relative_mad_of_its_times() -> None:
    assert reference_noise([1.0, 1.0, 2.0]) == 0.0
    assert reference_noise([1.0, 2.0, 4.0]) == pytest.approx(0.5)
