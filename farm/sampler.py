"""The samplers' shared base: a budgeted walk over a roster's spaces (farm.strategies, farm.localsearch).

Each sampler proposes at most ``max_configs`` positions, each once, never an excluded or infeasible one.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence

from farm.roster import Roster

Exclude = Callable[[int], bool]


def numeric(values: Sequence[object]) -> bool:
    """Whether every value is a number (not a bool): a parameter a model may order."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


class Budgeted:
    """What every sampler shares: the roster, the proposal limit, the proposed set, feasibility checks."""

    name = ""
    adaptive = False

    def __init__(self, roster: Roster, max_configs: int | None, seed: int, exclude: Exclude) -> None:
        self.roster = roster
        self.rng = random.Random(seed)  # the seeded samplers' draws
        self.segments = tuple(roster.spaces())
        self.total = sum(s.size for s in self.segments)
        self.left = self.total if max_configs is None else min(max_configs, self.total)
        self.proposed: set[int] = set()
        self.exclude = exclude
        self._walking: Iterator[int] | None = None

    def usable(self, position: int) -> bool:
        """Not proposed yet, not excluded, and feasible (the candidate is eligible)."""
        return position not in self.proposed and not self.exclude(position) and self.roster[position].eligible

    def walked(self, out: list[int], want: int) -> list[int]:
        """Fill ``out`` up to ``want`` from the walk once one started (a sampler's fallback), and take it."""
        if self._walking is not None:
            out.extend(itertools.islice((p for p in self._walking if p not in out), max(0, want - len(out))))
        return self.take(out)

    def take(self, positions: list[int]) -> list[int]:
        self.proposed.update(positions)
        self.left -= len(positions)
        return positions

    def adopt(self, positions: Sequence[int]) -> None:
        """Configs proposed for this sampler (a prior's): never proposed again, counted against the limit."""
        self.take([p for p in positions if p not in self.proposed])

    def position(self, ordinal: int) -> int:
        """The roster position of the ``ordinal``-th config over all spaces (0 <= ordinal < total)."""
        for segment in self.segments:
            if ordinal < segment.size:
                return segment.start + ordinal
            ordinal -= segment.size
        raise IndexError(ordinal)

    def walk(self, start: int = 0) -> Iterator[int]:
        """Every usable position from ordinal ``start`` on, wrapping around once."""
        for k in range(self.total):
            p = self.position((start + k) % self.total)
            if self.usable(p):
                yield p

    def tell(self, results: Sequence[tuple[int, float | None]]) -> None:
        """Exhaustive and random proposals do not depend on results."""
