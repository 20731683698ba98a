"""The decision-store contract, one set of sentences over every tier: memory, local (SQLite), Redis (a private
redis-server) and Parquet archives (read-only: filled by publishing into a local cache and exporting it with the
archive tools, as ``farm archive export --cache-dir`` does).

Every store reads back what was stored, exactly (``get`` and ``read_record``: the schema version, ``created`` and so
freshness kept), answers a miss for any other key, and keeps each key's record apart from every other key's and
fingerprint's. The shared tiers (local, Redis, archives) apply the replacement rule (``farm.stores.base.replaces``)
to what the farm publishes and answer the fleet-priors lookup (``priors``); the writable ones (memory, local,
Redis) put and delete; a stored record of another schema version is refused as corrupt, naming the version."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from archive_helpers import FP_A, FP_B, key_for, make_record, make_trials

from farm.decisions import SCHEMA_VERSION, DecisionRecord, _checksum, key_hash
from farm.environment import fingerprint_digest
from farm.errors import CorruptRecord, FailureKind, TuneFailure
from farm.identity import fields
from farm.stores.archive import ArchiveStore
from farm.stores.base import Publication, read_record, replaces
from farm.stores.local import FARM, STORE_FILE, LocalStore
from farm.stores.memory import MemoryStore
from farm.stores.redis import RedisDecisions, field_for
from farm_fleet.settings import Settings

FP_C = fields(["host-numpy", "cpu", "model C", "driver 1", "cpython", "build 1", "", "opts"])
FAMILY = "5ca1e" * 6  # a family id across fingerprints is hex (Planner.fleet_family_id)
ANOTHER = "0ff" * 8
KINDS = ["memory", "local", "redis", "archive"]
SHARED = ["local", "redis", "archive"]  # the replacement rule and fleet priors
WRITABLE = ["memory", "local", "redis"]


@dataclass
class Subject:
    """One store under the contract and how the farm fills it. ``fill`` makes publications readable through
    ``store`` by the tier's own write path: ``put`` (memory), ``publish_many`` (local, Redis), or publishing into a
    local cache and exporting it as an archive (archives; ``store`` is then the archive tier over the export)."""

    kind: str
    store: Any
    publish: Callable[[Sequence[Publication]], object]
    exports: int = 0

    def fill(self, *records: DecisionRecord, fingerprint: str = FP_A, aliases: tuple[str, ...] = ()) -> None:
        self.publish([Publication(r, fingerprint, str(r.meta.get("problem_id", "")), tuple(make_trials(r)),
                                  aliases=aliases) for r in records])


@pytest.fixture
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    kind = request.param
    if kind == "memory":
        memory = MemoryStore(64)

        def put(pubs: Sequence[Publication]) -> None:
            for p in pubs:
                memory.put(p.record)

        yield Subject(kind, memory, put)
    elif kind == "local":
        local = LocalStore(tmp_path / "cache", 64)
        yield Subject(kind, local, local.publish_many)
        local.close()
    elif kind == "redis":
        redis = RedisDecisions(client=request.getfixturevalue("redis_db"), settings=Settings(prefix="contract"))
        yield Subject(kind, redis, redis.publish_many)
    else:
        from farm_archives import operations

        source = LocalStore(tmp_path / "source", owner=FARM)
        made = Subject(kind, None, lambda pubs: None)  # its store: the archive tier over the latest export

        def publish(pubs: Sequence[Publication]) -> None:  # a fresh export of everything published so far
            source.publish_many(pubs)
            made.exports += 1
            out = tmp_path / f"archives-{made.exports}"
            operations.export_cache(tmp_path / "source", out)
            made.store = ArchiveStore(out)

        made.publish = publish
        yield made
        source.close()


def over(*kinds: str) -> pytest.MarkDecorator:
    """Run a sentence of the contract over the stores of ``kinds`` (the tiers that hold that part of it)."""
    return pytest.mark.parametrize("subject", kinds, indirect=True)


# -- every store ----------------------------------------------------------------------------------------------


@over(*KINDS)
def test_a_store_reads_back_exactly_what_was_stored_by_key_and_by_environment(subject: Subject) -> None:
    stored = make_record(key_for(FP_A, "n=1"), created=time.time() - 10)
    subject.fill(stored)
    assert subject.store.get(stored.cache_key) == stored
    assert read_record(subject.store, FP_A, stored.cache_key) == stored
    assert subject.store.get(stored.cache_key).to_dict()["schema"] == SCHEMA_VERSION


@over(*KINDS)
def test_a_store_answers_a_miss_for_every_key_it_does_not_hold(subject: Subject) -> None:
    subject.fill(make_record(key_for(FP_A, "n=1")))
    for fingerprint, workload in ((FP_A, "n=2"), (FP_B, "n=1"), (FP_C, "n=7")):
        missing = key_for(fingerprint, workload)
        assert subject.store.get(missing) is None
        assert read_record(subject.store, fingerprint, missing) is None


@over(*KINDS)
def test_keys_of_other_workloads_and_fingerprints_never_see_each_others_records(subject: Subject) -> None:
    a1, a12 = make_record(key_for(FP_A, "n=1"), winner=1), make_record(key_for(FP_A, "n=12"), winner=2)
    b1 = make_record(key_for(FP_B, "n=1"), winner=2, created=2000.0)
    subject.fill(a1, a12)
    subject.fill(b1, fingerprint=FP_B)
    assert [subject.store.get(r.cache_key) for r in (a1, a12, b1)] == [a1, a12, b1]
    assert [read_record(subject.store, fp, r.cache_key) for fp, r in ((FP_A, a1), (FP_A, a12), (FP_B, b1))] == [
        a1, a12, b1]


@over(*KINDS)
def test_a_store_keeps_created_so_freshness_reads_the_same_after_a_round_trip(subject: Subject) -> None:
    now = time.time()
    ages = {"n=1": 10.0, "n=2": 2 * 86400.0, "n=3": -3600.0}  # fresh, expired, dated in the future
    records = [make_record(key_for(FP_A, w), created=now - age) for w, age in ages.items()]
    subject.fill(*records)
    read = [subject.store.get(r.cache_key) for r in records]
    assert [r.created for r in read] == [r.created for r in records]
    assert [r.is_fresh(now, 86400.0) for r in read] == [True, False, False]


# -- the shared tiers: the replacement rule, fleet priors -------------------------------------------------------

# (old, new) as (verified, created), and whether the new one is what the store holds after both
RULE = [
    ((True, 100.0), (False, 200.0), False),  # a verified record beats a newer unverified one
    ((False, 200.0), (True, 100.0), True),
    ((True, 100.0), (True, 200.0), True),  # otherwise the newer wins
    ((True, 200.0), (True, 100.0), False),
    ((False, 100.0), (False, 100.0), True),  # a tie goes to the newcomer
]


@over(*SHARED)
@pytest.mark.parametrize(("old", "new", "replaced"), RULE)
def test_a_shared_tier_keeps_what_the_replacement_rule_picks(subject: Subject, old: tuple[bool, float],
                                                           new: tuple[bool, float], replaced: bool) -> None:
    key = key_for(FP_A, "n=1")
    first = make_record(key, winner=1, verified=old[0], created=old[1])
    second = make_record(key, winner=2, verified=new[0], created=new[1])
    assert replaces(second, first) is replaced
    subject.fill(first)
    subject.fill(second)
    assert subject.store.get(key) == (second if replaced else first)


@over(*SHARED)
def test_a_shared_tier_finds_other_fingerprints_decisions_of_a_family_in_digest_order(subject: Subject) -> None:
    by_fingerprint = {fp: make_record(key_for(fp, "n=1"), winner=1 + i % 2, fleet_family=FAMILY)
                      for i, fp in enumerate((FP_A, FP_B, FP_C))}
    for fp, r in by_fingerprint.items():
        subject.fill(r, fingerprint=fp, aliases=(FAMILY,))
    subject.fill(make_record(key_for(FP_B, "n=2"), fleet_family=ANOTHER), fingerprint=FP_B, aliases=(ANOTHER,))
    others = sorted((fingerprint_digest(fp), r) for fp, r in by_fingerprint.items() if fp != FP_A)
    assert subject.store.priors(FAMILY, fingerprint_digest(FP_A), 5) == others
    assert subject.store.priors(FAMILY, fingerprint_digest(FP_A), 1) == others[:1]
    assert subject.store.priors("0" * 32, fingerprint_digest(FP_A), 5) == []


# -- the writable tiers: put and delete; the archive is read-only --------------------------------------------------


@over(*WRITABLE)
def test_a_writable_store_replaces_a_record_by_a_newer_put_of_the_same_key(subject: Subject) -> None:
    key = key_for(FP_A, "n=1")
    subject.store.put(make_record(key, winner=1, created=100.0))
    newer = make_record(key, winner=2, created=200.0)
    subject.store.put(newer)
    assert subject.store.get(key) == newer


@over(*WRITABLE)
def test_a_writable_store_forgets_a_deleted_record_and_deleting_twice_is_harmless(subject: Subject) -> None:
    kept, gone = make_record(key_for(FP_A, "n=1")), make_record(key_for(FP_A, "n=2"))
    subject.fill(kept, gone)
    subject.store.delete(gone.cache_key)
    subject.store.delete(gone.cache_key)
    assert (subject.store.get(gone.cache_key), subject.store.get(kept.cache_key)) == (None, kept)


@over("archive")
def test_the_archive_tier_refuses_a_put_as_unavailable_and_never_deletes(subject: Subject) -> None:
    stored = make_record(key_for(FP_A, "n=1"))
    subject.fill(stored)
    with pytest.raises(TuneFailure, match="read-only") as raised:
        subject.store.put(make_record(key_for(FP_A, "n=2")))
    assert raised.value.kind is FailureKind.UNAVAILABLE
    subject.store.delete(stored.cache_key)
    assert subject.store.get(stored.cache_key) == stored


# -- schema versions -----------------------------------------------------------------------------------------------


def other_schema(record: DecisionRecord, version: int = SCHEMA_VERSION + 1) -> str:
    """``record``'s text as a farm of another record schema writes it (its checksum intact)."""
    body = {k: v for k, v in record.to_dict().items() if k != "checksum"}
    body["schema"] = version
    return json.dumps({**body, "checksum": _checksum(body)})


def store_text(s: Subject, record: DecisionRecord, text: str) -> None:
    """Put ``text`` where the tier keeps ``record`` (below the store's own checks)."""
    if s.kind == "local":
        with sqlite3.connect(s.store.directory / STORE_FILE) as conn:
            conn.execute("UPDATE decisions SET record = ? WHERE key = ?", (text, key_hash(record.cache_key)))
    else:
        layout = s.store.settings
        s.store.client.hset(layout.decisions_key(fingerprint_digest(FP_A)), field_for(record.cache_key), text)


@over("local", "redis")
def test_a_stored_record_of_another_schema_version_is_corrupt_and_names_the_version(subject: Subject) -> None:
    stored = make_record(key_for(FP_A, "n=1"))
    subject.fill(stored)
    store_text(subject, stored, other_schema(stored))
    for read in (lambda: subject.store.get(stored.cache_key), lambda: read_record(subject.store, FP_A, stored.cache_key)):
        with pytest.raises(CorruptRecord, match=rf"schema version {SCHEMA_VERSION + 1} != {SCHEMA_VERSION}"):
            read()


def test_the_stores_meet_the_port() -> None:
    """Each tier is a DecisionStore (get, put, delete) and the shared ones answer ``priors``."""
    ports: dict[str, type[Any]] = {"memory": MemoryStore, "local": LocalStore, "redis": RedisDecisions,
                                   "archive": ArchiveStore}
    for kind, cls in ports.items():
        assert all(callable(getattr(cls, name, None)) for name in ("get", "put", "delete")), kind
        assert callable(getattr(cls, "priors", None)) is (kind in SHARED), kind
