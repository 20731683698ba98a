"""The port each decision store implements, what the farm publishes through it, and the replacement rule.

The record itself (:class:`~farm.decisions.DecisionRecord`), ``canonical_json`` and ``key_hash`` are defined in
``farm.decisions`` and re-exported here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from farm.decisions import SCHEMA_VERSION as SCHEMA_VERSION
from farm.decisions import DecisionRecord as DecisionRecord
from farm.decisions import canonical_json as canonical_json
from farm.decisions import key_hash as key_hash
from farm.decisions import key_sha256 as key_sha256
from farm.errors import CorruptRecord as CorruptRecord

# One trial row of a decision (a timing pair or a verdict, with its provenance): a flat JSON object, its fields
# listed by farm.stores.archive.schema.TRIAL_TYPES.
TrialRow = dict[str, str | int | float | bool | None]


def replaces(new: DecisionRecord, old: DecisionRecord | None) -> bool:
    """The replacement rule of every shared tier (Redis, archives): a verified record beats an unverified one;
    otherwise the newer one (by ``created``) wins, ties going to the newcomer. Mirrored in ``publish.lua``."""
    return old is None or outranks(new.verified, new.created, old.verified, old.created)


def outranks(verified: bool, created: float, old_verified: bool, old_created: float) -> bool:
    """:func:`replaces` on the two fields it reads (for publications that carry no record object)."""
    if old_verified != verified:
        return verified
    return created >= old_created


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
    rows ("" for none); ``aliases`` and ``fences``, where given, a :class:`Publication`'s (``fences``: Redis
    only)."""

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
    fences: Sequence[tuple[str, str] | None] = ()  # per decision, the lease that must hold (none: empty)

    @classmethod
    def of(cls, fingerprint: str, publications: Sequence[Publication]) -> PublicationBatch:
        """The batch of publications (all of ``fingerprint``)."""
        records = [p.record for p in publications]
        return cls(fingerprint, [r.cache_key for r in records], [key_hash(r.cache_key) for r in records],
                   [p.json for p in publications], [r.verified for r in records], [r.created for r in records],
                   [r.name for r in records], [event_run(r.meta.get("run")) for r in records],
                   [p.problem_id for p in publications], [p.trials_json for p in publications],
                   [p.aliases for p in publications] if any(p.aliases for p in publications) else (),
                   [p.fence for p in publications] if any(p.fence for p in publications) else ())

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
