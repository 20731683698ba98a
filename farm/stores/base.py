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


def replaces(new: DecisionRecord, old: DecisionRecord | None) -> bool:
    """The replacement rule of every shared tier (Redis, archives): a verified record beats an unverified one;
    otherwise the newer one (by ``created``) wins, ties going to the newcomer. Mirrored in ``publish.lua``."""
    return old is None or outranks(new.verified, new.created, old.verified, old.created)


def outranks(verified: bool, created: float, old_verified: bool, old_created: float) -> bool:
    """:func:`replaces` on the two fields it reads (for publications that carry no record object)."""
    return verified if old_verified != verified else created >= old_created


@dataclass(frozen=True)
class Publication:
    """One decision as the farm publishes it, to Redis or a local cache: the record, its fingerprint text, the
    problem id to index it under ("" for none) and the trial rows behind it. ``text`` and ``trials_text``: the
    record's verified JSON and the rows' JSON when at hand (saves re-encoding). ``fence``: (lease key, value),
    publish only while that lease holds (Redis). ``aliases``: more problem ids for the record's key (a space
    search's family id; Redis indexes them whatever the verdict, a local cache if it accepts the record)."""

    record: DecisionRecord
    fingerprint: str
    problem_id: str = ""
    trials: tuple[dict[str, Any], ...] = ()
    text: str | None = field(default=None, compare=False, repr=False)
    trials_text: str | None = field(default=None, compare=False, repr=False)
    fence: tuple[str, str] | None = None
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
    """``store``'s record for ``cache_key`` of ``environment`` (told only to :class:`FiledByEnvironment` stores)."""
    if isinstance(store, FiledByEnvironment):
        return store.get_in(environment, cache_key)
    return store.get(cache_key)


@dataclass(frozen=True)
class PublicationBatch:
    """Decisions of ONE fingerprint published together, column by column (an archive import's form: no record
    objects are built), one value per decision: ``texts`` the verified :meth:`DecisionRecord.to_json` text,
    ``digests`` the :func:`key_hash` of ``cache_keys``, ``names`` the winner, ``runs`` ``meta.run`` as an
    update event shows it (:func:`event_run`), ``problem_ids`` None or "" for none, ``trials`` the rows' JSON
    ("" for none); ``aliases`` and ``fences`` (empty: none) as in :class:`Publication`."""

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
    aliases: Sequence[tuple[str, ...]] = ()
    fences: Sequence[tuple[str, str] | None] = ()

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
    if value is None or isinstance(value, bool):
        return "true" if value else ""
    if isinstance(value, int | float):
        return f"{float(value):.14g}"  # Lua's number format
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
