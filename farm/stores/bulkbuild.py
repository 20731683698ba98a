"""A new local cache file built aside in one pass, then linked into place: the fast path of a first publication.

No write-ahead log, no per-row trigger, the indexes built after the rows, one fsync, a hard link that never
replaces a file created meanwhile (docs/farm.md, "The local cache").
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
from collections.abc import Callable
from pathlib import Path

from farm.stores.sqlrows import statements


def build_aside(path: Path, schema: str, pragmas: list[str], user_version: int,
                write: Callable[[sqlite3.Connection], None], after: str = "") -> bool:
    """Create the database ``path`` if it does not exist: its tables (the ``CREATE TABLE`` statements of
    ``schema``), then ``write(conn)`` fills them, then ``after`` (SQL run once the rows are in) and the rest of
    ``schema`` (indexes, triggers) are run and ``user_version`` set. Returns False, leaving nothing behind,
    when ``path`` (or a journal of it) exists or appeared meanwhile; errors propagate (nothing is left behind)."""
    if not absent(path):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    try:
        with contextlib.closing(sqlite3.connect(temp, isolation_level=None)) as conn:
            for pragma in (*pragmas, "PRAGMA journal_mode=OFF", "PRAGMA synchronous=OFF"):
                conn.execute(pragma)
            parts = list(statements(schema))
            tables = [s for s in parts if s.lstrip().upper().startswith("CREATE TABLE")]
            conn.execute("BEGIN")
            for statement in tables:
                conn.execute(statement)
            write(conn)
            for statement in [*statements(after), *(s for s in parts if s not in tables)]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {int(user_version)}")
            conn.execute("COMMIT")
            conn.execute("PRAGMA journal_mode=WAL")  # kept in the file's header
        _fsync(temp)
        try:
            os.link(temp, path)  # never replaces: a file created meanwhile wins
        except FileExistsError:
            return False
        _fsync(path.parent)
        return True
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{temp}{suffix}")


def absent(path: Path) -> bool:
    """Whether neither the database ``path`` nor a journal of it exists (a file may still appear at once)."""
    return not any(os.path.lexists(f"{path}{suffix}") for suffix in ("", "-wal", "-journal"))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
