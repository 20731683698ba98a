"""The selection rule: paired median ratios, the MAD noise limit, min_speedup, and the running winner."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from farm.policy import StackPolicy
from farm.scoring import Selection, judge, paired_score, ratio_statistics, valid_seconds

seconds = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False, allow_infinity=False)
pair_lists = st.lists(st.tuples(seconds, seconds), min_size=1, max_size=21)
LENIENT = StackPolicy(max_relative_mad=1e9)


def expected_statistics(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    ratios = [c / r for r, c in pairs]
    median = statistics.median(ratios)
    return median, statistics.median(abs(x - median) for x in ratios) / median


@given(pair_lists)
def test_the_score_is_the_median_ratio_and_its_relative_mad(pairs: list[tuple[float, float]]) -> None:
    score = paired_score(pairs, LENIENT)
    assert score is not None
    ratio, mad = expected_statistics(pairs)
    assert score == pytest.approx((ratio, mad), rel=1e-12, abs=1e-15)


@given(pair_lists, st.floats(0, 1, allow_nan=False))
def test_a_score_noisier_than_max_relative_mad_is_none(pairs: list[tuple[float, float]], limit: float) -> None:
    _, mad = expected_statistics(pairs)
    assume(not math.isclose(mad, limit, rel_tol=1e-9))
    score = paired_score(pairs, StackPolicy(max_relative_mad=limit))
    assert (score is None) == (mad > limit)


@given(pair_lists, st.randoms(use_true_random=False))
def test_the_score_does_not_depend_on_the_order_of_the_pairs(pairs: list[tuple[float, float]], rng: random.Random) -> None:
    shuffled = list(pairs)
    rng.shuffle(shuffled)
    assert paired_score(shuffled, LENIENT) == paired_score(pairs, LENIENT)


@given(pair_lists, st.integers(-20, 20))
def test_scaling_every_time_by_a_power_of_two_leaves_the_score_unchanged(pairs: list[tuple[float, float]], exponent: int) -> None:
    k = 2.0**exponent
    scaled = [(r * k, c * k) for r, c in pairs]
    assert paired_score(scaled, LENIENT) == paired_score(pairs, LENIENT)


@given(pair_lists, st.floats(1e-3, 1e3, allow_nan=False))
def test_scaling_every_time_by_any_constant_leaves_the_ratio_unchanged(pairs: list[tuple[float, float]], k: float) -> None:
    scaled = paired_score([(r * k, c * k) for r, c in pairs], LENIENT)
    original = paired_score(pairs, LENIENT)
    assert scaled is not None and original is not None
    assert scaled[0] == pytest.approx(original[0], rel=1e-9)


def test_a_relative_mad_equal_to_the_limit_is_accepted() -> None:
    # Ratios 0.5, 1.0, 1.5: median 1.0, MAD 0.5.
    pairs = [(2.0, 1.0), (2.0, 2.0), (2.0, 3.0)]
    assert paired_score(pairs, StackPolicy(max_relative_mad=0.5)) == (1.0, 0.5)
    assert paired_score(pairs, StackPolicy(max_relative_mad=0.4999)) is None


@pytest.mark.parametrize(
    "pairs",
    [
        [],
        [(1.0, 0.0)],
        [(0.0, 1.0)],
        [(1.0, -1.0)],
        [(1.0, math.nan)],
        [(math.inf, 1.0)],
        [(1.0, 1.0), (1.0, math.nan)],
    ],
)
def test_empty_or_invalid_pairs_have_no_score(pairs: list[tuple[float, float]]) -> None:
    assert paired_score(pairs, LENIENT) is None
    with pytest.raises(ValueError):
        ratio_statistics(pairs)


@pytest.mark.parametrize(
    ("value", "valid"),
    [(1e-12, True), (3, True), (0.0, False), (-1.0, False), (math.nan, False), (math.inf, False), ("1", False), (None, False)],
)
def test_a_usable_time_is_a_finite_positive_number(value: object, valid: bool) -> None:
    assert valid_seconds(value) is valid  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pairs", "accepted", "note"),
    [
        ([(2.0, 1.0)] * 3, True, "ratio 0.500"),
        ([(1.0, 1.0)] * 3, True, "too slow"),
        ([(1.0, 0.1), (1.0, 0.5), (1.0, 0.9)], False, "noisy"),
        ([(1.0, 0.0)], False, "rejected"),
    ],
)
def test_judge_notes_say_why(pairs: list[tuple[float, float]], accepted: bool, note: str) -> None:
    verdict = judge(pairs, StackPolicy())
    assert verdict.accepted is accepted
    assert note in verdict.note


@pytest.mark.parametrize(
    ("offers", "min_speedup", "winner", "ratio"),
    [
        ([], 1.05, 0, 1.0),
        ([(1, 0.5)], 2.0, 1, 0.5),  # ratio * min_speedup == 1 wins
        ([(1, 0.5000001)], 2.0, 0, 1.0),  # slightly above loses
        ([(1, 0.9), (2, 0.5)], 1.05, 2, 0.5),  # a later, faster candidate replaces an earlier good one
        ([(1, 0.5), (2, 0.9)], 1.05, 1, 0.5),  # a later, slower one does not
        ([(1, 0.5), (2, 0.5)], 1.0, 1, 0.5),  # a tie keeps the earlier winner
        ([(1, 0.99)], 1.05, 0, 1.0),  # faster but below min_speedup: the reference stays
        ([(1, 1.0)], 1.0, 0, 1.0),  # as fast as the reference is not better
    ],
)
def test_a_candidate_wins_only_if_it_beats_the_winner_and_clears_min_speedup(
    offers: list[tuple[int, float]], min_speedup: float, winner: int, ratio: float
) -> None:
    selection = Selection(0, StackPolicy(min_speedup=min_speedup))
    for index, r in offers:
        selection.offer(index, r, True)
    assert (selection.index, selection.ratio) == (winner, ratio)


def test_an_unverified_winner_is_reported_unverified() -> None:
    selection = Selection(0, StackPolicy())
    assert selection.offer(3, 0.5, False) is True
    assert (selection.index, selection.verified) == (3, False)
