"""Interference measured while a candidate's pairs are timed, reported with every verdict.

Per pair the probe notes whether this process was switched out involuntarily (``getrusage`` ``ru_nivcsw``: some
other runnable thread took the core) and, on CUDA with NVML available, whether the device reported a thermal or
hardware slowdown. A pair with either is *disturbed*. The policy's ``max_disturbed`` bounds the fraction of
disturbed pairs behind a win: above it the controller re-measures the candidate once, and the farm publishes such
a winner unconfirmed unless an undisturbed confirmation reproduces it.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

try:
    import resource
except ImportError:  # not on every platform: then switches are simply not counted
    resource = None  # type: ignore[assignment]

# NVML clock-event reasons that slow the device for reasons outside the candidate: HW slowdown, SW thermal,
# HW thermal, HW power brake. Idle, application-clock and power-cap reasons are left out.
THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80


def involuntary_switches() -> int:
    """This process's involuntary context switches so far (``getrusage`` ``ru_nivcsw``; 0 where unavailable)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw) if resource is not None else 0


# The counter the probes read. The test suite pins it (tests/conftest.py): on a shared host the scheduler's
# switches would make trials driven by fake runners nondeterministic.
_switches: Callable[[], int] = involuntary_switches


@dataclass(frozen=True)
class Interference:
    """What disturbed a candidate's pairs: ``disturbed`` of ``pairs`` pairs saw an involuntary context switch
    of the process or a device throttle; ``switches`` counts the switches, ``throttled`` the throttled pairs;
    ``reference_spread`` is the relative MAD of the reference's own times within the pairs."""

    pairs: int = 0
    disturbed: int = 0
    switches: int = 0
    throttled: int = 0
    reference_spread: float = 0.0

    @property
    def fraction(self) -> float:
        """The share of disturbed pairs (0.0 without pairs)."""
        return self.disturbed / self.pairs if self.pairs else 0.0

    def exceeds(self, limit: float) -> bool:
        """Whether more than ``limit`` (a fraction, the policy's ``max_disturbed``) of the pairs were disturbed."""
        return self.fraction > limit

    def describe(self) -> str:
        text = f"{self.disturbed}/{self.pairs} pairs disturbed ({self.switches} switches"
        if self.throttled:
            text += f", {self.throttled} throttled"
        return text + f"), reference spread {self.reference_spread:.3f}"

    def to_dict(self) -> dict[str, Any]:
        return {"pairs": self.pairs, "disturbed": self.disturbed, "switches": self.switches,
                "throttled": self.throttled, "reference_spread": self.reference_spread}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Interference:
        return cls(int(data["pairs"]), int(data["disturbed"]), int(data["switches"]), int(data.get("throttled", 0)),
                   float(data["reference_spread"]))


class Probe:
    """Watches pairs: call :meth:`begin` before and :meth:`end` after each one. ``throttle`` (optional) answers
    whether the device is throttled now; ``host`` False watches no context switches (a simulated device)."""

    def __init__(self, throttle: Callable[[], bool] | None = None, host: bool = True) -> None:
        self.throttle = throttle
        self.host = host  # False for a simulated device (farm.replay): this process's switches do not touch it
        self.pairs = self.disturbed = self.switches = self.throttled = 0
        self._start = 0

    def begin(self) -> None:
        self._start = _switches() if self.host else 0

    def end(self) -> None:
        switched = _switches() - self._start if self.host else 0
        throttled = False
        if self.throttle is not None:
            try:
                throttled = bool(self.throttle())
            except Exception:  # a probe that stops answering must not fail the trial
                self.throttle = None
        self.pairs += 1
        self.switches += switched
        self.throttled += throttled
        self.disturbed += bool(switched or throttled)

    def result(self, reference_times: Sequence[float]) -> Interference:
        spread = 0.0
        if reference_times:
            median = statistics.median(reference_times)
            spread = statistics.median(abs(t / median - 1.0) for t in reference_times)
        return Interference(pairs=self.pairs, disturbed=self.disturbed, switches=self.switches,
                            throttled=self.throttled, reference_spread=spread)


def nvml_throttle_probe(client: Any) -> Callable[[], bool] | None:
    """A throttle probe for a CUDA client through NVML (``pip install nvidia-ml-py``), or None when the client is
    not CUDA or NVML is unavailable. Memoized per device."""
    if getattr(client, "device_kind", None) != "cuda":
        return None
    return _nvml_probe(int(client.index))


@functools.lru_cache(maxsize=64)
def _nvml_probe(index: int) -> Callable[[], bool] | None:
    try:
        import pynvml

        from farm.runtimes.cuda import import_cupy

        pynvml.nvmlInit()
        bus = import_cupy().cuda.runtime.deviceGetPCIBusId(index)
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        reasons(handle)
    except Exception:
        return None
    return lambda: bool(reasons(handle) & THROTTLE_MASK)
