"""What a selection returns and reports: the decision, its source, the controller's counters and search reports,
and the marker of a running trial (a nested selection gets the reference). The trial-runner port is
``farm.runner``.

Types only (no controller state): ``farm.engine`` re-exports them.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from farm.trials import CandidateReport


class DecisionSource(enum.Enum):
    """Where a decision came from."""

    TUNED = "tuned"
    MEMORY_CACHE = "memory_cache"
    DISK_CACHE = "disk_cache"
    FLEET_CACHE = "fleet_cache"
    CACHE_MISS = "cache_miss"
    DISABLED = "disabled"
    BUSY = "busy"
    NESTED = "nested"
    VALIDATION_UNAVAILABLE = "validation_unavailable"
    NEAREST = "nearest"  # borrowed from the nearest stored workload of the family (``origin``, ``distance``)


class Decision(NamedTuple):
    """The candidate to run. ``ratio`` is selected/reference median time (1.0 for the reference). A NEAREST one
    is a :class:`NearestDecision`."""

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose: a NamedTuple keeps hits cheap
    reference_index: int
    name: str
    source: DecisionSource
    verified: bool
    ratio: float
    cache_key: str


class NearestDecision(Decision):
    """A NEAREST decision, with where it was borrowed from: ``origin`` the workload whose stored decision it is,
    ``origin_key`` that decision's cache key, ``distance`` the log-scale distance between the two workloads
    (farm.nearest). ``ratio`` is the one measured on the origin. The same tuple as any decision."""

    origin: str
    distance: float
    origin_key: str

    def __new__(cls, decision: Decision, origin: str, distance: float, origin_key: str) -> NearestDecision:
        self = super().__new__(cls, *decision)
        self.origin, self.distance, self.origin_key = origin, distance, origin_key
        return self


@dataclass(frozen=True)
class Stats:
    """Counters since the controller was created."""

    memory_hits: int = 0
    disk_hits: int = 0
    fleet_hits: int = 0
    misses: int = 0
    busy_fallbacks: int = 0
    tunes: int = 0
    cache_warnings: int = 0
    invalidations: int = 0
    device_failures: int = 0
    nearest_hits: int = 0  # misses served by a borrowed, validated nearest decision (also counted in misses)
    nearest_refused: int = 0  # borrowed winners that failed their validation on the live workload


@dataclass(frozen=True)
class TuneReport:
    """One search: what was tried, what won, how long it took (seconds), whether the budget ran out."""

    operation: str
    environment: str
    workload: str
    execution_context: str
    winner: str
    elapsed: float
    budget_exhausted: bool
    candidates: tuple[CandidateReport, ...]
    # A set with spaces (farm.spacesearch): the space configs evaluated, how many the spaces declare, the
    # strategy, seed and max_configs that chose them, the configs the decision covers ({space: {param: values}};
    # None: not all of them), and whether only a grown space's new configs were searched.
    evaluated: int = 0
    space_size: int = 0
    strategy: str | None = None
    seed: int | None = None
    max_configs: int | None = None
    covered: dict[str, dict[str, list[Any]]] | None = None
    incremental: bool = False
    # The search's cost: seconds its runs took on the device (validation, warm-ups, timed runs: host CPU time,
    # CUDA events, a replay's simulated clock) and seconds spent compiling the configs it built (off the device).
    device_seconds: float = 0.0
    compile_seconds: float = 0.0
    # Every config a spaced search evaluated with its estimated ratio to the reference, best first (what another
    # SKU's search reads as a prior: farm.priors), and the priors it was given (their fingerprints).
    estimates: tuple[tuple[str, float], ...] = ()
    priors: tuple[str, ...] = ()


_depth = threading.local()


def is_tuning() -> bool:
    """Whether the calling thread is inside a trial (a nested selection then gets the reference)."""
    return getattr(_depth, "value", 0) > 0


@contextmanager
def tuning_scope() -> Iterator[None]:
    """Mark the calling thread as running a trial for the duration of the block."""
    _depth.value = getattr(_depth, "value", 0) + 1
    try:
        yield
    finally:
        _depth.value -= 1
