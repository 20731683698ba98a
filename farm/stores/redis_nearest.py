"""The Redis tier's nearest-decision index (``farm.nearest``): one sorted set per workload family.

Layout and lookup: docs/nearest.md ("The indexes"). Entries are written in the publication's own MULTI/EXEC
(``RedisDecisions.publish_batch``) and depend on the cache key alone, so writing one again is harmless."""

from __future__ import annotations

import bisect
import contextlib
import json
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from farm.environment import fingerprint_digest
from farm.errors import CorruptRecord
from farm.nearest import SLACK, NearestHit, NearestQuery, dims_text, family_of, hit, lead, nearest_first, rank
from farm.stores.base import DecisionRecord, key_sha256

LIMIT = 4  # records one lookup reads: the nearest few (a nearer one may be stale, unverified or banned)


def index_commands(prefix_key: Any, entries: Iterable[tuple[str, str]]) -> list[list[bytes]]:
    """ZADD commands (one per family) indexing (cache key, fingerprint digest) pairs under ``prefix_key``."""
    families: dict[str, list[bytes]] = {}
    for cache_key, digest in entries:
        if (found := family_of(cache_key)) is not None:
            member = f"{dims_text(found.dims)}|{key_sha256(cache_key)}"
            families.setdefault(prefix_key("nearest", digest, found.digest), []).extend(
                (repr(lead(found.dims)).encode(), member.encode()))
    return [[b"ZADD", key.encode(), *pairs] for key, pairs in families.items()]


def call_ro(client: Any, on_server: bool, here: Callable[[], Any], function: str,
            *args: Any) -> tuple[Any, bool]:
    """(``FCALL_RO function 1 *args``, True), or (``here()``, False) if not on server, missing or refused."""
    import redis

    if on_server:
        try:
            return client.fcall_ro(function, 1, *args), True
        except redis.ResponseError as e:
            refused = isinstance(e, redis.exceptions.NoPermissionError) or "can't run this command" in str(e)
            if "Function not found" not in str(e) and not refused:
                raise
    return here(), False


def lookup(client: Any, layout: Any, query: NearestQuery, max_distance: float,
           on_server: bool = True) -> tuple[list[NearestHit], bool]:
    """The family's nearest stored decisions within ``max_distance``, nearest first, and whether the server may
    rank them next time (``farm_nearest`` ranks the index, then one HMGET reads the records)."""
    digest = fingerprint_digest(query.environment)
    key = layout.key("nearest", digest, query.digest)
    fields, on_server = call_ro(client, on_server, partial(_ranked_here, client, key, query, max_distance),
                                "farm_nearest", key, *map(repr, query.window(max_distance)),
                                repr(lead(query.dims)), repr(max_distance + SLACK), LIMIT, *query.dims)
    hits = []
    for raw in client.hmget(layout.decisions_key(digest), [str(f) for f in fields]) if fields else []:
        if raw is not None:
            with contextlib.suppress(CorruptRecord):
                hits.append(hit(DecisionRecord.from_json(raw), query, max_distance))
    return nearest_first(hits), on_server


def _ranked_here(client: Any, key: str, query: NearestQuery, max_distance: float) -> list[str]:
    """farm_nearest's ranking, client-side: the window's members in order of their score's distance from the
    query's (a lower bound of their distance) until it exceeds the ``LIMIT``-th best found."""
    members = client.zrangebyscore(key, *query.window(max_distance), withscores=True)
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
            bisect.insort(best, (order, field))
    return [field for _, field in best[:LIMIT]]
