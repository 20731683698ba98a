"""The controller's lanes (the contract's steps 2 and 5): validation unavailable, nested and busy selections,
concurrency, and device-failure quarantine, driven by a scripted fake runner."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from engine_helpers import (
    C,
    P,
    tuner_with,
)
from fakes import FAST, FakeRunner, Gate, problem

from farm.engine import Decision, DecisionSource, StackTuner, Validation, is_tuning
from farm.errors import FailureKind, TuneFailure
from farm.policy import Mode


class Background:
    """Runs ``fn`` in a thread; ``result()`` joins (with a deadline) and returns its value or re-raises."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def body() -> None:
            try:
                self._value = fn()
            except BaseException as e:  # handed to the test thread by result()
                self._error = e

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 10.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background selection did not finish"
        if self._error is not None:
            raise self._error
        return self._value


# -- step 5: validation unavailable, nested, busy ---------------------------------------------------------------


def test_an_unvalidatable_reference_makes_the_key_validation_unavailable() -> None:
    tuner = tuner_with()
    runner = FakeRunner({1: 0.1}, {0: Validation.UNSUPPORTED})
    decision = tuner.select(P, C, 0, runner)
    assert (decision.index, decision.source) == (0, DecisionSource.VALIDATION_UNAVAILABLE)
    assert runner.validated() == [(0, 0)]
    idle = FakeRunner()
    assert tuner.select(P, C, 0, idle).source is DecisionSource.VALIDATION_UNAVAILABLE
    assert idle.calls == []
    assert tuner.stats().tunes == 0


def test_an_unvalidatable_reference_is_timed_anyway_when_validation_is_off() -> None:
    tuner = tuner_with(require_validation=False)
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.1}, {0: Validation.UNSUPPORTED}))
    assert (decision.name, decision.source, decision.verified) == ("a", DecisionSource.TUNED, True)


def test_a_selection_inside_a_trial_gets_the_reference_and_never_recurses() -> None:
    tuner = tuner_with()
    nested: list[Decision] = []
    inside: list[bool] = []
    inner_runner = FakeRunner()

    def nest(candidate: int) -> None:
        inside.append(is_tuning())
        if not nested:
            nested.append(tuner.select(problem(workload="inner"), C, 1, inner_runner))
            nested.append(tuner.select(P, C, 0, inner_runner))  # its own key: still NESTED, not BUSY

    outer = tuner.select(P, C, 0, FakeRunner({1: 0.5}, on_measure=nest))
    assert outer.source is DecisionSource.TUNED
    assert [(d.index, d.source) for d in nested] == [(1, DecisionSource.NESTED), (0, DecisionSource.NESTED)]
    assert inner_runner.calls == []
    assert all(inside) and not is_tuning()
    assert tuner.stats().busy_fallbacks == 0


@pytest.mark.parametrize(
    ("contender", "device", "max_parallel"),
    [
        ("the same key", None, 4),
        ("another key on the same device lane", None, 4),
        ("another lane when max_parallel_tunes is reached", "cpu:9", 1),
    ],
)
def test_a_contender_gets_the_reference_at_once_while_another_thread_is_mid_trial(
    contender: str, device: str | None, max_parallel: int
) -> None:
    tuner = tuner_with(max_parallel_tunes=max_parallel)
    gate = Gate()
    first = Background(lambda: tuner.select(P, C, 0, FakeRunner({1: 0.5}, on_measure=gate)))
    try:
        assert gate.entered.wait(10)
        other = P if contender == "the same key" else problem(workload="other")
        idle = FakeRunner()
        decision = tuner.select(other, C, 2, idle, device=device)
        # The contender returned while the first selection is still blocked inside its trial.
        assert first.thread.is_alive() and not gate.release.is_set()
        assert (decision.index, decision.source) == (2, DecisionSource.BUSY)
        assert idle.calls == []
    finally:
        gate.release.set()
    assert first.result().source is DecisionSource.TUNED
    assert tuner.stats().busy_fallbacks == 1
    later = FakeRunner()
    assert tuner.select(problem(workload="other"), C, 2, later, device=device).source is DecisionSource.TUNED
    assert later.calls != []


def test_parallel_tunes_on_different_lanes_run_at_once_up_to_the_limit() -> None:
    tuner = tuner_with(max_parallel_tunes=2)
    gate = Gate()
    first = Background(lambda: tuner.select(P, C, 0, FakeRunner(on_measure=gate)))
    try:
        assert gate.entered.wait(10)
        second = tuner.select(problem(workload="other"), C, 0, FakeRunner({1: 0.5}), device="cpu:1")
        assert first.thread.is_alive() and not gate.release.is_set()
        assert (second.source, second.name) == (DecisionSource.TUNED, "a")
    finally:
        gate.release.set()
    assert first.result().source is DecisionSource.TUNED


def test_memory_hits_are_served_while_another_key_is_being_tuned() -> None:
    tuner = tuner_with()
    tuner.select(problem(workload="warm"), C, 0, FakeRunner({1: 0.5}))
    gate = Gate()
    first = Background(lambda: tuner.select(P, C, 0, FakeRunner(on_measure=gate)))
    try:
        assert gate.entered.wait(10)
        hit = tuner.select(problem(workload="warm"), C, 0, FakeRunner())
        assert first.thread.is_alive()
        assert (hit.source, hit.name) == (DecisionSource.MEMORY_CACHE, "a")
    finally:
        gate.release.set()
    first.result()


def test_concurrent_selections_of_one_key_tune_it_exactly_once() -> None:
    tuner = tuner_with()
    gate = Gate()
    first = Background(lambda: tuner.select(P, C, 0, FakeRunner({1: 0.5}, on_measure=gate)))
    try:
        assert gate.entered.wait(10)
        others = [Background(lambda: tuner.select(P, C, 0, FakeRunner())) for _ in range(8)]
        sources = [o.result().source for o in others]
    finally:
        gate.release.set()
    assert first.result().source is DecisionSource.TUNED
    assert sources == [DecisionSource.BUSY] * 8
    assert tuner.stats().tunes == 1


def test_many_threads_selecting_many_keys_tune_each_key_exactly_once() -> None:
    tuner = tuner_with(max_parallel_tunes=256)
    keys = [problem(workload=f"w{n}") for n in range(10)]
    sources: list[DecisionSource] = []
    lock = threading.Lock()

    def worker(offset: int) -> None:
        for i in range(50):
            n = (i + offset) % len(keys)
            decision = tuner.select(keys[n], C, 0, FakeRunner({1: 0.5}), device=f"lane{n}")
            assert decision.index in (0, 1)
            with lock:
                sources.append(decision.source)

    threads = [Background(lambda o=o: worker(o)) for o in range(8)]
    for t in threads:
        t.result(30)
    stats = tuner.stats()
    assert stats.tunes == len(keys) == sources.count(DecisionSource.TUNED)
    assert stats.memory_hits == sources.count(DecisionSource.MEMORY_CACHE)
    assert stats.busy_fallbacks == sources.count(DecisionSource.BUSY)
    assert len(sources) == 400 and set(sources) <= {DecisionSource.TUNED, DecisionSource.MEMORY_CACHE, DecisionSource.BUSY}


# -- step 2: device failures quarantine the lane --------------------------------------------------------------


def test_a_device_failure_propagates_and_quarantines_the_lane() -> None:
    tuner = tuner_with()
    warm = problem(workload="warm")
    tuner.select(warm, C, 0, FakeRunner({1: 0.5}))
    with pytest.raises(TuneFailure) as info:
        tuner.select(P, C, 0, FakeRunner({1: TuneFailure.device("sync failed")}))
    assert info.value.kind is FailureKind.DEVICE
    assert tuner.stats().device_failures == 1
    assert tuner.quarantined() == {P.environment}
    idle = FakeRunner()
    for prob in (P, warm):  # even a memory hit on the lane is refused
        with pytest.raises(TuneFailure) as later:
            tuner.select(prob, C, 0, idle)
        assert later.value.kind is FailureKind.QUARANTINED
    assert idle.calls == []


def test_a_device_failure_during_reference_validation_also_quarantines() -> None:
    tuner = tuner_with()
    with pytest.raises(TuneFailure) as info:
        tuner.select(P, C, 0, FakeRunner(verdicts={0: TuneFailure.device("lost")}))
    assert info.value.kind is FailureKind.DEVICE
    assert tuner.quarantined() == {P.environment}


def test_quarantine_is_per_lane() -> None:
    tuner = tuner_with()
    with pytest.raises(TuneFailure):
        tuner.select(P, C, 0, FakeRunner({0: TuneFailure.device("lost")}), device="cuda:1")
    assert tuner.quarantined() == {"cuda:1"}
    assert tuner.select(P, C, 0, FakeRunner({1: 0.5}), device="cuda:0").source is DecisionSource.TUNED
    assert tuner.select(problem(environment="env-B"), C, 0, FakeRunner()).source is DecisionSource.TUNED


def test_quarantine_is_checked_before_disabled_mode() -> None:
    tuner = tuner_with()
    with pytest.raises(TuneFailure):
        tuner.select(P, C, 0, FakeRunner({1: TuneFailure.device("lost")}))
    disabled = StackTuner(FAST.replace(mode=Mode.DISABLED))
    assert disabled.select(P, C, 0, FakeRunner()).source is DecisionSource.DISABLED  # another controller
    with pytest.raises(TuneFailure) as info:
        tuner.select(P, C, 0, FakeRunner())
    assert info.value.kind is FailureKind.QUARANTINED
