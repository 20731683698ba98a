"""Harvesting: what processes tuned themselves is reported to the fleet as a miss the farm should tune.

:func:`harvest` sets ``triton.knobs.autotuning.listener``, which Triton calls after its own autotuning chose a
config (never on a launch whose config is cached, nor on the farm's decisions: one pruned config is not tuned).
Triton 3.8 calls it on a GPU only: under ``TRITON_INTERPRET=1`` its listener call fails to find the
``JITFunction`` (the interpreter has none).
The listener only queues a report (the fleet reporter sends it from its own thread), so it adds nothing to a
launch and little to the benchmark it follows.
"""

from __future__ import annotations

import logging
from typing import Any

from farm_triton.decisions import Found, current
from farm_triton.deps import import_triton
from farm_triton.registry import Kernel, named

log = logging.getLogger("farm_triton")


class Listener:
    """Triton's ``AutotuneListener``: reports a self-tuned (function, key) as a miss; calls ``previous`` too."""

    def __init__(self, previous: Any = None) -> None:
        self.previous = previous
        self.reported = 0

    def __call__(self, *, fn: Any, key: tuple[Any, ...], best_config: Any, configs_timings: dict[Any, Any],
                 duration: float | None, cache_hit: bool) -> None:
        try:
            if not cache_hit:
                self._report(fn, tuple(key), configs_timings)
        except Exception as e:  # harvesting never fails the application's launch
            log.debug("farm_triton: self-tuned kernel not reported: %s", e)
        if self.previous is not None:
            self.previous(fn=fn, key=key, best_config=best_config, configs_timings=configs_timings,
                          duration=duration, cache_hit=cache_hit)

    def _report(self, fn: Any, key: tuple[Any, ...], timings: dict[Any, Any]) -> None:
        decisions = current()
        kernel = named(fn)
        if kernel is None:  # a kernel no hook named: its own name and the configs it tried
            base = getattr(fn, "fn", fn)
            kernel = Kernel(getattr(base, "__name__", "triton_kernel"), fn, tuple(timings), (), tuple(fn.arg_names))
        problem = decisions.problem_for_key(kernel, key)
        decisions.report_miss(kernel, Found(None, decisions.key_of(problem, kernel), problem, "harvest"), None, key)
        self.reported += 1


def harvest() -> Listener:
    """Install the listener (once; a listener already set is kept and called after it). Reports go to the
    ``report_to`` of :func:`farm_triton.configure`."""
    triton = import_triton()
    existing = triton.knobs.autotuning.listener
    if isinstance(existing, Listener):
        return existing
    listener = Listener(existing)
    triton.knobs.autotuning.listener = listener
    return listener
