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
from typing import NamedTuple

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


class Decision(NamedTuple):
    """The candidate to run. ``ratio`` is selected/reference median time (1.0 for the reference)."""

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose: a NamedTuple keeps hits cheap
    reference_index: int
    name: str
    source: DecisionSource
    verified: bool
    ratio: float
    cache_key: str


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
