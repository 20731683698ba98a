"""``farm.tune``: one operation, given inputs, a fresh controller, no cache; the decision with its report."""

from __future__ import annotations

import time

import numpy as np
import pytest

import farm


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def scale_set() -> farm.TunableSet:
    scale = farm.TunableSet("oneshot_scale", signature=farm.array_signature)

    @scale.reference
    def slow(x: np.ndarray) -> np.ndarray:
        busy(0.002)
        return x * 2.0

    @scale.candidate(group=0)
    def wrong(x: np.ndarray) -> np.ndarray:
        return x * 3.0

    @scale.candidate(group=0)
    def nan(x: np.ndarray) -> np.ndarray:
        return x * np.nan

    @scale.candidate(group=1)
    def fast(x: np.ndarray) -> np.ndarray:
        busy(0.0002)
        return x + x

    return scale


def test_tune_picks_the_fastest_correct_candidate_and_reports_every_verdict() -> None:
    tuned = farm.tune(scale_set(), np.ones(64), policy=farm.StackPolicy(warmups=1))
    assert (tuned.name, tuned.decision.source) == ("fast", farm.DecisionSource.TUNED)
    np.testing.assert_array_equal(tuned.fn(np.ones(4)), np.full(4, 2.0))
    assert tuned.report is not None
    notes = {c.name: c for c in tuned.report.candidates}
    assert notes["wrong"].note.startswith("rejected: wrong output")
    assert notes["nan"].note.startswith("rejected")
    assert notes["fast"].standing == "faster" and notes["fast"].stop == "decided" and notes["fast"].samples >= 7
    assert notes["fast"].interference is not None and notes["fast"].interference.pairs == notes["fast"].samples


def test_tune_uses_a_fresh_controller_and_stores_nothing() -> None:
    scale = scale_set()
    first = farm.tune(scale, (np.ones(8),), device="cpu:0", policy=farm.StackPolicy(warmups=1))
    second = farm.tune(scale, (np.ones(8),), device=farm.HostClient(0), policy=farm.StackPolicy(warmups=1))
    assert first.decision.source is second.decision.source is farm.DecisionSource.TUNED
    assert farm.stack_autotuner() is None


@pytest.mark.parametrize("mode", [farm.Mode.CACHE_ONLY, farm.Mode.DISABLED])
def test_tune_refuses_a_policy_that_would_not_search(mode: farm.Mode) -> None:
    with pytest.raises(farm.TuneFailure) as info:
        farm.tune(scale_set(), np.ones(8), policy=farm.StackPolicy(mode=mode))
    assert info.value.kind is farm.FailureKind.INVALID_INPUT and "EXPLORE" in info.value.message
