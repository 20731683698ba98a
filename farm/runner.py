"""The trial-runner port: what the trial protocol (``farm.trials``, ``farm.search``) and the engine call to run
fenced, exclusive trials of candidates, and the optional capabilities a runner may have.

Runners: ``farm.adapter.RuntimeTrials``, a Celery worker's guarded trials, test fakes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from farm.arrays import OutputCheck
from farm.policy import Tolerance

__all__ = ["ChecksOutputs", "ProbesThrottle", "TrialRunner", "Validation", "output_check", "runner_cost", "throttle_probe"]


class Validation(enum.Enum):
    """A validation verdict. A wrong output is never UNSUPPORTED: it raises a REJECTED failure."""

    PASSED = "passed"
    UNSUPPORTED = "unsupported"


class TrialRunner(Protocol):
    """Runs fenced, exclusive trials of candidates (indices into the candidate list given to ``select``).

    ``validate`` compares a fresh run of ``candidate`` with a fresh run of ``reference``: PASSED, UNSUPPORTED
    (cannot be checked, e.g. readback above ``tolerance.max_bytes``), or raises TuneFailure REJECTED for a wrong
    output or an error, DEVICE for a completion failure. ``measure`` returns completed-work seconds (> 0).
    """

    def validate(self, reference: int, candidate: int, tolerance: Tolerance) -> Validation: ...

    def measure(self, candidate: int) -> float: ...


@runtime_checkable
class ChecksOutputs(Protocol):
    """A runner that keeps the output comparison of its latest ``validate`` (None before the first, and after a
    validation that failed before comparing)."""

    last_check: OutputCheck | None


@runtime_checkable
class ProbesThrottle(Protocol):
    """A runner whose device can say whether it is throttled now (None: it cannot, e.g. no NVML)."""

    throttle_probe: Callable[[], bool] | None


def output_check(runner: TrialRunner) -> OutputCheck | None:
    """The runner's latest output comparison; None without :class:`ChecksOutputs` (no errors are reported)."""
    return runner.last_check if isinstance(runner, ChecksOutputs) else None


def throttle_probe(runner: TrialRunner) -> Callable[[], bool] | None:
    """The runner's throttle probe; None without :class:`ProbesThrottle` (then only switches are watched)."""
    return runner.throttle_probe if isinstance(runner, ProbesThrottle) else None


def runner_cost(runner: TrialRunner) -> tuple[float, float]:
    """The runner's ``device_seconds`` and ``compile_seconds`` so far (0 for a runner that counts none)."""
    return float(getattr(runner, "device_seconds", 0.0)), float(getattr(runner, "compile_seconds", 0.0))
