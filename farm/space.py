"""Tuning spaces: one implementation over the cross product of parameter values, never materialized.

A :class:`Space` holds each parameter's values in declaration order. Its configs are numbered by mixed radix
(the first parameter most significant), so the config of a rank, the rank of a config, and a random draw cost
the same for a space of ten configs as for one of a million. Restrictions (safe expressions, see
:mod:`farm.restrict`, or callables taking the parameters as keywords) are applied lazily to the configs a search
looks at. Each config is a candidate named canonically, parameters in declaration order::

    tiled[block=32,unroll=2]

and :meth:`Space.parse` reads such a name back to its config (farm workers resolve candidates by name).
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
from farm.restrict import Value, compile_restriction

Config = dict[str, Value]
Restriction = str | Callable[..., bool]

# A space's size must stay an index Python's len() accepts; 2**53 configs is far above any search.
MAX_SPACE_SIZE = 2**53
_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def format_value(value: Value) -> str:
    """A value as written in a canonical name: ints and floats as Python writes them, True/False, and strings
    bare when they look like a name (``row``), JSON-quoted otherwise (so no two values share a spelling)."""
    if isinstance(value, str):
        return value if _BARE.match(value) and value not in ("True", "False") else json.dumps(value)
    return repr(value)


class Space:
    """One implementation tuned over parameter values; see the module docstring.

    ``params`` maps each parameter name to its values (declaration order is the naming order); ``restrict`` is a
    string expression, a callable ``(**config) -> bool`` or a list of either; a config is feasible when every
    restriction holds. Raises INVALID_INPUT (naming the space and the expression or parameter) for an empty or
    duplicated value list, a value that is not an int, float, bool or str, an invalid expression or an unknown
    name.
    """

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        params: Mapping[str, Sequence[Value]],
        restrict: Restriction | Sequence[Restriction] | None = None,
        *,
        revision: str = "1",
        group: int = 0,
        workspace_bytes: int | None = None,
        eligible: bool = True,
        identity: str = "",
    ) -> None:
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
        self.size = math.prod(len(values) for _, values in self.params)
        if self.size > MAX_SPACE_SIZE:
            raise TuneFailure.invalid(f"{where}: {self.size} configs is above the limit of {MAX_SPACE_SIZE}")
        if restrict is None:
            given: tuple[Restriction, ...] = ()
        elif isinstance(restrict, str) or callable(restrict):
            given = (restrict,)
        elif isinstance(restrict, (list, tuple)):
            given = tuple(restrict)
        else:
            raise TuneFailure.invalid(f"{where}: restriction {restrict!r} is neither an expression nor a callable")
        self.restrictions = given
        self._checks: list[Callable[[Config], bool]] = []
        for r in given:
            if isinstance(r, str):
                self._checks.append(compile_restriction(r, self.names, where))
            elif callable(r):
                self._checks.append(functools.partial(_call_restriction, where, r))
            else:
                raise TuneFailure.invalid(f"{where}: restriction {r!r} is neither an expression nor a callable")

    def __repr__(self) -> str:
        return f"Space({self.descriptor()!r})"

    # -- configs by rank ----------------------------------------------------------------------------------

    def config(self, rank: int) -> Config:
        """The config of ``rank`` (0 <= rank < size), by mixed radix; IndexError outside the space."""
        if not 0 <= rank < self.size:
            raise IndexError(f"rank {rank} is outside space {self.name!r} of {self.size} configs")
        config: Config = {}
        for p, values in reversed(self.params):
            rank, digit = divmod(rank, len(values))
            config[p] = values[digit]
        return {p: config[p] for p in self.names}

    def rank(self, config: Mapping[str, Value]) -> int:
        """The rank of a config of this space; KeyError/ValueError for a parameter or value it lacks."""
        rank = 0
        for (p, values), spelled in zip(self.params, self._spelled, strict=True):
            rank = rank * len(values) + spelled[format_value(config[p])]
        return rank

    def feasible(self, config: Mapping[str, Value]) -> bool:
        """Whether every restriction holds. A restriction that fails to evaluate is INVALID_INPUT (the space's
        author wrote it for every config) naming the space, the expression and the config."""
        try:
            return all(check(dict(config)) for check in self._checks)
        except RestrictionError as e:
            raise TuneFailure.invalid(str(e)) from None

    def feasible_ranks(self, start: int = 0) -> Iterator[int]:
        """Every feasible rank from ``start`` in order, checked lazily as the caller iterates."""
        for rank in range(start, self.size):
            if self.feasible(self.config(rank)):
                yield rank

    # -- names ----------------------------------------------------------------------------------------------

    def config_name(self, config: Mapping[str, Value]) -> str:
        """The canonical candidate name: ``tiled[block=32,unroll=2]``, parameters in declaration order."""
        return f"{self.name}[{','.join(f'{p}={format_value(config[p])}' for p in self.names)}]"

    def parse(self, name: str) -> Config | None:
        """The config a canonical name denotes, or None when it is not a config of this space."""
        if not name.startswith(self.name + "[") or not name.endswith("]"):
            return None
        rest = name[len(self.name) + 1 : -1]
        config: Config = {}
        for index, ((p, values), spelled) in enumerate(zip(self.params, self._spelled, strict=True)):
            prefix = f"{p}="
            if not rest.startswith(prefix):
                return None
            rest = rest[len(prefix):]
            last = index == len(self.params) - 1
            value = rest if last else None
            if value is None:  # the longest spelling followed by a comma (a quoted string may hold commas)
                matches = [s for s in spelled if rest.startswith(s + ",")]
                if not matches:
                    return None
                value = max(matches, key=len)
            if value not in spelled:
                return None
            config[p] = values[spelled[value]]
            rest = rest[len(value) + (0 if last else 1):]
        return config

    # -- identity -------------------------------------------------------------------------------------------

    def restriction_text(self) -> str:
        """The restrictions as the cache key names them: expressions verbatim, callables by their code."""
        return fields([r if isinstance(r, str) else "callable:" + code_text(r) for r in self.restrictions])

    def descriptor(self) -> str:
        """The space as one manifest name: ``tiled[block=16|32,unroll=1|2]`` plus its restriction texts. A
        descriptor above 1 KiB is shortened to a sha256 of itself (names have a byte limit)."""
        lists = ",".join(f"{p}={'|'.join(format_value(v) for v in values)}" for p, values in self.params)
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
        try:
            self.rank(config)
        except (KeyError, ValueError):
            return False
        return True


def _values(where: str, param: str, values: Sequence[Value]) -> tuple[Value, ...]:
    if not isinstance(param, str) or not _PARAM.match(param):
        raise TuneFailure.invalid(f"{where}: parameter name {param!r} is not an identifier")
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise TuneFailure.invalid(f"{where}: parameter {param!r} needs a non-empty list of values, got {values!r}")
    seen: set[str] = set()
    for v in values:
        if not isinstance(v, (int, float, str)) or (isinstance(v, float) and not math.isfinite(v)):
            raise TuneFailure.invalid(f"{where}: parameter {param!r} value {v!r} is not an int, float, bool or str")
        spelled = format_value(v)
        if spelled in seen:
            raise TuneFailure.invalid(f"{where}: parameter {param!r} lists {v!r} twice")
        seen.add(spelled)
    return tuple(values)


def _call_restriction(where: str, restriction: Callable[..., bool], config: Config) -> bool:
    try:
        return bool(restriction(**config))
    except Exception as e:
        raise RestrictionError(f"{where}: restriction {restriction!r} raised {type(e).__name__}: {e}") from None
