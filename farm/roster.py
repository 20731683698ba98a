"""The candidate list of a tunable set with spaces: a lazy sequence, never materialized.

Positions are the controller's candidate indices: the reference, then each priority group (its plain
candidates, then each space's configs by rank; an infeasible config is an ineligible candidate).
:attr:`Roster.key_entries` is what a cache key lists: a plain candidate each, one descriptor per space.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from farm.identity import Candidate
from farm.keyroster import _View
from farm.space import Config, Space


@dataclass(frozen=True)
class Segment:
    """A run of positions: a plain candidate (``space`` None) or a space's configs; ``index``: the first's."""

    start: int
    size: int
    index: int
    space: Space | None = None


class Roster(_View[Candidate]):
    """A lazy candidate list; see the module docstring. Built by ``TunableSet.roster()``."""

    def __init__(self, segments: Sequence[Segment], plain: Callable[[int], Any], identity: str) -> None:
        self.segments = tuple(segments)
        self._starts = [s.start for s in self.segments]
        self._plain = plain  # set index -> farm.tunable.Implementation
        self._identity = identity
        self._length = sum(s.size for s in self.segments)
        super().__init__(range(self._length), self._candidate)
        self.key_entries: tuple[Candidate, ...] = tuple(
            s.space.entry() if s.space is not None else plain(s.index).candidate() for s in self.segments)
        self.names: Sequence[str] = _View(self, lambda p: self[p].name)
        self.indices: Sequence[int] = _View(self, self._index)  # position -> the set's implementation index

    def __hash__(self) -> int:
        return hash((self._identity, self.key_entries))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Roster) and (self._identity, self.key_entries) == (other._identity, other.key_entries)

    def _candidate(self, position: int) -> Candidate:
        segment, offset = self.locate(position)
        if (space := segment.space) is None:
            candidate: Candidate = self._plain(segment.index).candidate()
            return candidate
        config = space.config(offset)
        return Candidate(space.config_name(config), space.revision, space.workspace_bytes,
                         space.eligible and space.feasible(config))

    def locate(self, position: int) -> tuple[Segment, int]:
        """The segment holding ``position`` and the offset in it (a space's rank); IndexError outside."""
        if position < 0:
            position += self._length
        if not 0 <= position < self._length:
            raise IndexError(f"candidate position {position} is outside the {self._length} candidates")
        segment = self.segments[bisect.bisect_right(self._starts, position) - 1]
        return segment, position - segment.start

    def _index(self, position: int) -> int:
        segment, offset = self.locate(position)
        return segment.index + offset  # a space config's index is its rank's

    def config(self, position: int) -> Config | None:
        """The space config at ``position``, or None for a plain candidate."""
        segment, offset = self.locate(position)
        return None if segment.space is None else segment.space.config(offset)

    def position(self, name: str) -> int | None:
        """The position of the candidate called ``name`` (a plain name or a config's canonical name), or None."""
        for segment in self.segments:
            if segment.space is None:
                if self._plain(segment.index).name == name:
                    return segment.start
            elif (config := segment.space.parse(name)) is not None:
                return segment.start + segment.space.rank(config)
        return None

    def spaces(self) -> Iterator[Segment]:
        return (s for s in self.segments if s.space is not None)

    @property
    def plain_positions(self) -> list[int]:
        """The positions of the plain candidates, the reference (0) first."""
        return [s.start for s in self.segments if s.space is None]

    @property
    def has_spaces(self) -> bool:
        return any(s.space is not None for s in self.segments)

