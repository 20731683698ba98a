"""Nearest decisions through Redis (issue 27), against a real redis-server: the per-family index written in the
publication's transaction, a lookup in two round trips, and the fleet report of a miss served nearest."""

from __future__ import annotations

import json
from typing import Any

from fakes import FAST, FakeRunner, candidates
from test_nearest import ENV, key_of, record, square

from farm.engine import DecisionSource, StackTuner
from farm.feedback import FleetReporter, stream_key
from farm.nearest import query_of
from farm.policy import Mode
from farm.stores.base import Publication, PublicationBatch
from farm.stores.redis import RedisDecisions
from farm_fleet.settings import Settings

C = candidates("ref", "a", "b")


class CountingClient:
    """A redis-py client that counts the commands sent through it (each one is a round trip)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.commands: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self.commands.append(name)
            return attribute(*args, **kwargs)

        return call


def test_a_published_decision_is_found_nearest_in_two_round_trips(redis_db) -> None:
    writer = RedisDecisions(client=redis_db, settings=Settings(prefix="t"))
    for n in (16, 64, 100, 4096):
        writer.publish(record(key_of(square(n)), created=1000.0 + n), ENV)
    counting = CountingClient(redis_db)
    reader = RedisDecisions(client=counting, settings=Settings(prefix="t"))
    hits = reader.nearest(query_of(key_of(square(70))), 3.0)
    assert [h.workload for h in hits] == [square(64).workload, square(100).workload, square(16).workload]
    assert counting.commands == ["fcall_ro", "hmget"]  # ranked on the server, then the records


def test_without_the_function_the_members_are_ranked_client_side_in_two_round_trips(redis_db) -> None:
    writer = RedisDecisions(client=redis_db, settings=Settings(prefix="t"))
    for n in (16, 64, 100, 4096):
        writer.publish(record(key_of(square(n))), ENV)
    redis_db.function_flush()
    counting = CountingClient(redis_db)
    reader = RedisDecisions(client=counting, settings=Settings(prefix="t"))
    query = query_of(key_of(square(70)))
    assert [h.workload for h in reader.nearest(query, 3.0)] == [square(64).workload, square(100).workload,
                                                                 square(16).workload]
    counting.commands.clear()
    assert [h.workload for h in reader.nearest(query, 3.0)][0] == square(64).workload
    assert counting.commands == ["zrangebyscore", "hmget"]  # the missing function is not asked again


def test_a_deleted_decision_is_no_longer_an_answer(redis_db) -> None:
    store = RedisDecisions(client=redis_db, settings=Settings(prefix="t"))
    store.publish(record(key_of(square(64))), ENV)
    store.publish(record(key_of(square(32))), ENV)
    store.delete(key_of(square(64)))
    assert [h.workload for h in store.nearest(query_of(key_of(square(60))), 3.0)] == [square(32).workload]


def test_an_archive_import_into_redis_indexes_its_decisions_in_its_transaction(redis_db) -> None:
    store = RedisDecisions(client=redis_db, settings=Settings(prefix="t"))
    pubs = [Publication(record(key_of(square(n))), ENV) for n in (24, 48, 96)]
    store.publish_batch(PublicationBatch.of(ENV, pubs))
    assert [h.workload for h in store.nearest(query_of(key_of(square(50))), 3.0)] == [
        square(48).workload, square(96).workload, square(24).workload]


def test_decisions_published_before_the_index_are_indexed_by_index_nearest(redis_db) -> None:
    store = RedisDecisions(client=redis_db, settings=Settings(prefix="t"))
    store.publish(record(key_of(square(64))), ENV)
    for key in redis_db.keys("t:nearest:*"):
        redis_db.delete(key)
    assert store.nearest(query_of(key_of(square(60))), 3.0) == []
    assert store.index_nearest() == 1
    assert [h.workload for h in store.nearest(query_of(key_of(square(60))), 3.0)] == [square(64).workload]


def test_a_miss_served_nearest_from_redis_is_still_reported_marked_served_nearest(redis_srv, redis_db) -> None:
    RedisDecisions(client=redis_db, settings=Settings(prefix="nt")).publish(record(key_of(square(64))), ENV)
    fleet = RedisDecisions(client=redis_db, settings=Settings(prefix="nt"))
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), fleet=[fleet])
    reporter = FleetReporter(redis_srv.url(1), prefix="nt", interval=0.0)
    tuner.feedback = reporter
    try:
        decision = tuner.select(square(128), C, 0, FakeRunner())
        assert decision.source is DecisionSource.NEAREST
        assert reporter.flush(10.0)
    finally:
        reporter.close()
    reports = [json.loads(fields["report"]) for _, fields in redis_db.xrange(stream_key("nt"))]
    assert len(reports) == 1
    report = reports[0]
    assert (report["kind"], report["cache_key"], report["served"]) == ("miss", decision.cache_key, "nearest")
    assert report["nearest"] == {"workload": square(64).workload, "distance": 1.0}
    assert report["signature"] == square(128).workload


def test_the_read_only_user_of_the_deployment_may_look_up_nearest_decisions(redis_srv, redis_db) -> None:
    import re
    import secrets
    from pathlib import Path

    script = (Path(__file__).parent.parent / "docker" / "redis-entrypoint.sh").read_text()
    rules = re.search(r'echo "user \$reader_user on resetpass #\$\(sha256 "\$reader_password"\) (resetkeys [^"]+)"', script)
    assert rules is not None, "the entrypoint's reader ACL line"
    user, password = f"reader-{secrets.token_hex(4)}", secrets.token_hex(16)
    redis_db.execute_command("ACL", "SETUSER", user, "on", f">{password}",
                             *rules.group(1).replace("$prefix", "nr").split())
    try:
        RedisDecisions(client=redis_db, settings=Settings(prefix="nr")).publish(record(key_of(square(64))), ENV)
        url = redis_srv.url(1).replace("redis://", f"redis://{user}:{password}@", 1)
        reader = RedisDecisions(url, settings=Settings(prefix="nr"))
        hits = reader.nearest(query_of(key_of(square(100))), 3.0)
        assert [h.workload for h in hits] == [square(64).workload] and reader.failures == 0
        assert reader._rank_on_server  # the reader may run the read-only ranking function
    finally:
        redis_db.execute_command("ACL", "DELUSER", user)
