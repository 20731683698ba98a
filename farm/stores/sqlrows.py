"""The local cache's row writes, shared by the store (``farm.stores.local``), its staging of batches
(``farm.stores.staging``), its bulk build (``farm.stores.bulkbuild``) and its nearest-decision index."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

APP, FARM = 0, 1  # row owners: an application's controller (its capacity and ttl apply), the farm (never pruned)


def replace_row(conn: sqlite3.Connection, key: bytes, owner: int, created: float, problem_id: str | None,
                text: str) -> None:
    # DELETE then INSERT (not INSERT OR REPLACE): the row gets a new write-order id and the count triggers fire.
    conn.execute("DELETE FROM decisions WHERE key = ?", (key,))
    conn.execute("INSERT INTO decisions (key, owner, created, problem_id, record) VALUES (?, ?, ?, ?, ?)",
                 (key, owner, created, problem_id, text))


def write_rows(conn: sqlite3.Connection, sql: str, row: str, rows: Sequence[Any]) -> None:
    """``sql`` (``{}`` for the rows) over ``rows``, as many per statement as SQLite's oldest limit of 999
    variables allows; ``row``: one row's placeholders, a row is a tuple of values (or one value)."""
    width = row.count("?")
    per = 999 // width
    for at in range(0, len(rows), per):
        part = rows[at : at + per]
        values = list(chain.from_iterable(part)) if width > 1 else list(part)
        conn.execute(sql.format(",".join([row] * len(part))), values)


def statements(script: str) -> Iterator[str]:
    """The SQL statements of a script, one at a time."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement
            statement = ""


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction: committed, or rolled back when the body raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
