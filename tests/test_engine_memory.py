"""The controller's budget, invalidation and regression window, and its memory (eviction, TTL, reports)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from engine_helpers import (
    C,
    P,
    tuner_with,
)
from fakes import FAST, FakeClock, FakeRunner, install_clock, problem

from farm.engine import DecisionSource, StackTuner, Stats
from farm.errors import FailureKind, TuneFailure
from farm.policy import MemoryEviction


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return install_clock(monkeypatch)


# -- the budget (a fake clock that trials advance) ------------------------------------------------------------


def test_the_budget_stops_the_search_between_candidates(clock: FakeClock) -> None:
    tuner = tuner_with(budget=1.4)
    # The reference takes 4 x 0.1 s; candidate a 1 warmup + 7 pairs (3 cannot decide) = 1.1 s more, its last pair
    # starting at 1.35 s; b would follow at 1.5 s.
    runner = FakeRunner({0: 0.1, 1: 0.05, 2: 0.01}, clock=clock)
    decision = tuner.select(P, C, 0, runner)
    assert decision.name == "a"
    assert 2 not in runner.measured()
    report = tuner.reports()[0]
    assert report.budget_exhausted is True
    assert report.candidates[2].note == "not tried: budget of 1.4s exhausted"
    assert report.elapsed == pytest.approx(1.5)


def test_a_candidate_cut_off_by_the_budget_mid_sampling_is_rejected(clock: FakeClock) -> None:
    tuner = tuner_with(budget=0.5)
    runner = FakeRunner({0: 0.1, 1: 0.05, 2: 0.01}, clock=clock)
    decision = tuner.select(P, C, 0, runner)
    assert decision.index == 0
    report = tuner.reports()[0]
    assert report.budget_exhausted is True
    assert report.candidates[1].note == "rejected: budget of 0.5s exhausted during sampling"
    assert report.candidates[2].note.startswith("not tried: budget")


def test_the_budget_is_soft_and_the_reference_is_always_timed(clock: FakeClock) -> None:
    tuner = tuner_with(budget=0.01)
    runner = FakeRunner({0: 1.0, 1: 0.1}, clock=clock)
    decision = tuner.select(P, C, 0, runner)
    assert (decision.index, decision.source) == (0, DecisionSource.TUNED)
    assert runner.measured() == [0] * 4
    assert tuner.reports()[0].budget_exhausted is True


def test_a_search_within_budget_is_not_marked_exhausted(clock: FakeClock) -> None:
    tuner = tuner_with(budget=100.0)
    tuner.select(P, C, 0, FakeRunner({1: 0.5}, clock=clock))
    assert tuner.reports()[0].budget_exhausted is False


# -- invalidation and the regression window ---------------------------------------------------------------------


def test_invalidate_with_ban_forgets_the_decision_and_never_picks_that_candidate_again() -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5, 2: 0.8}))
    tuner.invalidate(decision, True)
    assert tuner.stats().invalidations == 1
    retune = FakeRunner({1: 0.1, 2: 0.8})
    again = tuner.select(P, C, 0, retune)
    assert (again.name, again.source) == ("b", DecisionSource.TUNED)
    assert 1 not in retune.measured()
    assert tuner.reports()[-1].candidates[1].note == "skipped: banned for this key after a failure or regression"
    # The ban is per key: another workload may still choose it.
    assert tuner.select(problem(workload="other"), C, 0, FakeRunner({1: 0.5})).name == "a"


def test_invalidate_without_ban_lets_the_candidate_win_again() -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    tuner.invalidate(decision, False)
    retune = FakeRunner({1: 0.5})
    assert tuner.select(P, C, 0, retune) == decision
    assert retune.calls != []


def test_the_reference_is_never_banned() -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({1: 2.0, 2: 2.0}))
    assert decision.index == 0
    tuner.invalidate(decision, True)
    assert tuner.select(P, C, 0, FakeRunner({1: 2.0, 2: 2.0})).index == 0
    assert tuner.reports()[-1].candidates[0].note == "selected: reference"


REGRESSION = [
    ("three slow checked observations", [(1.0, 1.2, True)] * 3, [False, False, True]),
    ("fewer than regression_pairs", [(1.0, 1.2, True)] * 2, [False, False]),
    ("unchecked observations are ignored", [(1.0, 2.0, False)] * 3 + [(1.0, 2.0, True)] * 2, [False] * 5),
    ("a median at the ratio is not above it", [(1.0, 1.15, True)] * 3, [False] * 3),
    ("the median, not the mean", [(1.0, 1.0, True), (1.0, 1.0, True), (1.0, 100.0, True)], [False] * 3),
    ("the window slides", [(1.0, 1.0, True)] * 3 + [(1.0, 2.0, True)] * 2, [False] * 4 + [True]),
]


@pytest.mark.parametrize(("case", "observations", "expected"), REGRESSION, ids=[r[0] for r in REGRESSION])
def test_the_regression_window_invalidates_and_bans_on_a_slow_median(
    case: str, observations: list[tuple[float, float, bool]], expected: list[bool]
) -> None:
    tuner = tuner_with(regression_pairs=3, regression_ratio=1.15)
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5, 2: 0.8}))
    results = [tuner.record_comparison(decision, r, s, checked) for r, s, checked in observations]
    assert results == expected
    retune = FakeRunner({1: 0.5, 2: 0.8})
    after = tuner.select(P, C, 0, retune)
    if expected[-1]:
        assert tuner.stats().invalidations == 1
        assert (after.name, after.source) == ("b", DecisionSource.TUNED)
        assert 1 not in retune.measured()
    else:
        assert tuner.stats().invalidations == 0
        assert after.source is DecisionSource.MEMORY_CACHE and retune.calls == []


def test_a_memory_hit_decision_feeds_the_same_window() -> None:
    tuner = tuner_with(regression_pairs=3)
    tuned = tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    hit = tuner.select(P, C, 0, FakeRunner())
    assert [tuner.record_comparison(d, 1.0, 2.0, True) for d in (tuned, hit, hit)] == [False, False, True]


@pytest.mark.parametrize("source", [DecisionSource.BUSY, DecisionSource.NESTED, DecisionSource.CACHE_MISS])
def test_comparisons_of_a_fallback_decision_are_ignored(source: DecisionSource) -> None:
    tuner = tuner_with(regression_pairs=3)
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5}))._replace(source=source)
    assert [tuner.record_comparison(decision, 1.0, 5.0, True) for _ in range(3)] == [False] * 3
    assert tuner.stats().invalidations == 0


def test_comparisons_of_the_reference_never_invalidate() -> None:
    tuner = tuner_with(regression_pairs=3)
    decision = tuner.select(P, C, 0, FakeRunner({1: 2.0, 2: 2.0}))
    assert [tuner.record_comparison(decision, 1.0, 5.0, True) for _ in range(3)] == [False] * 3


@pytest.mark.parametrize(("reference", "selected"), [(0.0, 1.0), (1.0, -1.0), (math.nan, 1.0), (1.0, math.inf)])
def test_a_comparison_with_unusable_seconds_is_invalid_input(reference: float, selected: float) -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    with pytest.raises(TuneFailure) as info:
        tuner.record_comparison(decision, reference, selected, True)
    assert info.value.kind is FailureKind.INVALID_INPUT


# -- memory: eviction, TTL, reports -------------------------------------------------------------------------------


def workload(n: int) -> Any:
    return problem(workload=f"w{n}")


def read_first_then_overflow(eviction: MemoryEviction) -> StackTuner:
    """A memory of two records: workloads 1 and 2 tuned, 1 read back (a memory hit), then 3 tuned."""
    tuner = StackTuner(FAST.replace(capacity=2), memory_eviction=eviction)
    for n in (1, 2):
        tuner.select(workload(n), C, 0, FakeRunner())
    assert tuner.select(workload(1), C, 0, FakeRunner()).source is DecisionSource.MEMORY_CACHE
    tuner.select(workload(3), C, 0, FakeRunner())
    return tuner


def test_fifo_eviction_drops_the_oldest_insert_even_if_it_was_just_read() -> None:
    tuner = read_first_then_overflow(MemoryEviction.FIFO)
    assert tuner.select(workload(2), C, 0, FakeRunner()).source is DecisionSource.MEMORY_CACHE
    assert tuner.select(workload(1), C, 0, FakeRunner()).source is DecisionSource.TUNED


def test_lru_eviction_drops_the_least_recently_read() -> None:
    tuner = read_first_then_overflow(MemoryEviction.LRU)
    assert tuner.select(workload(1), C, 0, FakeRunner()).source is DecisionSource.MEMORY_CACHE
    assert tuner.select(workload(2), C, 0, FakeRunner()).source is DecisionSource.TUNED


def test_a_record_is_fresh_up_to_its_ttl_and_expires_after(clock: FakeClock) -> None:
    tuner = tuner_with(ttl=60.0)
    tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    clock.advance(60.0)
    assert tuner.select(P, C, 0, FakeRunner()).source is DecisionSource.MEMORY_CACHE
    clock.advance(0.001)
    retune = FakeRunner({1: 0.5})
    assert tuner.select(P, C, 0, retune).source is DecisionSource.TUNED
    assert retune.calls != []


def test_a_future_dated_record_is_stale(clock: FakeClock) -> None:
    tuner = tuner_with()
    tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    clock.wall -= 10.0
    assert tuner.select(P, C, 0, FakeRunner({1: 0.5})).source is DecisionSource.TUNED


@pytest.mark.parametrize(("capacity", "tunes", "kept"), [(3, 5, 3), (1024, 130, 128)])
def test_reports_are_bounded_to_the_smaller_of_capacity_and_128(capacity: int, tunes: int, kept: int) -> None:
    tuner = StackTuner(FAST.replace(capacity=capacity, warmups=1, samples=3))
    for n in range(tunes):
        tuner.select(workload(n), C[:2], 0, FakeRunner())
    reports = tuner.reports()
    assert len(reports) == kept
    assert reports[-1].workload == f"w{tunes - 1}" and reports[0].workload == f"w{tunes - kept}"


def test_stats_count_every_outcome() -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    tuner.select(P, C, 0, FakeRunner())
    tuner.select(P, C, 0, FakeRunner())
    tuner.invalidate(decision, False)
    tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    with pytest.raises(TuneFailure):
        tuner.select(problem(workload="dead"), C, 0, FakeRunner({0: TuneFailure.device("x")}), device="cuda:3")
    assert tuner.stats() == Stats(memory_hits=2, misses=3, tunes=2, invalidations=1, device_failures=1)
