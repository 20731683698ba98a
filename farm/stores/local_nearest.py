"""The local cache's nearest-decision index (``farm.nearest``): a table beside the decisions, one row per decision
whose workload has a family, written in the same transaction as the decision itself.

``nearest(key, family, lead, second, dims)``: ``key`` the decision's row key (sha256 of its cache key),
``family`` the family digest (32 bytes), ``lead`` and ``second`` the log2 of the first two dimensions
(farm.nearest.lead), ``dims`` the dimensions as JSON. A lookup is one range scan of the covering index
``(family, lead, second, dims)``: it reads the rows within ``max_distance`` of the query's first dimension, keeps
(in SQL) those within it in the second too, and ranks those in Python. A
trigger removes a decision's index row with the decision (delete, replacement, pruning).

A cache file created before the index existed gets it when a writer first opens it: the table is created and
filled from the stored decisions in one transaction (a one-time scan of the file). A reader that may not write the
file (an immutable view) finds no index: its nearest lookups answer nothing.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable

from farm.errors import CorruptRecord
from farm.nearest import SLACK, NearestQuery, dims_text, family_of, lead, rank
from farm.stores.base import DecisionRecord
from farm.stores.sqlrows import statements, write_rows

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


def index_row(key: bytes, cache_key: str) -> tuple[bytes, bytes, float, float, str] | None:
    """The index row of a decision, or None when its workload has no family."""
    found = family_of(cache_key)
    if found is None:
        return None
    return (key, bytes.fromhex(found.digest), lead(found.dims), lead(found.dims, 1),
            dims_text(found.dims))


def write_index(conn: sqlite3.Connection, rows: Iterable[tuple[bytes, str]]) -> None:
    """Index decisions given as (row key, cache key), inside the caller's transaction."""
    built = [row for row in (index_row(key, cache_key) for key, cache_key in rows) if row is not None]
    write_rows(conn, "INSERT OR REPLACE INTO nearest VALUES {}", "(?, ?, ?, ?, ?)", built)


def has_index(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'nearest'").fetchone() is not None


def fill_index(conn: sqlite3.Connection) -> int:
    """Index every stored decision (inside the caller's transaction); return how many were read."""
    rows = []
    for key, text in conn.execute("SELECT key, record FROM decisions").fetchall():
        try:
            rows.append((key, DecisionRecord.from_json(text).cache_key))
        except CorruptRecord:
            continue  # a corrupt record is a miss anyway
    write_index(conn, rows)
    return len(rows)


def ensure_index(conn: sqlite3.Connection) -> None:
    """Create and fill the index of a file written before it existed (one transaction; another process may
    have done it first)."""
    if has_index(conn):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not has_index(conn):
            for statement in statements(INDEX_SCHEMA):
                conn.execute(statement)
            log.info("built the nearest-decision index of %d decisions", fill_index(conn))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def near_rows(conn: sqlite3.Connection, query: NearestQuery, max_distance: float) -> list[str]:
    """The record texts of the family's nearest decisions within ``max_distance`` (nearest first, at most
    ``LIMIT``; none without an index).

    One range scan of the covering index yields the candidates ordered (in SQL) by ``bound``, their distance over
    the first two dimensions: a lower bound of the full distance. Rows are ranked in Python in that order until
    the bound exceeds the distance of the ``LIMIT``-th best found, so a lookup ranks a few rows, not the family."""
    here, second = lead(query.dims), lead(query.dims, 1)
    try:
        rows = conn.execute(
            "SELECT key, dims, max(abs(lead - ?), abs(second - ?)) AS bound FROM nearest WHERE family = ? AND lead "
            "BETWEEN ? AND ? AND second BETWEEN ? AND ? ORDER BY bound",
            (here, second, bytes.fromhex(query.digest), *query.window(max_distance),
             *query.window(max_distance, 1)))
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []
        raise
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
    if not keys:
        return []
    texts = dict(conn.execute(f"SELECT key, record FROM decisions WHERE key IN ({','.join('?' * len(keys))})",
                              keys).fetchall())
    return [texts[k] for k in keys if k in texts]
