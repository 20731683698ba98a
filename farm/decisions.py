"""What a selection returns and reports: the decision, its source, the controller's counters and search reports,
and the marker of a running trial (a nested selection gets the reference); the stored record of a decision
(:class:`DecisionRecord`, its canonical JSON and key hash), the one rule for serving a stored one
(:func:`refusal`, :func:`validate_stored`) and the fleet feedback port (:class:`Feedback`).

Types and pure rules only (no controller state): ``farm.engine`` re-exports the selection types.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import threading
from collections.abc import Container, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from farm.errors import CorruptRecord
from farm.identity import Candidate, Problem, fits_workspace
from farm.policy import StackPolicy
from farm.roster import Roster
from farm.runner import TrialRunner, Validation
from farm.trials import CandidateReport, failure_of

SCHEMA_VERSION = 1  # of a DecisionRecord's JSON object


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
    """A NEAREST decision, borrowed (farm.nearest): ``origin`` the workload whose stored decision it is,
    ``origin_key`` that decision's key, ``distance`` the log-scale distance; ``ratio`` is the origin's."""

    origin: str
    distance: float
    origin_key: str

    def __new__(cls, decision: Decision, origin: str, distance: float, origin_key: str) -> NearestDecision:
        self = super().__new__(cls, *decision)
        self.origin, self.distance, self.origin_key = origin, distance, origin_key
        return self


class Request(NamedTuple):
    """A validated selection request with its cache key (built once, reused on every hit)."""

    problem: Problem
    candidates: tuple[Candidate, ...] | Roster  # a Roster: a set with spaces, never materialized
    reference: int
    key: str
    lane: str
    nearest: bool = True  # False: the operation refuses borrowed decisions (TunableSet(nearest=False), farm.borrowing)


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
    # A set with spaces (farm.spacesearch): configs evaluated and declared, what chose them, the configs the
    # decision covers ({space: {param: values}}; None: not all), whether only a grown space's new ones ran.
    evaluated: int = 0
    space_size: int = 0
    strategy: str | None = None
    seed: int | None = None
    max_configs: int | None = None
    covered: dict[str, dict[str, list[Any]]] | None = None
    incremental: bool = False
    # The search's cost: seconds its runs took on the device, and compiling (off it): docs/decisions.md.
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


@dataclass(frozen=True)
class DecisionRecord:
    """A stored decision: which candidate won for one exact cache key, and how sure we are. ``created``: epoch
    seconds (stale past the policy's ttl, or dated in the future). ``meta``: what the farm knows beyond the
    decision (run, provenance, workload spec); the controller ignores it, but the checksum covers it."""

    cache_key: str
    index: int
    reference_index: int
    name: str
    verified: bool
    ratio: float
    created: float
    meta: Mapping[str, Any] = field(default_factory=dict)

    def _body(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, **{name: getattr(self, name) for name in _RECORD_TYPES},
                "meta": dict(self.meta)}

    def to_dict(self) -> dict[str, Any]:
        body = self._body()
        return {**body, "checksum": _checksum(body)}

    def to_json(self) -> str:
        """Canonical JSON with the checksum as the LAST member, so :meth:`from_json` verifies the text itself
        (one sha256, no re-serialization) on the fleet's read path."""
        text = canonical_json(self._body())
        return f'{text[:-1]},"checksum":"{hashlib.sha256(text.encode()).hexdigest()}"}}'

    @classmethod
    def from_json(cls, text: str | bytes, expected_key: str | None = None) -> DecisionRecord:
        """Parse and verify text written by :meth:`to_json` (or any JSON object form: then :meth:`from_dict`)."""
        if isinstance(text, bytes):
            try:
                text = text.decode()
            except UnicodeDecodeError as e:
                raise CorruptRecord(f"record is not UTF-8: {e}") from e
        at = text.rfind(_CHECKSUM_MARK)
        ours = at > 0 and text.endswith('"}') and len(text) - at == len(_CHECKSUM_MARK) + 66
        body = text[:at] + "}" if ours else text
        if ours and hashlib.sha256(body.encode()).hexdigest() != text[at + len(_CHECKSUM_MARK) : -2]:
            raise CorruptRecord("checksum mismatch")
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, RecursionError) as e:
            raise CorruptRecord(f"record is not JSON: {e}") from e
        return cls._build(data, expected_key) if ours else cls.from_dict(data, expected_key)

    @classmethod
    def from_dict(cls, data: Any, expected_key: str | None = None) -> DecisionRecord:
        """Parse and verify a stored record; CorruptRecord says what is wrong with it."""
        body = {k: v for k, v in data.items() if k != "checksum"} if isinstance(data, dict) else None
        if body is not None and data.get("checksum") != _checksum(body):
            raise CorruptRecord("checksum mismatch" if data.get("schema") == SCHEMA_VERSION
                                else f"schema version {data.get('schema')!r} != {SCHEMA_VERSION}")
        return cls._build(data, expected_key)

    @classmethod
    def _build(cls, data: Any, expected_key: str | None) -> DecisionRecord:
        if not isinstance(data, dict):
            raise CorruptRecord(f"record is a {type(data).__name__}, not an object")
        if data.get("schema") != SCHEMA_VERSION:
            raise CorruptRecord(f"schema version {data.get('schema')!r} != {SCHEMA_VERSION}")
        try:
            values = {name: _typed(data, name, kind) for name, kind in _RECORD_TYPES.items()}
            record = cls(**values, meta=_typed(data, "meta", dict) if "meta" in data else {})
        except (KeyError, TypeError, OverflowError) as e:
            raise CorruptRecord(str(e)) from e
        if record.index < 0 or record.reference_index < 0 or not math.isfinite(record.ratio) or record.ratio <= 0:
            raise CorruptRecord(f"out-of-range values in record for {record.name!r}")
        if expected_key is not None and record.cache_key != expected_key:
            raise CorruptRecord("stored cache key differs from the requested one")
        return record

    def is_fresh(self, now: float, ttl: float) -> bool:
        """Within ttl and not dated in the future."""
        return self.created <= now and now - self.created <= ttl


_NUMBER = (int, float)  # read as a float
_RECORD_TYPES: dict[str, type | tuple[type, ...]] = {
    "cache_key": str, "index": int, "reference_index": int, "name": str, "verified": bool, "ratio": _NUMBER,
    "created": _NUMBER}
_CHECKSUM_MARK = ',"checksum":"'


def _typed(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data[name]
    if isinstance(value, bool) and kind is not bool:
        raise TypeError(f"field {name!r} is a bool")
    if not isinstance(value, kind):
        raise TypeError(f"field {name!r} has type {type(value).__name__}")
    return float(data[name]) if kind is _NUMBER else value


def canonical_json(value: Any) -> str:
    """The project's one canonical JSON form (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def key_hash(cache_key: str) -> bytes:
    """The project's one name for a cache key (keys reach 384 KiB): its sha256, the local cache's row key."""
    return hashlib.sha256(cache_key.encode()).digest()


def key_sha256(cache_key: str) -> str:
    """:func:`key_hash` in hex: the Redis hash field and the archive's ``key_sha256`` column of a key."""
    return hashlib.sha256(cache_key.encode()).hexdigest()


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


class Refusal(enum.Enum):
    """Why a stored decision may not be served for a request (:func:`refusal`). ``warns``: the record does not
    belong to this request as it stands (a stale or mismatched record: the controller counts a cache warning)."""

    STALE = "stale"  # older than the policy's ttl, or dated in the future
    MISMATCH = "mismatch"  # another reference, or its winner is not this candidate list's entry of that index
    UNVERIFIED = "unverified"  # unverified while the policy requires validation
    BANNED = "banned"  # this process banned the winner for the key (its live run failed or regressed)
    INELIGIBLE = "ineligible"  # the winner is not eligible, or does not fit the policy's workspace limit

    @property
    def warns(self) -> bool:
        return self in (Refusal.STALE, Refusal.MISMATCH)


def refusal(record: DecisionRecord, key: str, candidates: Sequence[Candidate], reference: int,
            policy: StackPolicy, banned: Container[tuple[str, str]], now: float) -> Refusal | None:
    """May ``record``, stored (or borrowed) for the request ``key`` with ``candidates`` and ``reference``, be
    served? None when it may, else the first that applies (``banned`` holds (key, candidate name) pairs).
    A winner other than the reference is then validated on the live workload (:func:`validate_stored`)."""
    if not record.is_fresh(now, policy.ttl):
        return Refusal.STALE
    if record.reference_index != reference or record.index >= len(candidates):
        return Refusal.MISMATCH
    winner = candidates[record.index]
    if winner.name != record.name:
        return Refusal.MISMATCH
    if not record.verified and policy.require_validation:
        return Refusal.UNVERIFIED
    if (key, record.name) in banned:
        return Refusal.BANNED
    if not winner.eligible or not fits_workspace(winner, policy):
        return Refusal.INELIGIBLE
    return None


def validate_stored(runner: TrialRunner, reference: int, index: int, policy: StackPolicy) -> Validation | None:
    """Validate a stored winner ``index`` against ``reference`` once on the live workload: its verdict when it may
    be served (PASSED; UNSUPPORTED where validation is not required; PASSED at once for the reference itself),
    else None: a miss, never an error. A DEVICE failure and :class:`~farm.errors.DeviceBusy` propagate."""
    if index == reference:
        return Validation.PASSED
    try:
        verdict = runner.validate(reference, index, policy.tolerance)
    except Exception as e:  # a failed check of a stored winner is a miss
        failure_of(e)  # re-raises a busy device and a DEVICE failure
        return None
    if verdict is Validation.PASSED or (verdict is Validation.UNSUPPORTED and not policy.require_validation):
        return verdict
    return None


class Feedback(Protocol):
    """The controller's fleet feedback port (``StackTuner.feedback``; ``farm.feedback.FleetReporter`` is the
    real one): called on a miss the fleet could have served and on a regression, never on a hit. A failing call
    is logged, never an error for the application."""

    def __call__(self, kind: str, cache_key: str, problem: Problem | None, ratios: tuple[float, ...]) -> None:
        """Report ``kind`` ("miss" or "regression") for ``cache_key``; ``ratios``: the tuned ratio of a miss, the
        window's median and the decision's ratio of a regression."""

    def served_nearest(self, cache_key: str, origin: str, distance: float) -> None:
        """Mark the miss of ``cache_key`` (reported next) as served by the nearest decision of ``origin``."""

    def describe(self, problem: Problem, cache_key: str, operation: str, device_kind: str,
                 spec: dict[str, Any] | None) -> None:
        """Say what ``cache_key`` is (the runtime adapter, once per workload it prepares)."""
