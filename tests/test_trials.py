"""The trial protocol shared by the controller and the farm: reference and candidate trials, and the decision."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from fakes import FAST, FakeRunner, install_clock

from farm.engine import Validation
from farm.errors import FailureKind, TuneFailure
from farm.interference import Interference
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
PHASE_LOCKED_FAST = [(5.448, 2.408), (2.004, 5.557), (5.947, 2.406), (2.009, 5.554), (5.947, 2.406), (2.004, 5.561),
                     (5.949, 2.406)]


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
    outcome = candidate_trials(FakeRunner({0: 2.0, 1: [9.0, 1.0, 0.5, 1.5]}), FAST.replace(max_samples=3), 0, 1, NAMES,
                               NO_DEADLINE)
    assert (outcome.pairs, outcome.verified, outcome.failure, outcome.stop) == (
        ((2.0, 1.0), (2.0, 0.5), (2.0, 1.5)), True, None, "max_samples")
    assert outcome.interference is not None and outcome.interference.pairs == 3
    assert outcome.verdict is TrialVerdict.PASSED


def test_pairs_alternate_which_implementation_runs_first() -> None:
    runner = FakeRunner({0: 2.0, 1: 1.0})
    candidate_trials(runner, FAST, 0, 1, NAMES, NO_DEADLINE)
    timed = runner.measured()[1:]  # after the warmup
    assert timed == [0, 1, 1, 0] * 3 + [0, 1]


def test_sampling_stops_at_the_first_look_that_decides() -> None:
    outcome = candidate_trials(FakeRunner({0: 2.0, 1: 1.0}), FAST, 0, 1, NAMES, NO_DEADLINE)
    assert (len(outcome.pairs), outcome.stop) == (7, "decided")  # 3 pairs cannot decide; the next look is at 7


def straddling() -> Callable[[], float]:
    """Candidate times (after one warmup) of 0.94 for two pairs, then 0.96 for two: every interval of the pair or
    block ratios straddles the 1 / 1.05 = 0.952 line."""
    calls = iter(range(10**6))

    def seconds() -> float:
        k = next(calls) - 1
        return 0.94 if (k // 2) % 2 == 0 else 0.96

    return seconds


def test_an_undecided_candidate_takes_pairs_up_to_max_samples() -> None:
    outcome = candidate_trials(FakeRunner({0: 1.0, 1: straddling()}), FAST.replace(max_samples=11), 0, 1, NAMES,
                               NO_DEADLINE)
    assert (len(outcome.pairs), outcome.stop, outcome.failure) == (11, "max_samples", None)
    _, (report,) = decide(0, NAMES, [outcome], FAST)
    assert report.standing == "undecided" and report.note.endswith("11 pairs, stopped: max_samples")


def test_the_budget_ends_extra_sampling_without_rejecting_the_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = install_clock(monkeypatch)
    runner = FakeRunner({0: 1.0, 1: straddling()}, clock=clock)
    outcome = candidate_trials(runner, FAST, 0, 1, NAMES, deadline=clock.monotonic() + 12.0)
    assert outcome.failure is None and outcome.stop == "budget" and 3 <= len(outcome.pairs) < 13


def test_an_outcome_round_trips_through_its_dict_with_its_sampling_record() -> None:
    outcome = Outcome(1, "a", ((1.0, 0.5),), True, stop="decided", interference=Interference(1, 1, 3, 0, 0.01),
                      remeasured=True)
    assert Outcome.from_dict(outcome.to_dict()) == outcome


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


def test_an_outcome_from_an_older_worker_has_no_sampling_record() -> None:
    data = Outcome(2, "b", ((1.0, 0.5),), True).to_dict()
    for key in ("stop", "interference", "remeasured"):
        del data[key]
    assert Outcome.from_dict(data) == Outcome(2, "b", ((1.0, 0.5),), True)


def test_decide_picks_the_best_acceptable_outcome_in_plan_order() -> None:
    outcomes = [
        Outcome(1, "a", ((1.0, 0.8),) * 7, True, stop="decided"),
        Outcome(2, "b", ((1.0, 0.4),) * 7, True, stop="decided"),
        Outcome(3, "c", (), False, TrialVerdict.REJECTED, "wrong output"),
        Outcome(4, "d", ((1.0, 0.3),) * 3, True, stop="budget"),
    ]
    selection, judged = decide(0, ["ref", "a", "b", "c", "d"], outcomes, StackPolicy())
    assert (selection.index, selection.ratio) == (2, 0.4)
    assert [j.note for j in judged] == [
        "beaten: ratio 0.800 in [0.800, 0.800]; 7 pairs, stopped: decided, b is faster",
        "selected: ratio 0.400 in [0.400, 0.400]; 7 pairs, stopped: decided",
        "rejected: wrong output",
        "undecided: 3 pairs are too few for a confident verdict; 3 pairs, stopped: budget",
    ]
    assert [j.standing for j in judged] == ["faster", "faster", None, "undecided"]


def test_an_undecided_candidate_never_wins_however_low_its_ratio() -> None:
    selection, (report,) = decide(0, NAMES, [Outcome(1, "a", tuple(PHASE_LOCKED_FAST), True, stop="max_samples")], StackPolicy())
    assert selection.index == 0 and report.standing == "undecided"


class ProbedRunner(FakeRunner):
    """A runner whose device reports a throttle during every pair (as NVML would on a hot GPU)."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.throttle_probe = lambda: True


def test_a_win_measured_under_interference_is_measured_again() -> None:
    runner = ProbedRunner({0: 2.0, 1: 1.0})
    outcome = candidate_trials(runner, FAST, 0, 1, NAMES, NO_DEADLINE)
    assert outcome.remeasured is True and outcome.stop == "decided"
    assert outcome.interference is not None and outcome.interference.throttled == outcome.interference.pairs == 7
    assert runner.measured().count(1) == 1 + 2 * 7  # one warmup, two sequences of 7 pairs
    _, (report,) = decide(0, NAMES, [outcome], FAST)
    assert "re-measured after interference" in report.note and "7/7 pairs disturbed" in report.note


def test_a_quiet_win_is_not_measured_again() -> None:
    outcome = candidate_trials(FakeRunner({0: 2.0, 1: 1.0}), FAST.replace(max_disturbed=1.0), 0, 1, NAMES, NO_DEADLINE)
    assert outcome.remeasured is False


def test_reference_noise_is_the_relative_mad_of_its_times() -> None:
    assert reference_noise([1.0, 1.0, 2.0]) == 0.0
    assert reference_noise([1.0, 2.0, 4.0]) == pytest.approx(0.5)
