"""Racing (farm.racing): the drop and promotion rules with scripted timings, the error bound, and racing as the
default evaluation of a space's configs in a whole search."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

import farm
from farm.errors import TuneFailure
from farm.policy import StackPolicy
from farm.racing import BETA, Race, excess_bound, excesses, look_beta
from farm.trials import TrialVerdict
from tests.fakes import FakeRunner

NAMES = ["reference", "a", "b", "c", "d"]
REFERENCE_TIMES = [1.0, 1.01, 1.02, 1.0, 1.03, 1.01, 1.02]
POLICY = StackPolicy(samples=7)


def race(times: dict[int, list[float] | float], verdicts: dict[int, object] | None = None,
         policy: StackPolicy = POLICY) -> tuple[Race, FakeRunner]:
    runner = FakeRunner({0: [1.0, 1.01, 1.02, 1.0, 1.03, 1.01, 1.02], **times}, verdicts)  # type: ignore[dict-item]
    return Race(runner, policy, 0, NAMES, REFERENCE_TIMES, deadline=float("inf")), runner


def test_a_config_decided_slower_than_the_incumbent_is_dropped_after_one_pair() -> None:
    r, runner = race({1: 3.0})
    assert r.enter(1) == pytest.approx(3.0)  # its estimate: best run / the reference's fastest
    raced = r.finish()
    (outcome,) = raced.outcomes
    assert outcome.kind is TrialVerdict.DROPPED and outcome.failure is not None
    assert len(outcome.pairs) == 1 and "slower than 'reference'" in outcome.note
    assert raced.winner == 0
    assert [c for c in runner.calls if c[0] == "measure" and c[1] == 1] == [("measure", 1)]


def test_a_config_decided_faster_becomes_the_incumbent_and_gets_the_full_verdict_against_the_reference() -> None:
    r, _ = race({1: 0.5, 2: 3.0})
    r.enter(1)
    assert r.incumbent == 1
    r.enter(2)  # timed against the new incumbent
    raced = r.finish()
    by = {o.index: o for o in raced.outcomes}
    assert raced.winner == 1
    assert by[2].kind is TrialVerdict.DROPPED and "slower than 'a'" in by[2].note
    # The winner's outcome is the full protocol against the reference: pairs (reference, winner), decided.
    assert by[1].kind is TrialVerdict.PASSED and by[1].stop == "decided"
    assert all(ref == pytest.approx(1.0, abs=0.05) and c == 0.5 for ref, c in by[1].pairs)
    assert len(by[1].pairs) >= POLICY.samples


def test_a_close_config_stays_a_contender_and_is_settled_head_to_head() -> None:
    # b is 0.5 % slower than a: no look after `samples` pairs can tell them apart with noise of a few %.
    r, _ = race({1: [0.50, 0.51, 0.52, 0.50, 0.53, 0.51, 0.52], 2: [0.5025, 0.5126, 0.5226, 0.5025, 0.5327]})
    r.enter(1)
    r.enter(2)
    assert 2 in r.contenders
    raced = r.finish()
    by = {o.index: o for o in raced.outcomes}
    assert {raced.winner} | {o.index for o in raced.outcomes if o.kind is TrialVerdict.DROPPED} == {1, 2}
    loser = by[({1, 2} - {raced.winner}).pop()]
    assert loser.kind is TrialVerdict.DROPPED
    assert len(loser.pairs) > POLICY.samples or "slower than" in loser.note  # it took more pairs in the settlement


def test_a_wrong_output_is_a_verdict_never_a_winner() -> None:
    r, _ = race({1: 0.1, 2: 0.6}, {1: TuneFailure.rejected("wrong output: max abs error 1")})
    assert r.enter(1) is None
    r.enter(2)
    raced = r.finish()
    by = {o.index: o for o in raced.outcomes}
    assert by[1].kind is TrialVerdict.REJECTED and "wrong output" in by[1].note
    assert raced.winner == 2


def test_a_config_that_errs_while_timed_is_rejected_with_its_pairs_so_far() -> None:
    r, _ = race({1: [2.0, "boom"]})  # type: ignore[list-item]
    r.enter(1)
    raced = r.finish()
    assert raced.outcomes[0].kind in (TrialVerdict.REJECTED, TrialVerdict.DROPPED)


def test_the_budget_stops_the_race_and_the_rest_is_not_tried() -> None:
    r, _ = race({1: 0.5})
    r.deadline = 0.0  # already past
    assert r.enter(1) is None
    raced = r.finish()
    assert raced.budget_exhausted and raced.outcomes[0].kind is TrialVerdict.NOT_TRIED


def test_excess_bound_is_infinite_without_noise_and_shrinks_with_more_runs() -> None:
    assert excess_bound([], 1, 1) == float("inf")  # nothing known of the noise: nothing is decided
    noise = [i / 1000 for i in range(1000)]
    bounds = [excess_bound(noise, runs, 1) for runs in (1, 2, 4, 8)]
    assert bounds == sorted(bounds, reverse=True) and bounds[-1] > 0
    assert excess_bound(noise, 1, 1) >= 0.993  # at least the empirical 99.4 % quantile of the excesses
    # A later look spends less: its level (0.02 %) lies beyond what 1,000 excesses show, so the tail model answers.
    assert excess_bound(noise, 1, 5) > max(noise)


def test_excess_bound_extrapolates_a_tail_a_few_runs_cannot_show() -> None:
    # Four excesses cannot show a 0.6 % quantile: the exponential tail over their (bounded) mean can.
    assert excess_bound([0.01, 0.02, 0.03, 0.04], 1, 1) > 0.04


def test_excesses_leave_the_fastest_run_out() -> None:
    assert excesses([2.0]) == []
    assert excesses([2.0, 1.0, 1.5]) == [1.0, 0.5]


def test_the_looks_spend_at_most_beta_in_all() -> None:
    assert sum(look_beta(k) for k in range(1, 100_000)) < BETA


def test_a_config_as_fast_as_the_incumbent_is_rarely_dropped() -> None:
    """The documented bound: a config truly at least as fast as the incumbent is dropped with probability at most
    BETA when its noise is distributed as the incumbent's (here heavy-tailed, 400 seeded races)."""
    dropped = 0
    for seed in range(400):
        rng = random.Random(seed)

        def noisy(true: float, n: int, rng: random.Random = rng) -> list[float]:
            return [true * (1.0 + rng.expovariate(1 / 0.02)) for _ in range(n)]

        reference_times = noisy(1.0, 7)
        runner = FakeRunner({0: noisy(1.0, 200), 1: noisy(1.0, 200)})
        r = Race(runner, POLICY, 0, NAMES, reference_times, deadline=float("inf"))
        r.enter(1)
        dropped += r.outcomes.get(1) is not None and r.outcomes[1].kind is TrialVerdict.DROPPED
    assert dropped / 400 <= 2 * BETA


def test_the_sampler_is_told_each_configs_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    told: list[tuple[int, float | None]] = []
    ts = farm.TunableSet("racing_told", signature=farm.array_signature)

    @ts.reference
    def base(x: np.ndarray) -> np.ndarray:
        return x * 2.0

    @ts.space(group=0, k=[1, 2, 3])
    def scaled(x: np.ndarray, k: int) -> np.ndarray:
        return x * 2.0

    from farm import spacesearch, strategies

    def spy(*args: Any, **kw: Any) -> Any:
        sampler = strategies.make_sampler(*args, **kw)
        tell = sampler.tell

        def record(results: Any) -> None:
            told.extend(results)
            tell(results)

        sampler.tell = record  # type: ignore[method-assign]
        return sampler

    monkeypatch.setattr(spacesearch, "make_sampler", spy)
    tuned = farm.tune(ts, (np.ones(64),), policy=StackPolicy(samples=3, budget=5.0))
    assert sorted(p for p, _ in told) == [1, 2, 3] and all(e is None or e > 0 for _, e in told)
    assert tuned.report is not None and tuned.report.evaluated == 3


def test_screening_is_validated_and_stays_out_of_the_accuracy_key() -> None:
    with pytest.raises(TuneFailure, match="screening"):
        StackPolicy(screening="fast").validate()
    assert StackPolicy().screening == "race"
    assert StackPolicy(screening="full").accuracy_key() == StackPolicy().accuracy_key()
    assert StackPolicy.from_dict({"screening": "full"}).screening == "full"
