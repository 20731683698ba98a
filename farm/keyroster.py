"""A cache key's candidate roster, computed from the key alone (no kernel code).

A space's descriptor carries its value lists, so every roster position (``farm.roster``) can be named, except
from a hashed descriptor on (docs/spaces.md, "A decision's index over a space"). Also the mixed-radix helpers.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import dataclass
from typing import TypeVar, overload

from farm.identity import CacheKey

T = TypeVar("T")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BARE_VALUE = re.compile(r"[^|,\]]+")
_HASHED = re.compile(r"[^\[\]]+\[sha256:[0-9a-f]{64}\]\Z")


@dataclass(frozen=True)
class SpaceShape:
    """A space as its descriptor names it: its name and each parameter's values as spelled in config names."""

    name: str
    params: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def size(self) -> int:
        return math.prod(len(values) for _, values in self.params)

    def config_name(self, rank: int) -> str:
        """The canonical name of the config of ``rank`` (the first parameter most significant)."""
        spelled = zip((p for p, _ in self.params), unrank(rank, [v for _, v in self.params]), strict=True)
        return f"{self.name}[{','.join(f'{p}={v}' for p, v in spelled)}]"

    def values_of(self, name: str) -> dict[str, str] | None:
        """The spelled value of each parameter in a config's canonical name, or None for another name."""
        prefix = self.name + "["
        if not name.startswith(prefix) or not name.endswith("]"):
            return None
        rest, out = name[len(prefix):-1], {}
        for index, (param, values) in enumerate(self.params):
            if not rest.startswith(param + "="):
                return None
            rest = rest[len(param) + 1:]
            last = index == len(self.params) - 1
            matches = [v for v in values if (rest == v if last else rest.startswith(v + ","))]
            if not matches:
                return None
            out[param] = max(matches, key=len)
            rest = rest[len(out[param]) + (0 if last else 1):]
        return out

    def rank(self, name: str) -> int | None:
        """The rank of the config a canonical name denotes, or None for another name."""
        if (spelled := self.values_of(name)) is None:
            return None
        return mixed_rank((values.index(spelled[param]), len(values)) for param, values in self.params)


def unrank(rank: int, lists: Sequence[Sequence[T]]) -> list[T]:
    """The values at ``rank`` of the cross product of ``lists`` (mixed radix, the first most significant)."""
    digits: list[T] = []
    for values in reversed(lists):
        rank, digit = divmod(rank, len(values))
        digits.append(values[digit])
    return digits[::-1]


def mixed_rank(digits: Iterable[tuple[int, int]]) -> int:
    """The inverse of :func:`unrank`: the rank of (index in its list, list length) per list."""
    rank = 0
    for digit, radix in digits:
        rank = rank * radix + digit
    return rank


def parse_descriptor(text: str) -> SpaceShape | None:
    """The shape a space descriptor names, or None when ``text`` is not one (a listed candidate's name)."""
    open_at = text.find("[")
    if open_at <= 0:
        return None
    name, at = text[:open_at], open_at + 1
    params: list[tuple[str, tuple[str, ...]]] = []
    decoder = json.JSONDecoder()
    sep = ","
    while sep == ",":
        match = _IDENT.match(text, at)
        if match is None or text[match.end():match.end() + 1] != "=":
            return None
        param, at = match.group(), match.end() + 1
        values: list[str] = []
        sep = "|"
        while sep == "|":
            if text.startswith('"', at):
                try:
                    end = decoder.raw_decode(text, at)[1]
                except ValueError:
                    return None
            elif (bare := _BARE_VALUE.match(text, at)) is not None:
                end = bare.end()
            else:
                return None
            if end >= len(text):
                return None
            values.append(text[at:end])
            at, sep = end + 1, text[end]
        params.append((param, tuple(values)))
    if sep != "]" or not (at == len(text) or text.startswith(" where ", at)):
        return None
    return SpaceShape(name, tuple(params))


class KeyRoster:
    """The roster positions of a key's manifest entries (their names, in manifest order); see the module."""

    def __init__(self, entries: Sequence[str]) -> None:
        self.entries = tuple(entries)
        self._starts: list[int] = []
        self._shapes: list[SpaceShape | None] = []
        self.sized = True  # False from a hashed descriptor on: positions past it cannot be named
        self._length = 0
        for entry in self.entries:
            shape = parse_descriptor(entry)
            self._starts.append(self._length)
            self._shapes.append(shape)
            if shape is None and _HASHED.match(entry):
                self.sized = False
                break
            self._length += 1 if shape is None else shape.size
        self.names: Sequence[str] = _View(self, self._named)  # position -> name, IndexError where unnamed

    @classmethod
    def of_key(cls, cache_key: str) -> KeyRoster:
        """The roster of an encoded cache key; ValueError when the key cannot be read."""
        return cls([c.name for c in CacheKey.decode(cache_key).candidates])

    def _named(self, position: int) -> str:
        if (name := self.name(position)) is None:
            raise IndexError(f"candidate position {position} lies in a space whose descriptor is hashed")
        return name

    def __len__(self) -> int:
        """The number of positions (when :attr:`sized`; else the positions before the hashed descriptor)."""
        return self._length

    def in_range(self, position: int) -> bool:
        """Whether ``position`` can be a candidate of this key."""
        return position >= 0 and (not self.sized or position < self._length)

    def name(self, position: int) -> str | None:
        """The candidate name at ``position``; None past a hashed descriptor; IndexError outside the roster."""
        if not self.in_range(position):
            raise IndexError(f"candidate position {position} is outside the {self._length} candidates")
        if position >= self._length:
            return None
        segment = bisect.bisect_right(self._starts, position) - 1
        shape = self._shapes[segment]
        return self.entries[segment] if shape is None else shape.config_name(position - self._starts[segment])

    @property
    def space_size(self) -> int | None:
        """How many configs the key's spaces declare (0 without spaces); None when a descriptor is hashed."""
        return sum(shape.size for shape in self._shapes if shape is not None) if self.sized else None

    def in_space(self, position: int) -> bool:
        """Whether ``position`` is a space's config (not the reference or a listed candidate)."""
        segment = bisect.bisect_right(self._starts, position) - 1
        # past a hashed descriptor: only spaces are hashed
        return self.in_range(position) and (position >= self._length or self._shapes[segment] is not None)

    def position(self, name: str) -> int | None:
        """The position of the candidate called ``name`` (a listed name or a config's canonical name), or None."""
        for start, shape, entry in zip(self._starts, self._shapes, self.entries, strict=False):
            if shape is None:
                if entry == name:
                    return start
            elif (rank := shape.rank(name)) is not None:
                return start + rank
        return None


class _View(Sequence[T]):
    """A lazy sequence as long as ``roster``, ``of(position)`` built on demand."""

    def __init__(self, roster: Sized, of: Callable[[int], T]) -> None:
        self._roster, self._of = roster, of

    def __len__(self) -> int:
        return len(self._roster)

    @overload
    def __getitem__(self, position: int) -> T: ...

    @overload
    def __getitem__(self, position: slice) -> Sequence[T]: ...

    def __getitem__(self, position: int | slice) -> T | Sequence[T]:
        if isinstance(position, slice):
            return [self._of(i) for i in range(*position.indices(len(self)))]
        return self._of(position)
