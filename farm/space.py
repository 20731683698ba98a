"""Tuning spaces: one implementation over the cross product of parameter values, never materialized.

Configs are numbered by mixed radix (the first parameter most significant) and named canonically,
``tiled[block=32,unroll=2]``; restrictions are checked lazily, per config looked at (docs/spaces.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from farm.codetext import code_text
from farm.errors import RestrictionError, TuneFailure
from farm.identity import Candidate, fields
from farm.keyroster import SpaceShape, mixed_rank, unrank
from farm.restrict import Value, compile_restriction

Config = dict[str, Value]
Restriction = str | Callable[..., bool]

MAX_SPACE_SIZE = 2**53  # an index Python's len() accepts, far above any search
_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def format_value(value: Value) -> str:
    """A value as written in a canonical name: ints and floats as Python writes them, True/False, and strings
    bare when they look like a name (``row``), JSON-quoted otherwise (so no two values share a spelling)."""
    if isinstance(value, str):
        return value if _BARE.match(value) and value not in ("True", "False") else json.dumps(value)
    return repr(value)


class Space:
    """One implementation tuned over parameter values. ``params`` maps each parameter name to its values
    (declaration order is the naming order); ``restrict`` is a string expression (:mod:`farm.restrict`), a
    callable ``(**config) -> bool`` or a list of either, all of which a feasible config meets. Raises
    INVALID_INPUT, naming the space, for a bad name, value list, value or restriction."""

    def __init__(self, name: str, fn: Callable[..., Any], params: Mapping[str, Sequence[Value]],
                 restrict: Restriction | Sequence[Restriction] | None = None, *, revision: str = "1",
                 group: int = 0, workspace_bytes: int | None = None, eligible: bool = True,
                 identity: str = "") -> None:
        where = f"space {name!r}"
        if not isinstance(name, str) or not name or "[" in name:
            raise TuneFailure.invalid(f"{where}: a space needs a non-empty name without '['")
        if not params:
            raise TuneFailure.invalid(f"{where}: a space needs at least one parameter")
        self.name, self.fn, self.revision, self.group = name, fn, revision, group
        self.workspace_bytes, self.eligible, self.identity = workspace_bytes, eligible, identity
        self.params: tuple[tuple[str, tuple[Value, ...]], ...] = tuple(
            (p, _values(where, p, v)) for p, v in params.items()
        )
        self.names = tuple(p for p, _ in self.params)
        self._spelled = tuple({format_value(v): i for i, v in enumerate(values)} for _, values in self.params)
        spellings = tuple(tuple(s) for s in self._spelled)  # each value as config names write it
        self._shape = SpaceShape(name, tuple(zip(self.names, spellings, strict=True)))
        self.size = self._shape.size
        if self.size > MAX_SPACE_SIZE:
            raise TuneFailure.invalid(f"{where}: {self.size} configs is above the limit of {MAX_SPACE_SIZE}")
        given = restrict if isinstance(restrict, (list, tuple)) else () if restrict is None else (restrict,)
        self.restrictions: tuple[Restriction, ...] = tuple(given)
        self._checks: list[Callable[[Config], bool]] = []
        for r in self.restrictions:
            if isinstance(r, str):
                self._checks.append(compile_restriction(r, self.names, where))
            elif callable(r):
                self._checks.append(functools.partial(_call_restriction, where, r))
            else:
                raise TuneFailure.invalid(f"{where}: restriction {r!r} is neither an expression nor a callable")

    def __repr__(self) -> str:
        return f"Space({self.descriptor()!r})"

    def config(self, rank: int) -> Config:
        """The config of ``rank`` (0 <= rank < size), by mixed radix; IndexError outside the space."""
        if not 0 <= rank < self.size:
            raise IndexError(f"rank {rank} is outside space {self.name!r} of {self.size} configs")
        return dict(zip(self.names, unrank(rank, [values for _, values in self.params]), strict=True))

    def rank(self, config: Mapping[str, Value]) -> int:
        """The rank of a config of this space; KeyError/ValueError for a parameter or value it lacks."""
        return mixed_rank((spelled[format_value(config[p])], len(spelled))
                          for p, spelled in zip(self.names, self._spelled, strict=True))

    def feasible(self, config: Mapping[str, Value]) -> bool:
        """Whether every restriction holds; INVALID_INPUT naming space, expression and config if one fails."""
        try:
            return all(check(dict(config)) for check in self._checks)
        except RestrictionError as e:
            raise TuneFailure.invalid(str(e)) from None

    def feasible_ranks(self, start: int = 0) -> Iterator[int]:
        """Every feasible rank from ``start`` in order, checked lazily as the caller iterates."""
        return (rank for rank in range(start, self.size) if self.feasible(self.config(rank)))

    def config_name(self, config: Mapping[str, Value]) -> str:
        """The canonical candidate name: ``tiled[block=32,unroll=2]``, parameters in declaration order."""
        return f"{self.name}[{','.join(f'{p}={format_value(config[p])}' for p in self.names)}]"

    def parse(self, name: str) -> Config | None:
        """The config a canonical name denotes, or None when it is not a config of this space."""
        if (found := self._shape.values_of(name)) is None:
            return None
        pairs = zip(self.params, self._spelled, strict=True)
        return {p: values[spelled[found[p]]] for (p, values), spelled in pairs}

    def restriction_text(self) -> str:
        """The restrictions as the cache key names them: expressions verbatim, callables by their code."""
        return fields([r if isinstance(r, str) else "callable:" + code_text(r) for r in self.restrictions])

    def descriptor(self) -> str:
        """The manifest name: ``tiled[block=16|32,unroll=1|2]`` plus restrictions (a sha256 above 1 KiB)."""
        lists = ",".join(f"{p}={'|'.join(spelled)}" for p, spelled in self._shape.params)
        text = f"{self.name}[{lists}]"
        if self.restrictions:
            text += " where " + " and ".join(r if isinstance(r, str) else f"<callable {i}>"
                                             for i, r in enumerate(self.restrictions))
            text += " #" + hashlib.sha256(self.restriction_text().encode()).hexdigest()[:16]
        if len(text.encode()) > 1024:
            text = f"{self.name}[sha256:{hashlib.sha256(text.encode()).hexdigest()}]"
        return text

    def entry(self) -> Candidate:
        """The space's one entry in a cache key's manifest (its configs are never listed)."""
        return Candidate(self.descriptor(), self.revision, self.workspace_bytes, True)

    def family(self) -> str:
        """What stays when values are added: the name, parameter names, restrictions and code, without value
        lists. Two spaces of one family differ only by their values (an incremental search's precondition)."""
        return fields([self.name, self.revision, ",".join(self.names), self.restriction_text(),
                       code_text(self.fn), self.identity])

    def covers(self, config: Mapping[str, Value]) -> bool:
        """Whether ``config`` (of a space of the same family) is a config of this space."""
        return all(p in config and format_value(config[p]) in spelled
                   for p, spelled in zip(self.names, self._spelled, strict=True))


def _values(where: str, param: str, values: Sequence[Value]) -> tuple[Value, ...]:
    if not isinstance(param, str) or not _PARAM.match(param):
        raise TuneFailure.invalid(f"{where}: parameter name {param!r} is not an identifier")
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise TuneFailure.invalid(f"{where}: parameter {param!r} needs a non-empty list of values, got {values!r}")
    seen: set[str] = set()
    for v in values:
        if not isinstance(v, (int, float, str)) or (isinstance(v, float) and not math.isfinite(v)):
            raise TuneFailure.invalid(f"{where}: parameter {param!r} value {v!r} is not an int, float, bool or str")
        if (spelled := format_value(v)) in seen:
            raise TuneFailure.invalid(f"{where}: parameter {param!r} lists {v!r} twice")
        seen.add(spelled)
    return tuple(values)


def _call_restriction(where: str, restriction: Callable[..., bool], config: Config) -> bool:
    try:
        return bool(restriction(**config))
    except Exception as e:
        raise RestrictionError(f"{where}: restriction {restriction!r} raised {type(e).__name__}: {e}") from None
