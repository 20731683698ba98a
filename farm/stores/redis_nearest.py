"""The Redis tier's nearest-decision index (``farm.nearest``): one sorted set per workload family.

``<prefix>:nearest:<fingerprint digest>:<family digest>`` holds a member ``<dims JSON>|<field>`` per decision of
the family (``field``: the decision's hash field, sha256 of its cache key), scored by the workload's ``lead``. It
is written in the publication's own MULTI/EXEC (``RedisDecisions.publish_batch``, the farm's runs and the archive
imports alike), so a reader sees a decision and its index entry together. An entry depends on the
cache key alone, never on which record the replacement rule kept, so writing it again is harmless.

A lookup is two round trips: ``farm_nearest`` (nearest.lua, read only) ranks the family's members within
``max_distance`` of the query's lead on the server and returns the nearest few fields, then one HMGET reads their
records. An entry whose record is gone (deleted) is skipped.

Decisions published before the index existed are not in it: run ``RedisDecisions.index_nearest`` (one HSCAN of
each fingerprint's hash) once to add them; every publication after that maintains it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from farm.environment import fingerprint_digest
from farm.errors import CorruptRecord
from farm.nearest import SLACK, NearestHit, NearestQuery, dims_text, family_of, hit, lead, nearest_first, rank
from farm.stores.base import DecisionRecord, key_sha256

LIMIT = 4  # records one lookup reads: the nearest few (a nearer one may be stale, unverified or banned)


def index_key(prefix_key: Any, fingerprint: str, family: str) -> str:
    """The sorted set of a family (``prefix_key``: the layout's ``key`` method)."""
    return str(prefix_key("nearest", fingerprint, family))


def index_commands(prefix_key: Any, entries: Iterable[tuple[str, str]]) -> list[list[bytes]]:
    """The ZADD commands (arguments) indexing decisions given as (cache key, fingerprint digest): one per
    family."""
    families: dict[str, list[bytes]] = {}
    for cache_key, digest in entries:
        found = family_of(cache_key)
        if found is None:
            continue
        member = f"{dims_text(found.dims)}|{key_sha256(cache_key)}"
        families.setdefault(index_key(prefix_key, digest, found.digest), []).extend(
            (repr(lead(found.dims)).encode(), member.encode()))
    return [[b"ZADD", key.encode(), *pairs] for key, pairs in families.items()]


def lookup(client: Any, layout: Any, query: NearestQuery, max_distance: float,
           on_server: bool = True) -> tuple[list[NearestHit], bool]:
    """The family's nearest stored decisions within ``max_distance``, nearest first, and whether the server may
    rank them next time. Two round trips: the server ranks the family's window (``farm_nearest``, nearest.lua)
    and returns the nearest few fields, then one HMGET reads their records. Where the function is not loaded or
    not permitted (``on_server`` false after the first such answer), the window's members are ranked here."""
    import redis

    digest = fingerprint_digest(query.environment)
    key = index_key(layout.key, digest, query.digest)
    low, high = query.window(max_distance)
    fields: list[str] | None = None
    if on_server:
        try:
            fields = client.fcall_ro("farm_nearest", 1, key, repr(low), repr(high), repr(lead(query.dims)),
                                     repr(max_distance + SLACK), LIMIT, *query.dims)
        except redis.ResponseError as e:
            refused = isinstance(e, redis.exceptions.NoPermissionError) or "can't run this command" in str(e)
            if "Function not found" not in str(e) and not refused:
                raise
            on_server = False
    if fields is None:
        fields = _ranked_here(client.zrangebyscore(key, low, high, withscores=True), query, max_distance)
    if not fields:
        return [], on_server
    hits = []
    for raw in client.hmget(layout.decisions_key(digest), [str(f) for f in fields]):
        if raw is None:
            continue  # deleted since it was indexed
        try:
            hits.append(hit(DecisionRecord.from_json(raw), query, max_distance))
        except CorruptRecord:
            continue
    return nearest_first(hits), on_server


def _ranked_here(members: list[tuple[str, float]], query: NearestQuery, max_distance: float) -> list[str]:
    """farm_nearest's ranking, client-side: members in order of their score's distance from the query's (a lower
    bound of their distance) until it exceeds the ``LIMIT``-th best found."""
    here = lead(query.dims)
    best: list[tuple[tuple[float, float], str]] = []
    for member, score in sorted(members, key=lambda m: abs(float(m[1]) - here)):
        if len(best) >= LIMIT and abs(float(score) - here) > best[LIMIT - 1][0][0] + SLACK:
            break
        dims, _, field = str(member).rpartition("|")
        try:
            order = rank(query.dims, json.loads(dims))
        except (ValueError, TypeError):
            continue
        if order[0] <= max_distance + SLACK:
            best.append((order, field))
            best.sort()
    return [field for _, field in best[:LIMIT]]
