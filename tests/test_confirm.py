"""Independent confirmation: a second device must reproduce the winner's verdict, or it is not confirmed.

Pure logic over recorded trial results (the real two-worker confirmation runs in test_farm_fleet.py)."""

from __future__ import annotations

from typing import Any

import pytest

from farm.interference import Interference
from farm.policy import StackPolicy
from farm.stores.base import DecisionRecord
from farm.trials import CandidateReport, Outcome, TrialVerdict
from farm_coordinator.aggregate import Aggregate, confirm, unconfirmed
from farm_coordinator.catalog import Workload
from farm_coordinator.plan import PlannedProblem, Target
from farm_fleet.protocol import STATUS_FAILED, STATUS_OK, GroupResult

KEY = "key"
PROBLEM = PlannedProblem("p", Target("fp", "fp", "cpu"), Workload("op", {}, ("cpu",), "problems[0]"), ())
FAST_PAIRS = ((1.0, 0.5),) * 7  # a quiet, decided 2x win


def first_verdict() -> Aggregate:
    """The first device's decision: candidate "fast" at ratio 0.5, its interval [0.48, 0.52]."""
    meta: dict[str, Any] = {"reference": "ref", "confirmation": None, "confirmed_by": None, "confirmation_ratio": None,
                            "rejected_winner": None}
    record = DecisionRecord(KEY, 1, 0, "fast", True, 0.5, 1.0, meta)
    judged = (CandidateReport("fast", 7, 0.5, 0.0, True, "selected", index=1, standing="faster", interval=(0.48, 0.52)),)
    return Aggregate(PROBLEM, record, judged, "fast", 0.5, None, 1.0, "w1")


def second(pairs: tuple[tuple[float, float], ...] = FAST_PAIRS, *, failure: str | None = None, verified: bool = True,
           key: str = KEY, status: str = STATUS_OK, interference: Interference | None = None) -> GroupResult:
    if failure is None:
        outcome = Outcome(1, "fast", pairs, verified, interference=interference)
    else:
        outcome = Outcome(1, "fast", (), verified, TrialVerdict.REJECTED, failure, budget_exhausted="budget" in failure)
    return GroupResult("run", "p", "confirm", status, cache_key=key, names=("ref", "fast"), outcomes=(outcome,),
                       error=None if status == STATUS_OK else "worker died", provenance={"worker": "w2"})


def test_a_reproduced_win_is_confirmed() -> None:
    agg = confirm(first_verdict(), second(((1.0, 0.55),) * 7), StackPolicy())
    assert agg.record is not None and agg.record.name == "fast"
    assert agg.record.meta["confirmation"] == "confirmed" and agg.record.meta["confirmed_by"] == "w2"
    assert agg.confirmation is not None and agg.confirmation.group == "confirm"
    assert agg.record.meta["confirmation_ratio"] == pytest.approx(0.55)


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        (second(((1.0, 0.3),) * 7), "outside the first verdict's band"),  # a win, but not the same win
        (second(((1.0, 0.5),) * 3), "did not decide a win"),  # undecided: too few pairs
        (second(((1.0, 0.3), (1.0, 0.9)) * 3 + ((1.0, 0.5),)), "did not decide a win"),  # undecided: noisy
        (second(key="other"), "different cache key"),
        (second(status=STATUS_FAILED), "worker died"),
        (second(failure="budget of 1s exhausted during sampling"), "budget"),
        (second(interference=Interference(7, 7, 40, 0, 0.3)), "under interference"),
    ],
)
def test_a_win_that_is_not_reproduced_is_published_unconfirmed(result: GroupResult, reason: str) -> None:
    agg = confirm(first_verdict(), result, StackPolicy())
    assert agg.record is not None and agg.record.name == "fast"
    assert agg.record.meta["confirmation"].startswith("unconfirmed") and reason in agg.record.meta["confirmation"]


def test_when_confirmation_is_required_an_unreproduced_win_is_not_published() -> None:
    agg = confirm(first_verdict(), second(((1.0, 0.3),) * 7), StackPolicy(require_confirmation=True))
    assert agg.record is None and agg.error is not None and agg.error.startswith("not published: unconfirmed")


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        (second(((1.0, 1.0),) * 7), "too slow"),  # decided not faster there
        (second(failure="wrong output"), "wrong output"),
        (second(verified=False), "not verified"),
    ],
)
def test_a_contradicted_win_keeps_the_reference(result: GroupResult, reason: str) -> None:
    agg = confirm(first_verdict(), result, StackPolicy())
    assert agg.record is not None and (agg.record.name, agg.record.ratio) == ("ref", 1.0)
    assert reason in agg.record.meta["confirmation"] and agg.record.meta["rejected_winner"] == "fast"


def test_without_a_second_device_the_winner_is_unconfirmed_or_withheld() -> None:
    published = unconfirmed(first_verdict(), StackPolicy())
    assert published.record is not None and published.record.meta["confirmation"].startswith("unconfirmed: no second")
    withheld = unconfirmed(first_verdict(), StackPolicy(require_confirmation=True))
    assert withheld.record is None and withheld.winner is None


def test_applying_a_confirmation_returns_a_new_verdict_and_leaves_the_first_one_as_it_was() -> None:
    first = first_verdict()
    confirmed = confirm(first, second(), StackPolicy())
    assert first.confirmation is None and first.record is not None and first.record.meta["confirmation"] is None
    assert confirmed.confirmation is not None and confirmed is not first and confirmed.problem is first.problem
