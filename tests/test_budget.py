"""The run budget's allocator (farm_coordinator.budget): which problem gets the next device-second, on scripted
problems (tables), and what a budget bought."""

from __future__ import annotations

import math

import pytest

from farm_coordinator.budget import (
    WARMUP,
    WINDOW,
    Allocator,
    Standing,
    achievable_gain,
    bought,
    choose,
    expected_rate,
)


def standing(key: str, order: int, weight: float = 1.0, reference: float | None = 1.0,
             ratios: tuple[float, ...] = (1.0, 1.0), cost: float = 1.0, left: float = 1.0,
             finished: bool = False) -> Standing:
    """A problem whose search took one result per ``cost`` device seconds, its best ratio after each ``ratios``."""
    history = tuple(((i + 1) * cost, min(ratios[: i + 1])) for i in range(len(ratios)))
    bests = [1.0] + [r for _, r in history]
    steps = [math.log(a / b) for a, b in zip(bests, bests[1:], strict=False) if b < a]
    return Standing(key, order, weight, reference, ratio=history[-1][1] if history else 1.0,
                    spent=history[-1][0] if history else 0.0, results=len(ratios), step=steps[-1] if steps else 0.0,
                    history=history[-(WINDOW + 1):], left=left, finished=finished)


ORDER = {
    "every problem gets its reference and one round before any ranking (least-served, then catalog order)": (
        [standing("heavy", 0, weight=1000.0, ratios=(1.0, 0.5)), standing("new", 1, ratios=()),
         standing("one", 2, ratios=(1.0,))], "new"),
    "a cold problem of equal service goes in catalog order": (
        [standing("b", 1, ratios=(1.0,)), standing("a", 0, ratios=(1.0,))], "a"),
    "a problem whose reference is not measured is not warm": (
        [standing("heavy", 0, weight=1000.0, ratios=(1.0, 0.5)), standing("unmeasured", 1, reference=None)],
        "unmeasured"),
    "the weight decides between equal searches": (
        [standing("light", 0, weight=1.0, ratios=(1.0, 0.8)), standing("heavy", 1, weight=50.0, ratios=(1.0, 0.8))],
        "heavy"),
    "the weight is the fleet time: a reference's seconds per call do not scale it again": (
        [standing("slow", 0, reference=0.1, ratios=(1.0, 0.8)), standing("fast", 1, weight=2.0, reference=0.001,
                                                                          ratios=(1.0, 0.8))], "fast"),
    "a search still improving beats one that stalled": (
        [standing("stalled", 0, ratios=(1.0, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6)),
         standing("improving", 1, ratios=(1.0, 0.9, 0.8, 0.7))], "improving"),
    "cheaper results buy more per device-second": (
        [standing("dear", 0, ratios=(1.0, 0.8), cost=10.0), standing("cheap", 1, ratios=(1.0, 0.8), cost=1.0)],
        "cheap"),
    "a finished search gets nothing, however heavy": (
        [standing("done", 0, weight=1e6, ratios=(1.0, 0.1), finished=True), standing("open", 1, ratios=(1.0, 1.0))],
        "open"),
    "a search with nothing left of its space gets nothing": (
        [standing("empty", 0, weight=1e6, ratios=(1.0, 0.1), left=0.0), standing("open", 1, ratios=(1.0, 1.0))],
        "open"),
    "a heavy problem that gained nothing yet still outranks a light one that did": (
        [standing("light", 0, weight=1.0, ratios=(1.0, 0.5)), standing("heavy", 1, weight=100.0, ratios=(1.0, 1.0))],
        "heavy"),
    "equal expected rates go in catalog order": (
        [standing("second", 1, ratios=(1.0, 0.8)), standing("first", 0, ratios=(1.0, 0.8))], "first"),
}


@pytest.mark.parametrize("problems,expected", ORDER.values(), ids=ORDER.keys())
def test_the_next_device_second_goes_to_the_largest_expected_weighted_saving(problems, expected) -> None:
    chosen = choose(problems)
    assert chosen is not None and chosen.key == expected


def test_nothing_is_chosen_once_every_search_has_finished() -> None:
    assert choose([standing("a", 0, finished=True), standing("b", 1, finished=True)]) is None
    assert choose([]) is None


RATES = {
    "finished": (standing("a", 0, ratios=(1.0, 0.5), finished=True), 0.0),
    "nothing measured": (standing("a", 0, ratios=()), 0.0),
    # forward: (gain 0.5 + 0.05) / (2 + 1) per result of 1 s; backward: 0.5 over the 1 s between the two results
    "a jump: the backward estimate": (standing("a", 0, weight=2.0, ratios=(1.0, 0.5)), 2.0 * 0.5),
    "no gain: the forward estimate's optimism": (standing("a", 0, ratios=(1.0, 1.0)), 0.05 / 3),
    "half the space left halves it": (standing("a", 0, ratios=(1.0, 1.0), left=0.5), 0.05 / 3 / 2),
}


@pytest.mark.parametrize("problem,rate", RATES.values(), ids=RATES.keys())
def test_the_expected_rate_of_scripted_searches(problem, rate) -> None:
    assert expected_rate(problem) == pytest.approx(rate)


def test_the_allocator_re_estimates_as_results_arrive_and_keeps_the_best_ratio() -> None:
    allocator = Allocator()
    for key, weight in (("a", 1.0), ("b", 10.0)):
        allocator.add(key, weight)
    order = []
    for _ in range(2 * WARMUP):  # the warm-up: each gets two results, least-served first
        key = allocator.next()
        assert key is not None
        order.append(key)
        allocator.observe(key, 1.0, reference_seconds=0.01, ratio=1.0)
    assert order == ["a", "b", "a", "b"]
    assert allocator.next() == "b"  # equal searches: the heavier
    allocator.observe("b", 1.0, ratio=0.7)
    allocator.observe("b", 1.0, ratio=0.9)  # a worse estimate never undoes the best so far
    allocator.observe("b", 1.0, ratio=0.695)  # nor does one within the noise (SIGNIFICANT) count as a new best
    assert allocator["b"].ratio == 0.7 and allocator["b"].history[-1] == (5.0, 0.7) and allocator["b"].results == 5
    assert allocator["b"].step == pytest.approx(math.log(1 / 0.7))
    allocator.finish("b")
    assert allocator.next() == "a" and allocator.next(among=["b"]) is None
    assert allocator.spent == pytest.approx(7.0)
    assert allocator["b"].reference_seconds == 0.01  # measured once, kept


def test_a_weight_that_is_not_a_finite_non_negative_number_is_refused() -> None:
    with pytest.raises(ValueError, match="problem p: weight must be a finite number >= 0, got -1"):
        Allocator().add("p", -1.0)


def test_what_a_budget_bought_against_the_given_or_estimated_achievable_saving() -> None:
    a = standing("a", 0, weight=5.0, reference=0.5, ratios=(1.0, 0.6), finished=True)  # saves 5 * 0.4 = 2
    b = standing("b", 1, weight=1.0, reference=1.0, ratios=(1.0, 1.0), cost=3.0)  # saves nothing yet
    got = bought([a, b], achievable={"a": 0.5, "b": 0.5})
    assert got.saved == pytest.approx(2.0) and got.achievable == pytest.approx(2.5 + 0.5)  # 5 * 0.5 + 1 * 0.5
    assert got.share == pytest.approx(2.0 / 3.0) and got.spent == pytest.approx(8.0)
    assert got.problems == (("b", 6.0, 0.0), ("a", 2.0, pytest.approx(2.0)))
    estimated = bought([a, b])
    assert achievable_gain(a) == pytest.approx(0.4)  # finished: what it got
    assert 0.0 < achievable_gain(b) <= 1.0 and estimated.share is not None and estimated.share < 1.0
    assert bought([]).share is None


def test_the_report_says_what_an_archives_searches_bought_weighted_by_a_catalog() -> None:
    from farm_coordinator.report import bought_card

    problems = [{"operation": "op", "workload": "n=1", "ratio": 0.5, "device_seconds": 2.0, "partial": None},
                {"operation": "op", "workload": "n=2", "ratio": 1.0, "device_seconds": 1.0, "partial": "cut short"}]
    card = bought_card(problems, {"op n=1": 4.0})
    assert card["saved"] == pytest.approx(2.0) and card["complete"] == 1
    assert card["lines"] == ["fleet time saved 2 per hour (weighted by the catalog); 1 of 2 searches complete, "
                             "3.0 device s", "  2.0 device s: op n=1 (saves 2 per hour)",
                             "  1.0 device s: op n=2 (saves 0 per hour)"]
    assert bought_card(problems)["lines"][0].startswith("fleet time saved 0.5 per hour (weight 1 each: --catalog")
