"""Stores that file decisions by fingerprint are told the environment the caller holds: the Redis and archive
stores then never decode the cache key, the controller tells them on every fleet lookup, and a store without the
capability is still read with ``get``."""

from __future__ import annotations

import time
from pathlib import Path

from fakes import FAST, FakeRunner, candidates, problem

import farm.stores.archive.store as archive_module
import farm.stores.redis as redis_module
import farm_archives
from farm.engine import DecisionSource, StackTuner
from farm.identity import CacheKey, Candidate
from farm.policy import AccuracyKey, StackPolicy
from farm.stores.archive import ArchiveStore
from farm.stores.base import DecisionRecord, FiledByEnvironment, read_record
from farm.stores.memory import MemoryStore
from farm.stores.redis import RedisDecisions
from farm_fleet.settings import Settings

FINGERPRINT = "8:backend16:device-class-text"
PERSISTENT = problem(persistent=True)
C = candidates("ref", "a", "b")


def record(key: str) -> DecisionRecord:
    return DecisionRecord(key, 1, 0, "a", True, 0.5, time.time())


def a_key() -> str:
    return CacheKey("operator", "op", FINGERPRINT, "f32[8]", "ctx", 0, (Candidate("ref"), Candidate("a")),
                    AccuracyKey.of(StackPolicy())).encode()


def never_decoded(key: str) -> str:
    raise AssertionError("the store decoded the cache key to find its environment")


def test_the_redis_store_told_the_environment_never_decodes_the_key(redis_db, monkeypatch) -> None:
    store = RedisDecisions(client=redis_db, settings=Settings(prefix="t"))
    r = record(a_key())
    store.put(r, FINGERPRINT)
    assert store.get(r.cache_key) == r  # the public API still finds the environment itself
    monkeypatch.setattr(redis_module, "key_environment", never_decoded)
    assert store.get_in(FINGERPRINT, r.cache_key) == r
    assert store.get_in("another fingerprint", r.cache_key) is None
    store.delete(r.cache_key, FINGERPRINT)
    assert store.get_in(FINGERPRINT, r.cache_key) is None


def test_the_archive_store_told_the_environment_never_decodes_the_key(tmp_path: Path, monkeypatch) -> None:
    from farm.stores import archive as arc

    r = DecisionRecord(a_key(), 1, 0, "a", True, 0.5, time.time(), {"run": "r1"})
    farm_archives.write_archive(tmp_path, FINGERPRINT, [arc.ArchiveEntry(r, "p1")])
    store = ArchiveStore(tmp_path)
    assert isinstance(store, FiledByEnvironment) and store.get(r.cache_key) == r
    monkeypatch.setattr(archive_module, "key_environment", never_decoded)
    assert store.get_in(FINGERPRINT, r.cache_key) == r
    assert store.get_in("another fingerprint", r.cache_key) is None


def test_a_store_without_the_capability_is_read_with_get() -> None:
    store = MemoryStore(16)
    r = record(a_key())
    store.put(r)
    assert not isinstance(store, FiledByEnvironment)
    assert read_record(store, FINGERPRINT, r.cache_key) == r


class FiledFleet:
    """A fleet tier filed by fingerprint: it answers only through ``get_in`` and records the environments."""

    def __init__(self, stored: DecisionRecord) -> None:
        self.stored = stored
        self.told: list[str] = []

    def get_in(self, environment: str, cache_key: str) -> DecisionRecord | None:
        self.told.append(environment)
        return self.stored if cache_key == self.stored.cache_key else None

    def get(self, cache_key: str) -> DecisionRecord | None:
        raise AssertionError("the controller holds the environment: it must say it")

    def put(self, record: DecisionRecord) -> None:
        raise AssertionError("fleet tiers are read-only for the controller")

    def delete(self, cache_key: str) -> None:
        raise AssertionError("fleet tiers are read-only for the controller")


def test_the_controller_tells_a_filed_fleet_tier_the_problems_environment() -> None:
    key = StackTuner(FAST).request(PERSISTENT, C, 0).key
    fleet = FiledFleet(DecisionRecord(key, 2, 0, "b", True, 0.25, time.time()))
    tuner = StackTuner(FAST, fleet=[fleet])
    decision = tuner.select(PERSISTENT, C, 0, FakeRunner())
    assert (decision.name, decision.source) == ("b", DecisionSource.FLEET_CACHE)
    assert fleet.told == [PERSISTENT.environment]

