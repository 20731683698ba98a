"""Nearest decisions: the workload family of a cache key, the distance between two workloads of one family, and
the in-memory family index (the archives' tier builds one per archive, on its first nearest lookup).

The family, the layouts, the workload forms read and the distance: docs/nearest.md, "The family and the
distance". Index lookups are range scans on the first dimension's ``lead``.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import math
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from farm.decisions import DecisionRecord
from farm.encoding import field_spans, fields

__all__ = [
    "SLACK", "Family", "FamilyIndex", "NearestHit", "NearestQuery", "Workload", "distance", "family_of",
    "dims_text", "hit", "lead", "nearest_first", "parse_workload", "query_of", "rank",
]

_WORKLOAD, _ENVIRONMENT = 4, 3  # adjacent field positions in an encoded cache key (CacheKey.encode)
SLACK = 1e-9  # log2 rounding: 3 and 24 are exactly a factor of 8 apart
_SHAPE = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]")
_ARRAY = re.compile(r"(numpy|cupy):([^()]+)\(([0-9, ]*)\)s\((.*)\)")


class Workload(NamedTuple):
    """A workload split into its family text (dimension values taken out) and its dimensions."""

    family: str
    dims: tuple[int, ...]


def _layout(shape: tuple[int, ...], strides: str) -> str:
    """``C``, ``F`` or the literal strides (also for strides in bytes, not whole elements)."""
    try:
        got = [int(s) for s in strides.replace(" ", "").split(",") if s]
    except ValueError:
        return f"s({strides})"
    n = len(shape)
    for name, order in (("C", range(n - 1, -1, -1)), ("F", range(n))):
        steps = itertools.accumulate((shape[i] for i in order), operator.mul, initial=1)  # contiguous strides
        if len(got) == n and all(shape[i] <= 1 or got[i] == s for i, s in zip(order, steps, strict=False)):
            return name
    return f"s({strides})"


@functools.lru_cache(maxsize=4096)  # a workload recurs across fingerprints, sets and accuracy keys
def parse_workload(workload: str) -> Workload | None:
    """The family text and dimensions of a workload in :func:`~farm.arrays.array_signature`'s form, else in the
    bracketed form (``f32[64,64]``); None for any other form or without dimensions (it has no neighbours)."""
    return _signature(workload) if workload.startswith(("numpy:", "cupy:")) else _bracketed(workload)


def _signature(workload: str) -> Workload | None:
    parts: list[str] = []
    dims: list[int] = []
    for segment in workload.split(";"):
        m = _ARRAY.fullmatch(segment)
        if m is None:
            if segment.startswith(("numpy:", "cupy:")) or "=" not in segment:
                return None  # an array segment not in the expected form, or not a signature at all
            parts.append(segment)  # a scalar parameter: exact
            continue
        module, dtype, shape_text, strides = m.groups()
        shape = tuple(int(s) for s in shape_text.replace(" ", "").split(",") if s)  # _ARRAY: digits only
        parts.append(f"{module}:{dtype}[{len(shape)}]{_layout(shape, strides)}")
        dims.extend(shape)
    return Workload(";".join(parts), tuple(dims)) if dims else None


def _bracketed(workload: str) -> Workload | None:
    """Every ``[d0,d1,...]`` of integers is a shape (kept in the family as ``[#,#]``); the rest is exact."""
    dims: list[int] = []

    def shape(m: re.Match[str]) -> str:
        values = [int(v) for v in m.group(1).split(",")]
        dims.extend(values)
        return "[" + ",".join("#" * len(values)) + "]"

    family = _SHAPE.sub(shape, workload)
    return Workload(family, tuple(dims)) if dims else None


def dims_text(dims: Sequence[int]) -> str:
    """The dimensions as the indexes store them: a compact JSON list."""
    return "[" + ",".join(map(str, dims)) + "]"


def distance(a: Sequence[int], b: Sequence[int]) -> float:
    """The log-scale distance of two workloads' dimensions: the largest ``|log2 a_i - log2 b_i|``; infinite for
    different ranks or a zero dimension against a non-zero one."""
    return rank(a, b)[0]


def _gap(x: int, y: int) -> float:
    if x == y:
        return 0.0
    if x <= 0 or y <= 0:
        return math.inf
    return abs(math.log2(x) - math.log2(y))


def rank(a: Sequence[int], b: Sequence[int]) -> tuple[float, float]:
    """The order neighbours are picked in: (distance, sum of per-dimension distances)."""
    gaps = [_gap(x, y) for x, y in zip(a, b, strict=True)] if len(a) == len(b) else [math.inf]
    return (max(gaps, default=0.0), sum(gaps))


def lead(dims: Sequence[int], at: int = 0) -> float:
    """An indexed coordinate of a workload: log2 of its dimension ``at`` (-1 for a zero, -2 when it has none)."""
    if at >= len(dims):
        return -2.0
    return math.log2(dims[at]) if dims[at] > 0 else -1.0


@dataclass(frozen=True)
class NearestQuery:
    """What a tier is asked: the family (``digest``, sha256 hex of its text), the workload's dimensions and its
    own cache key (never an answer: that one missed)."""

    digest: str
    dims: tuple[int, ...]
    cache_key: str
    environment: str = ""

    def window(self, max_distance: float, at: int = 0) -> tuple[float, float]:
        """The range of ``lead(dims, at)`` values a neighbour within ``max_distance`` can have."""
        here = lead(self.dims, at)
        reach = max_distance + SLACK
        return (here - reach, here + reach) if here >= 0 else (here, here)


class Family(NamedTuple):
    """A cache key's family: its digest, the key's dimensions, workload and environment."""

    digest: str
    dims: tuple[int, ...]
    workload: str
    environment: str


def family_of(cache_key: str) -> Family | None:
    """The family of an encoded cache key; None when its workload has no family or the key cannot be read.
    The digest is the sha256 of ``family:`` and the key with its workload replaced by the family text; only
    the fields up to the workload are split (the publication path)."""
    data = cache_key.encode()
    try:
        spans = list(itertools.islice(field_spans(data, b":"), _WORKLOAD + 1))
    except ValueError:
        return None
    if len(spans) <= _WORKLOAD:
        return None
    (env_start, field_at), (start, end) = spans[_ENVIRONMENT], spans[_WORKLOAD]
    workload = data[start:end].decode()
    if (parsed := parse_workload(workload)) is None:
        return None
    env = data[env_start:field_at].decode()
    digest = hashlib.sha256(b"family:" + data[:field_at] + fields([parsed.family]).encode() + data[end:])
    return Family(digest.hexdigest(), parsed.dims, workload, env)


def query_of(cache_key: str) -> NearestQuery | None:
    """The nearest-decision query of a missed key; None when its workload has no family."""
    found = family_of(cache_key)
    return None if found is None else NearestQuery(found.digest, found.dims, cache_key, found.environment)


@dataclass(frozen=True)
class NearestHit:
    """A tier's answer: a stored record of the family, its workload, and its distance from the query.
    ``order`` sorts answers of several tiers: (distance, sum of per-dimension distances, cache key)."""

    record: DecisionRecord
    workload: str
    order: tuple[float, float, str]

    @property
    def distance(self) -> float:
        return self.order[0]


def hit(record: DecisionRecord, query: NearestQuery, max_distance: float) -> NearestHit | None:
    """A tier's answer for a record its index pointed to: None unless the record's own key is of the query's
    family, another workload, within ``max_distance`` (an index is only a pointer)."""
    found = family_of(record.cache_key)
    if found is None or found.digest != query.digest or found.dims == query.dims:
        return None
    order = rank(query.dims, found.dims)
    if order[0] > max_distance + SLACK:
        return None
    return NearestHit(record, found.workload, (order[0], order[1], record.cache_key))


def nearest_first(hits: Iterable[NearestHit | None]) -> list[NearestHit]:
    """The answers, nearest first."""
    return sorted((h for h in hits if h is not None), key=lambda h: h.order)


@dataclass
class FamilyIndex:
    """An in-memory index: family digest -> entries sorted by ``lead``. An entry is (lead, dims, ref) where ref is
    whatever the owner looks a record up by (an archive's row)."""

    families: dict[str, list[tuple[float, tuple[int, ...], int]]] = field(default_factory=dict)
    _unsorted: set[str] = field(default_factory=set)

    def add(self, digest: str, dims: tuple[int, ...], ref: int) -> None:
        self.families.setdefault(digest, []).append((lead(dims), dims, ref))
        self._unsorted.add(digest)  # sorted on its next lookup: building costs one sort per family

    def near(self, query: NearestQuery, max_distance: float) -> list[tuple[tuple[float, float], int]]:
        """The refs within ``max_distance`` of the query, nearest first, with their rank."""
        entries = self.families.get(query.digest)
        if not entries:
            return []
        if query.digest in self._unsorted:
            entries.sort()
            self._unsorted.discard(query.digest)
        low, high = query.window(max_distance)
        start = bisect.bisect_left(entries, (low,))
        end = bisect.bisect_right(entries, high, lo=start, key=lambda entry: entry[0])
        ranked = ((rank(query.dims, dims), ref) for _, dims, ref in entries[start:end] if dims != query.dims)
        return sorted((order, ref) for order, ref in ranked if order[0] <= max_distance + SLACK)
