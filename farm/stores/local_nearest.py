"""The local cache's nearest-decision index (``farm.nearest``): a table beside the decisions, one row per decision
whose workload has a family, written in the same transaction as the decision itself.

``lead`` and ``second``: log2 of the first two dimensions (farm.nearest.lead). The rows, their trigger and the
index of a file written before it: docs/nearest.md, "The indexes".
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from farm.errors import CorruptRecord
from farm.nearest import SLACK, NearestQuery, dims_text, family_of, lead, rank
from farm.stores.base import DecisionRecord
from farm.stores.sqlrows import immediate, statements, write_rows

log = logging.getLogger("farm.stores.local")

INDEX_SCHEMA = """
CREATE TABLE IF NOT EXISTS nearest (key BLOB PRIMARY KEY, family BLOB NOT NULL, lead REAL NOT NULL,
                                    second REAL NOT NULL, dims TEXT NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS nearest_by_family ON nearest(family, lead, second, dims);
CREATE TRIGGER IF NOT EXISTS decisions_unindexed AFTER DELETE ON decisions BEGIN
    DELETE FROM nearest WHERE key = old.key;
END;
"""
LIMIT = 4  # records one lookup reads: the nearest few (a nearer one may be stale, unverified or banned)


def write_index(conn: sqlite3.Connection, rows: Iterable[tuple[bytes, str]]) -> None:
    """Index decisions given as (row key, cache key), inside the caller's transaction (no family: no row)."""
    built = [(key, bytes.fromhex(found.digest), lead(found.dims), lead(found.dims, 1), dims_text(found.dims))
             for key, cache_key in rows if (found := family_of(cache_key)) is not None]
    write_rows(conn, "INSERT OR REPLACE INTO nearest VALUES {}", "(?, ?, ?, ?, ?)", built)


def decoded(rows: Iterable[tuple[Any, str]]) -> Iterator[tuple[Any, DecisionRecord]]:
    """(tag, record) of the (tag, record text) rows whose record is readable; the others are left out."""
    for tag, text in rows:
        with contextlib.suppress(CorruptRecord):
            yield tag, DecisionRecord.from_json(text)


def _has_index(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'nearest'").fetchone() is not None


def ensure_index(conn: sqlite3.Connection) -> None:
    """Create and fill the index of a file written before it existed (one transaction; another process may
    have done it first)."""
    if _has_index(conn):
        return
    with immediate(conn):
        if not _has_index(conn):
            for statement in statements(INDEX_SCHEMA):
                conn.execute(statement)
            stored = conn.execute("SELECT key, record FROM decisions").fetchall()
            rows = [(key, record.cache_key) for key, record in decoded(stored)]  # a corrupt record is a miss anyway
            write_index(conn, rows)
            log.info("built the nearest-decision index of %d decisions", len(rows))


def near_rows(conn: sqlite3.Connection, query: NearestQuery, max_distance: float) -> list[tuple[bytes, str]]:
    """(key, record text) of the family's nearest decisions within ``max_distance`` (nearest first, at most
    ``LIMIT``; none without an index). Candidates come by ``bound`` (a lower bound of the distance over
    the first two dimensions); Python ranks them until the bound passes the ``LIMIT``-th best distance."""
    here, second = lead(query.dims), lead(query.dims, 1)
    if not _has_index(conn):  # a read-only view of a file written before the index
        return []
    rows = conn.execute(
        "SELECT key, dims, max(abs(lead - ?), abs(second - ?)) AS bound FROM nearest WHERE family = ? AND lead "
        "BETWEEN ? AND ? AND second BETWEEN ? AND ? ORDER BY bound",
        (here, second, bytes.fromhex(query.digest), *query.window(max_distance), *query.window(max_distance, 1)))
    best: list[tuple[tuple[float, float], bytes]] = []
    for key, dims, bound in rows:
        if len(best) >= LIMIT and bound > best[LIMIT - 1][0][0] + SLACK:
            break
        order = rank(query.dims, json.loads(dims))
        if order[0] <= max_distance + SLACK:
            best.append((order, key))
            best.sort()
    rows.close()
    keys = [key for _, key in best[:LIMIT]]
    texts = dict(conn.execute(f"SELECT key, record FROM decisions WHERE key IN ({','.join('?' * len(keys))})",
                              keys))
    return [(k, texts[k]) for k in keys if k in texts]
