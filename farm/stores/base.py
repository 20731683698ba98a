"""The record every decision store keeps, and the port each store implements."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

from farm.errors import CorruptRecord

SCHEMA_VERSION = 1

# One trial row of a decision (a timing pair or a verdict, with its provenance): a flat JSON object, its fields
# listed by farm.stores.archive.schema.TRIAL_TYPES.
TrialRow = dict[str, str | int | float | bool | None]


@dataclass(frozen=True)
class DecisionRecord:
    """A stored decision: which candidate won for one exact cache key, and how sure we are.

    ``created`` is seconds since the epoch; records older than the policy's ttl, or dated in the future, are stale.
    ``meta`` carries what the farm knows beyond the decision (run, provenance, operation, workload spec); the
    controller ignores it, but it is covered by the checksum like every other field.
    """

    cache_key: str
    index: int
    reference_index: int
    name: str
    verified: bool
    ratio: float
    created: float
    meta: Mapping[str, Any] = field(default_factory=dict)

    def _body(self) -> dict[str, Any]:
        # The fields as they are, ``meta`` as a plain dict: a shallow copy (``asdict`` deep-copied ``meta`` and its
        # candidates on every publication only to replace it).
        body: dict[str, Any] = {"schema": SCHEMA_VERSION}
        for name in _RECORD_FIELDS:
            body[name] = getattr(self, name)
        body["meta"] = dict(self.meta)
        return body

    def to_dict(self) -> dict[str, Any]:
        body = self._body()
        body["checksum"] = _checksum(body)
        return body

    def to_json(self) -> str:
        """Canonical JSON with the checksum as the LAST member, so :meth:`from_json` verifies the text itself
        (one sha256, no re-serialization) on the fleet's read path."""
        text = _canonical(self._body())
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
        if at > 0 and text.endswith('"}') and len(text) - at == len(_CHECKSUM_MARK) + 66:
            body = text[:at] + "}"
            if hashlib.sha256(body.encode()).hexdigest() != text[at + len(_CHECKSUM_MARK) : -2]:
                raise CorruptRecord("checksum mismatch")
            try:
                data = json.loads(body)
            except (json.JSONDecodeError, RecursionError) as e:
                raise CorruptRecord(f"record is not JSON: {e}") from e
            return cls._build(data, expected_key)
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise CorruptRecord(f"record is not JSON: {e}") from e
        return cls.from_dict(data, expected_key)

    @classmethod
    def from_dict(cls, data: Any, expected_key: str | None = None) -> DecisionRecord:
        """Parse and verify a stored record; CorruptRecord says what is wrong with it."""
        if not isinstance(data, dict):
            raise CorruptRecord(f"record is a {type(data).__name__}, not an object")
        body = {k: v for k, v in data.items() if k != "checksum"}
        if data.get("checksum") != _checksum(body):
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
            record = cls(
                cache_key=_typed(data, "cache_key", str),
                index=_typed(data, "index", int),
                reference_index=_typed(data, "reference_index", int),
                name=_typed(data, "name", str),
                verified=_typed(data, "verified", bool),
                ratio=float(_typed(data, "ratio", (int, float))),
                created=float(_typed(data, "created", (int, float))),
                meta=_typed(data, "meta", dict) if "meta" in data else {},
            )
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


_RECORD_FIELDS = tuple(f.name for f in fields(DecisionRecord))


def replaces(new: DecisionRecord, old: DecisionRecord | None) -> bool:
    """The replacement rule of every shared tier (Redis, archives): a verified record beats an unverified one;
    otherwise the newer one (by ``created``) wins, ties going to the newcomer. Mirrored in ``publish.lua``."""
    return old is None or outranks(new.verified, new.created, old.verified, old.created)


def outranks(verified: bool, created: float, old_verified: bool, old_created: float) -> bool:
    """:func:`replaces` on the two fields it reads (for publications that carry no record object)."""
    if old_verified != verified:
        return verified
    return created >= old_created


def _typed(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data[name]
    if isinstance(value, bool) and kind is not bool:
        raise TypeError(f"field {name!r} is a bool")
    if not isinstance(value, kind):
        raise TypeError(f"field {name!r} has type {type(value).__name__}")
    return value


_CHECKSUM_MARK = ',"checksum":"'


def canonical_json(value: Any) -> str:
    """The project's one canonical JSON form (sorted keys, no spaces): record checksums, spec identities,
    archive columns."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


_canonical = canonical_json


def key_hash(cache_key: str) -> bytes:
    """The project's one name for a cache key (keys reach 384 KiB): its sha256. The local cache keys rows by
    these bytes; Redis fields and archive rows by their hex form, :func:`key_sha256`."""
    return hashlib.sha256(cache_key.encode()).digest()


def key_sha256(cache_key: str) -> str:
    """:func:`key_hash` in hex: the Redis hash field and the archive's ``key_sha256`` column of a key."""
    return hashlib.sha256(cache_key.encode()).hexdigest()


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


@dataclass(frozen=True)
class Publication:
    """One decision as the farm publishes it, to Redis or a local cache: the record, its fingerprint text, the
    problem id to index it under ("" for none), the trial rows behind it and the lease that fences it. ``text``: the record's verified
    :meth:`DecisionRecord.to_json` text when it is at hand (saves re-encoding); ``trials_text``: the rows' JSON.
    ``aliases``: more problem ids the problem index maps to the record's key in the same transaction (a space
    search's family id, ``farm_coordinator.plan``; Redis indexes them whatever the verdict, a local cache only
    with an accepted publication: either way the id points at whatever record the key holds)."""

    record: DecisionRecord
    fingerprint: str
    problem_id: str = ""
    trials: tuple[dict[str, Any], ...] = ()
    text: str | None = field(default=None, compare=False, repr=False)
    trials_text: str | None = field(default=None, compare=False, repr=False)
    fence: tuple[str, str] | None = None  # (lease key, value): publish only while that lease holds (Redis)
    aliases: tuple[str, ...] = ()

    @property
    def json(self) -> str:
        return self.text if self.text is not None else self.record.to_json()

    @property
    def trials_json(self) -> str:
        """The trial rows as compact JSON ("" when there are none)."""
        if self.trials_text is not None:
            return self.trials_text
        return json.dumps(list(self.trials), separators=(",", ":")) if self.trials else ""


class DecisionStore(Protocol):
    """A tier of decisions keyed by the full cache key. ``get`` raises CorruptRecord for a bad record."""

    def get(self, cache_key: str) -> DecisionRecord | None: ...

    def put(self, record: DecisionRecord) -> None: ...

    def delete(self, cache_key: str) -> None: ...


@runtime_checkable
class FiledByEnvironment(Protocol):
    """A store that files records under the environment (fingerprint) their key names (Redis, archives): told the
    environment, which the caller holds, ``get_in`` finds the record without decoding the key."""

    def get_in(self, environment: str, cache_key: str) -> DecisionRecord | None: ...


def read_record(store: DecisionStore, environment: str, cache_key: str) -> DecisionRecord | None:
    """``store``'s record for ``cache_key``, whose environment is ``environment`` (:class:`FiledByEnvironment`
    stores are told it; any other store is asked with ``get``)."""
    if isinstance(store, FiledByEnvironment):
        return store.get_in(environment, cache_key)
    return store.get(cache_key)


@dataclass(frozen=True)
class PublicationBatch:
    """Decisions of ONE fingerprint published together, column by column (an archive import's form: no record
    objects are built). Every sequence holds one value per decision: ``texts`` the :meth:`DecisionRecord.to_json`
    text (already verified), ``cache_keys`` and ``digests`` its key and the key's :func:`key_hash`, ``verified``,
    ``created`` and ``names`` (the winner) its fields, ``runs`` its ``meta.run`` as an update event shows it,
    ``problem_ids`` the problem id to index it under (None or "" for none), ``trials`` the JSON list of its trial
    rows ("" for none)."""

    fingerprint: str
    cache_keys: Sequence[str]
    digests: Sequence[bytes]
    texts: Sequence[str]
    verified: Sequence[bool]
    created: Sequence[float]
    names: Sequence[str]
    runs: Sequence[str]
    problem_ids: Sequence[str | None]
    trials: Sequence[str]
    aliases: Sequence[tuple[str, ...]] = ()  # per decision, more problem ids to index it under (none: empty)

    @classmethod
    def of(cls, fingerprint: str, publications: Sequence[Publication]) -> PublicationBatch:
        """The batch of publications (all of ``fingerprint``; fences are not carried)."""
        records = [p.record for p in publications]
        return cls(fingerprint, [r.cache_key for r in records], [key_hash(r.cache_key) for r in records],
                   [p.json for p in publications], [r.verified for r in records], [r.created for r in records],
                   [r.name for r in records], [event_run(r.meta.get("run")) for r in records],
                   [p.problem_id for p in publications], [p.trials_json for p in publications],
                   [p.aliases for p in publications] if any(p.aliases for p in publications) else ())

    def __len__(self) -> int:
        return len(self.texts)


def event_run(value: Any) -> str:
    """``meta.run`` as a Redis update event shows it (``tostring(meta['run'] or '')`` in publish.lua)."""
    if isinstance(value, str):
        return value
    if value is None or value is False:
        return ""
    if value is True:
        return "true"
    if isinstance(value, int | float):
        return f"{float(value):.14g}"  # Lua's number format
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
