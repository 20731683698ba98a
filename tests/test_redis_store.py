"""The Redis tier against a real redis-server: atomic publication, the replacement rule, the fleet read path."""

from __future__ import annotations

import json

import pytest

from farm.stores.base import DecisionRecord, replaces
from farm.stores.redis import RedisDecisions, field_for
from farm_fleet.settings import Settings

FINGERPRINT = "8:backend16:device-class-text"


def record(key: str = "key-1", *, verified: bool = True, created: float = 100.0, name: str = "fast") -> DecisionRecord:
    from farm.identity import CacheKey, Candidate
    from farm.policy import AccuracyKey, StackPolicy

    full = CacheKey("operator", "op", FINGERPRINT, key, "ctx", 0, (Candidate("ref"), Candidate("cand")),
                    AccuracyKey.of(StackPolicy())).encode()
    return DecisionRecord(full, 1, 0, name, verified, 0.5, created, {"run": f"run-{created}"})


@pytest.fixture
def store(redis_db):
    return RedisDecisions(client=redis_db, settings=Settings(prefix="t"))


def test_a_published_decision_is_read_back_through_the_fleet_path(store):
    r = record()
    assert store.publish(r, FINGERPRINT, "p1") == (True, "new")
    assert store.get(r.cache_key) == r
    assert store.decided(store._digest(r.cache_key), ["p1", "p2"]) == {"p1"}
    assert store.fingerprints() == {store._digest(r.cache_key): FINGERPRINT}


def test_publication_appends_one_event_to_the_stream(store, redis_db):
    store.publish(record(), FINGERPRINT, "p1")
    events = redis_db.xrange("t:events")
    assert len(events) == 1
    assert events[0][1]["winner"] == "fast"
    assert events[0][1]["run"] == "run-100.0"


@pytest.mark.parametrize(
    ("old", "new", "replaced"),
    [
        (dict(verified=True, created=100.0), dict(verified=False, created=200.0), False),
        (dict(verified=False, created=200.0), dict(verified=True, created=100.0), True),
        (dict(verified=True, created=200.0), dict(verified=True, created=100.0), False),
        (dict(verified=True, created=100.0), dict(verified=True, created=200.0), True),
        (dict(verified=False, created=100.0), dict(verified=False, created=100.0), True),
    ],
)
def test_the_server_side_rule_agrees_with_the_python_rule(store, old, new, replaced):
    first = record(name="old", **old)
    second = record(name="new", **new)
    store.publish(first, FINGERPRINT)
    ok, reason = store.publish(second, FINGERPRINT)
    assert ok is replaced, reason
    assert replaces(second, first) is replaced
    assert store.get(first.cache_key).name == ("new" if replaced else "old")


def test_a_kept_record_adds_no_event(store, redis_db):
    store.publish(record(verified=True, name="a"), FINGERPRINT)
    store.publish(record(verified=False, name="b", created=999.0), FINGERPRINT)
    assert len(redis_db.xrange("t:events")) == 1


def test_a_record_with_a_bad_checksum_is_refused_on_read(store, redis_db):
    r = record()
    store.publish(r, FINGERPRINT)
    key = f"t:decisions:{store._digest(r.cache_key)}"
    data = json.loads(redis_db.hget(key, field_for(r.cache_key)))
    data["name"] = "tampered"
    redis_db.hset(key, field_for(r.cache_key), json.dumps(data))
    from farm.stores.base import CorruptRecord

    with pytest.raises(CorruptRecord):
        store.get(r.cache_key)


def test_an_unreachable_server_is_a_miss_and_backs_off():
    from servers import free_port

    store = RedisDecisions(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2, backoff=30.0)
    r = record()
    assert store.get(r.cache_key) is None
    assert store.get(r.cache_key) is None
    assert store.failures == 1  # the second lookup did not try the network again


def test_the_function_is_reloaded_after_a_server_flush(store, redis_db):
    store.publish(record(), FINGERPRINT)
    redis_db.function_flush()
    assert store.publish(record(name="again", created=500.0), FINGERPRINT)[0] is True


def test_a_publications_aliases_index_the_same_record_in_the_same_call(store, tmp_path):
    from farm.stores.base import Publication
    from farm.stores.local import FARM, LocalStore

    r = record()
    local = LocalStore(tmp_path / "cache", owner=FARM)
    for target in (store, local):
        assert target.publish_many([Publication(r, FINGERPRINT, "p1", aliases=("family-1",))]) == [(True, "new")]
        digest = store._digest(r.cache_key)
        assert target.problem_records(digest, ["p1", "family-1", "p2"]) == {"p1": r, "family-1": r}
        # A newer decision of another key under the alias: the alias follows it, the first problem keeps its own.
        newer = record("key-2", created=200.0, name="faster")
        target.publish_many([Publication(newer, FINGERPRINT, "p2", aliases=("family-1",))])
        assert target.problem_records(digest, ["p1", "family-1"]) == {"p1": r, "family-1": newer}
