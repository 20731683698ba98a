"""Interference measured while a candidate's pairs are timed, reported with every verdict.

A pair is *disturbed* when this process was switched out involuntarily or, on CUDA with NVML, the device
reported a thermal or hardware slowdown; what the controller and the farm do then: docs/decisions.md,
"Interference".
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable, Sequence
from typing import Any

try:
    import resource
except ImportError:  # not on every platform: then switches are simply not counted
    resource = None  # type: ignore[assignment]

# NVML clock-event reasons outside the candidate: HW slowdown, SW and HW thermal, HW power brake (not idle,
# application clocks or power cap).
THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80


def involuntary_switches() -> int:
    """This process's involuntary context switches so far (``getrusage`` ``ru_nivcsw``; 0 where unavailable)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw) if resource is not None else 0


# The counter the probes read; tests/conftest.py pins it so that trials of fake runners stay deterministic.
_switches: Callable[[], int] = involuntary_switches


@dataclasses.dataclass(frozen=True)
class Interference:
    """What disturbed a candidate's pairs (docs/decisions.md, "Interference")."""

    pairs: int = 0
    disturbed: int = 0
    switches: int = 0
    throttled: int = 0
    reference_spread: float = 0.0

    def exceeds(self, limit: float) -> bool:
        """Whether more than ``limit`` (a fraction, the policy's ``max_disturbed``) of the pairs were disturbed."""
        return (self.disturbed / self.pairs if self.pairs else 0.0) > limit

    def describe(self) -> str:
        throttled = f", {self.throttled} throttled" if self.throttled else ""
        return (f"{self.disturbed}/{self.pairs} pairs disturbed ({self.switches} switches{throttled}), "
                f"reference spread {self.reference_spread:.3f}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Interference:
        return cls(int(data["pairs"]), int(data["disturbed"]), int(data["switches"]), int(data.get("throttled", 0)),
                   float(data["reference_spread"]))


class Probe:
    """Watches pairs: call :meth:`begin` before and :meth:`end` after each one. ``throttle`` answers whether
    the device is throttled now; ``host`` False watches no context switches (a simulated device)."""

    def __init__(self, throttle: Callable[[], bool] | None = None, host: bool = True) -> None:
        self.throttle, self.host = throttle, host
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
        return Interference(self.pairs, self.disturbed, self.switches, self.throttled, spread)


def nvml_throttle_probe(client: Any) -> Callable[[], bool] | None:
    """A CUDA client's throttle probe through NVML (``nvidia-ml-py``), memoized per device, or None."""
    return _nvml_probe(int(client.index)) if getattr(client, "device_kind", None) == "cuda" else None


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
