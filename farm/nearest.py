"""Nearest decisions: the workload family of a cache key, the distance between two workloads of one family, and
the in-memory family index (the archives' tier builds one per archive, on its first nearest lookup).

A decision is exact: its key holds the workload's exact dtype, shapes and strides. A miss may still borrow the
decision of a NEAR workload (``farm.borrowing``), one that differs from it only in dimension values. The **workload
family** of a key is the key with the workload's dimension values taken out: the same key version, scope,
operation, fingerprint, execution context, reference, candidate manifest and accuracy key, and a workload with the
same arguments in the same order, each array with the same array module, dtype, rank and layout, each scalar
parameter with the same type and value. Its **dimensions** are the shape values of every array argument, in order.

Layout: an array is ``C`` when its strides are those of a C-contiguous array of its shape, ``F`` when they are a
Fortran-ordered one's (strides of dimensions of size 0 or 1 are ignored, as NumPy does); any other layout keeps
its literal strides in the family, so only arrays with exactly those strides are near.

Workloads are read in :func:`farm.arrays.array_signature`'s form (every built-in operation's), or else in a
bracketed form where every ``[d0,d1,...]`` of integers is a shape and all other text is exact (``f32[64,64]``:
family ``f32[#,#]``, dimensions 64 and 64). A workload of any other form, or without a shape, has
no family: it is never near another, and a miss for it goes on as before.

**Distance** (log-scale, per dimension): ``distance(a, b) = max_i |log2 a_i - log2 b_i|``; a zero dimension is
near only another zero (any other is infinitely far). A distance of 3 means "within a factor of 8 in every
dimension" (``StackPolicy.max_distance``, default 3.0). Among the stored workloads of a family within
``max_distance``, the nearest is the one with the smallest distance, then the smallest sum of per-dimension
distances, then the smaller cache key text (deterministic).

Index lookups are range scans on the first dimension's ``lead`` (``log2`` of it; -1 for a zero) within
``max_distance`` of the query's: an index answers without reading the other workloads of the family (the local
cache also filters on the second dimension's in SQL).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from farm.decisions import DecisionRecord
from farm.encoding import fields

__all__ = [
    "SLACK", "Family", "FamilyIndex", "NearestHit", "NearestQuery", "Workload", "distance", "family_of",
    "dims_text", "hit", "lead", "nearest_first", "parse_workload", "query_of", "rank",
]

_WORKLOAD, _ENVIRONMENT = 4, 3  # field positions in an encoded cache key (CacheKey.encode)
SLACK = 1e-9  # log2 rounding: 3 and 24 are exactly a factor of 8 apart
_SHAPE = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]")
_ARRAY = re.compile(r"(numpy|cupy):([^()]+)\(([0-9, ]*)\)s\((.*)\)")


class Workload(NamedTuple):
    """A workload split into its family text (dimension values taken out) and its dimensions."""

    family: str
    dims: tuple[int, ...]


def _layout(shape: tuple[int, ...], strides: str) -> str:
    try:
        values = tuple(int(s) for s in strides.replace(" ", "").split(",") if s)
    except ValueError:
        return f"s({strides})"  # strides in bytes (not whole elements): literal
    if len(values) != len(shape):
        return f"s({strides})"
    if _contiguous(shape, values, reversed(range(len(shape)))):
        return "C"
    if _contiguous(shape, values, range(len(shape))):
        return "F"
    return f"s({strides})"


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...], order: Iterable[int]) -> bool:
    step = 1
    for i in order:
        if shape[i] > 1 and strides[i] != step:
            return False
        step *= shape[i]
    return True


@functools.lru_cache(maxsize=4096)  # a workload recurs across fingerprints, sets and accuracy keys
def parse_workload(workload: str) -> Workload | None:
    """The family text and dimensions of a workload in :func:`~farm.arrays.array_signature`'s form, else in the
    bracketed form (``f32[64,64]``); None for a workload of any other form or without dimensions (it has no
    neighbours)."""
    if workload.startswith(("numpy:", "cupy:")):
        return _signature(workload)
    return _bracketed(workload)


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
        try:
            shape = tuple(int(s) for s in shape_text.replace(" ", "").split(",") if s)
        except ValueError:
            return None
        parts.append(f"{module}:{dtype}[{len(shape)}]{_layout(shape, strides)}")
        dims.extend(shape)
    if not dims:
        return None
    return Workload(";".join(parts), tuple(dims))


def _bracketed(workload: str) -> Workload | None:
    """The bracketed form: every ``[d0,d1,...]`` of integers is a shape (its values the dimensions, its rank kept
    in the family as ``[#,#]``); all other text (dtypes, parameters, layouts) is exact."""
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
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        worst = max(worst, _gap(x, y))
    return worst


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

    @property
    def lead(self) -> float:
        return lead(self.dims)

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

    On the publication path (every decision published is indexed), so the key is not split whole: only the
    length prefixes up to its workload field are read (the order :meth:`CacheKey.encode` writes: version, scope,
    operation, environment, workload), and the digest is the sha256 of the key with that field's text replaced by
    the family's, byte for byte as the whole key re-encoded would be."""
    data = cache_key.encode()
    spans = []
    at = 0
    for _ in range(_WORKLOAD + 1):
        colon = data.find(b":", at)
        if colon < 0 or not data[at:colon].isdigit():
            return None
        start = colon + 1
        end = start + int(data[at:colon])
        if end > len(data):
            return None
        spans.append((at, start, end))
        at = end
    field_at, start, end = spans[_WORKLOAD]
    workload = data[start:end].decode()
    parsed = parse_workload(workload)
    if parsed is None:
        return None
    env = data[spans[_ENVIRONMENT][1] : spans[_ENVIRONMENT][2]].decode()
    digest = hashlib.sha256(b"family:" + data[:field_at] + fields([parsed.family]).encode() + data[end:])
    return Family(digest.hexdigest(), parsed.dims, workload, env)


def query_of(cache_key: str) -> NearestQuery | None:
    """The nearest-decision query of a missed key; None when its workload has no family."""
    found = family_of(cache_key)
    if found is None:
        return None
    return NearestQuery(found.digest, found.dims, cache_key, found.environment)


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
    """The answer a tier gives for a stored record it found through its index: None unless the record's own key
    is of the query's family, another workload, within ``max_distance`` (an index is only a pointer: the record
    is what is checked)."""
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
        at = bisect.bisect_left(entries, (low,))
        found = []
        while at < len(entries) and entries[at][0] <= high:
            _, dims, ref = entries[at]
            order = rank(query.dims, dims)
            if order[0] <= max_distance + SLACK and dims != query.dims:
                found.append((order, ref))
            at += 1
        found.sort()
        return found

    def __len__(self) -> int:
        return sum(len(v) for v in self.families.values())
