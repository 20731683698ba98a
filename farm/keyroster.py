"""A cache key's candidate roster, computed from the key alone (no kernel code).

A decision's ``index`` is a roster position (``farm.roster``): the reference, then each listed candidate and each
space's configs by rank. The key's manifest lists one entry per listed candidate and one *descriptor* per space
(``tiled[block=16|32,unroll=1|2] where ... #hash``), and a descriptor carries the value lists, so the name at any
position is computable by mixed-radix unranking, exactly as ``Space.config_name`` spells it. Archives, reports and
the coordinator check "the winner's name is the roster's name at its index" with :class:`KeyRoster`.

A descriptor shortened to a sha256 (a space whose descriptor is above 1 KiB) hides its value lists: positions from
that space on cannot be named (:meth:`KeyRoster.name` returns None) and the roster's length is unknown.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from farm.roster import _View

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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
        digits: list[str] = []
        for _, values in reversed(self.params):
            rank, digit = divmod(rank, len(values))
            digits.append(values[digit])
        spelled = zip((p for p, _ in self.params), reversed(digits), strict=True)
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
        spelled = self.values_of(name)
        if spelled is None:
            return None
        rank = 0
        for param, values in self.params:
            rank = rank * len(values) + values.index(spelled[param])
        return rank


def parse_descriptor(text: str) -> SpaceShape | None:
    """The shape a space descriptor names, or None when ``text`` is not one (a listed candidate's name)."""
    open_at = text.find("[")
    if open_at <= 0:
        return None
    name, at = text[:open_at], open_at + 1
    params: list[tuple[str, tuple[str, ...]]] = []
    decoder = json.JSONDecoder()
    while True:
        match = _IDENT.match(text, at)
        if match is None or text[match.end():match.end() + 1] != "=":
            return None
        param, at = match.group(), match.end() + 1
        values: list[str] = []
        while True:
            if text.startswith('"', at):
                try:
                    _, end = decoder.raw_decode(text, at)
                except ValueError:
                    return None
            else:
                end = at
                while end < len(text) and text[end] not in "|,]":
                    end += 1
                if end == at:
                    return None
            values.append(text[at:end])
            if end >= len(text):
                return None
            at, sep = end + 1, text[end]
            if sep != "|":
                break
        params.append((param, tuple(values)))
        if sep == "]":
            break
        if sep != ",":
            return None
    rest = text[at:]
    if rest and not rest.startswith(" where "):
        return None
    return SpaceShape(name, tuple(params))


class KeyRoster:
    """The roster positions of a key's manifest entries (their names, in manifest order); see the module."""

    def __init__(self, entries: Sequence[str]) -> None:
        self.entries = tuple(entries)
        self._starts: list[int] = []
        self._shapes: list[SpaceShape | None] = []
        self.sized = True  # False from a hashed descriptor on: positions past it cannot be named
        start = 0
        for entry in self.entries:
            shape = parse_descriptor(entry)
            self._starts.append(start)
            self._shapes.append(shape)
            if shape is None and _HASHED.match(entry):
                self.sized = False
                break
            start += 1 if shape is None else shape.size
        self._length = start
        self.names: Sequence[str] = _View(self, self._named)  # position -> name, IndexError where unnamed

    @classmethod
    def of_key(cls, cache_key: str) -> KeyRoster:
        """The roster of an encoded cache key; ValueError when the key cannot be read."""
        from farm.identity import CacheKey

        return cls([c.name for c in CacheKey.decode(cache_key).candidates])

    def _named(self, position: int) -> str:
        name = self.name(position)
        if name is None:
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
        if shape is None:
            return self.entries[segment]
        return shape.config_name(position - self._starts[segment])

    @property
    def space_size(self) -> int | None:
        """How many configs the key's spaces declare (0 without spaces); None when a descriptor is hashed."""
        if not self.sized:
            return None
        return sum(shape.size for shape in self._shapes if shape is not None)

    def in_space(self, position: int) -> bool:
        """Whether ``position`` is a space's config (not the reference or a listed candidate)."""
        if not self.in_range(position):
            return False
        if position >= self._length:
            return True  # past a hashed descriptor: only spaces are hashed
        return self._shapes[bisect.bisect_right(self._starts, position) - 1] is not None

    def position(self, name: str) -> int | None:
        """The position of the candidate called ``name`` (a listed name or a config's canonical name), or None."""
        for start, shape, entry in zip(self._starts, self._shapes, self.entries, strict=False):
            if shape is None:
                if entry == name:
                    return start
                continue
            rank = shape.rank(name)
            if rank is not None:
                return start + rank
        return None
