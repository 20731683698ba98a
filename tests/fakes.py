"""Test doubles for the core: a scripted trial runner, a fake clock, and problem/candidate builders."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from farm.arrays import OutputCheck
from farm.engine import Validation
from farm.identity import Candidate, Problem, Scope
from farm.policy import StackPolicy, Tolerance

# A measurement script entry: seconds, an exception to raise, or a callable returning seconds.
Entry = float | BaseException | Callable[[], float]

FAST = StackPolicy(warmups=1, samples=3)
"""A short policy for tests that do not inspect the exact number of trials."""


def problem(**changes: Any) -> Problem:
    """A small valid problem; keyword arguments replace its fields."""
    base = Problem(Scope.OPERATOR, "matmul", "env-A", "f32[64,64]")
    return replace(base, **changes)


def candidates(*names: str, **options: Any) -> tuple[Candidate, ...]:
    """Candidates by name (default: ref, a, b); ``options`` apply to every one."""
    return tuple(Candidate(n, **options) for n in (names or ("ref", "a", "b")))


class FakeRunner:
    """A TrialRunner that records every call in ``calls`` and answers from a script.

    ``times``: candidate index -> an entry (used for every measurement) or a list of entries consumed in order
    (the last one repeats). ``verdicts``: candidate index -> Validation or an exception to raise (default PASSED);
    the reference's self-validation reads the reference's entry. ``on_measure``/``on_validate`` run before each
    answer (to block a trial open, nest a selection, ...). With a ``clock``, each valid measurement advances it.
    It has both optional capabilities of ``farm.runner``, absent (None) unless a test sets them.
    """

    last_check: OutputCheck | None = None
    throttle_probe: Callable[[], bool] | None = None

    def __init__(
        self,
        times: dict[int, Entry | list[Entry]] | None = None,
        verdicts: dict[int, Validation | BaseException] | None = None,
        default: float = 1.0,
        on_measure: Callable[[int], None] | None = None,
        on_validate: Callable[[int, int], None] | None = None,
        clock: FakeClock | None = None,
    ) -> None:
        self.times = dict(times or {})
        self.verdicts = dict(verdicts or {})
        self.default = default
        self.on_measure = on_measure
        self.on_validate = on_validate
        self.clock = clock
        self.calls: list[tuple[Any, ...]] = []
        self._consumed: dict[int, int] = {}

    def validate(self, reference: int, candidate: int, tolerance: Tolerance) -> Validation:
        self.calls.append(("validate", reference, candidate))
        if self.on_validate is not None:
            self.on_validate(reference, candidate)
        verdict = self.verdicts.get(candidate, Validation.PASSED)
        if isinstance(verdict, BaseException):
            raise verdict
        return verdict

    def measure(self, candidate: int) -> float:
        self.calls.append(("measure", candidate))
        if self.on_measure is not None:
            self.on_measure(candidate)
        script = self.times.get(candidate, self.default)
        if isinstance(script, list):
            n = self._consumed.get(candidate, 0)
            self._consumed[candidate] = n + 1
            entry = script[min(n, len(script) - 1)]
        else:
            entry = script
        if isinstance(entry, BaseException):
            raise entry
        value = entry() if callable(entry) else entry
        if self.clock is not None and isinstance(value, float | int) and math.isfinite(value) and value > 0:
            self.clock.advance(value)
        return value

    def measured(self) -> list[int]:
        """The candidate of every measure call, in order."""
        return [c[1] for c in self.calls if c[0] == "measure"]

    def validated(self) -> list[tuple[int, int]]:
        """The (reference, candidate) of every validate call, in order."""
        return [(c[1], c[2]) for c in self.calls if c[0] == "validate"]


class FakeClock:
    """Stands in for the ``time`` module of the engine and trials: wall and monotonic clocks that move only when
    told to."""

    def __init__(self, wall: float = 1_700_000_000.0, mono: float = 1000.0) -> None:
        self.wall = wall
        self.mono = mono

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def perf_counter(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def install_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Replace the clocks that the engine and the trial protocol read with one FakeClock."""
    import farm.engine
    import farm.search
    import farm.trials

    clock = FakeClock()
    monkeypatch.setattr(farm.engine, "time", clock)
    monkeypatch.setattr(farm.search, "time", clock)
    monkeypatch.setattr(farm.trials, "time", clock)
    return clock


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.001)


class Gate:
    """Holds a trial open from inside a runner hook: ``entered`` is set when the hook runs, and the hook returns
    once ``release`` is set (or fails after a deadline, so a broken test never hangs)."""

    def __init__(self, timeout: float = 10.0) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.timeout = timeout

    def __call__(self, *_: object) -> None:
        self.entered.set()
        if not self.release.wait(self.timeout):
            raise AssertionError("gate was never released")
