"""The local cache's one-time migration from the previous directory format (``<sha256>.json`` records,
``trials/``, ``farm-index.json``) into its SQLite file, and the row writes both share (``farm.stores.local``)."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sqlite3
from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

from farm.errors import CorruptRecord
from farm.stores.base import DecisionRecord, key_hash

log = logging.getLogger("farm.stores.local")

APP, FARM = 0, 1  # row owners: an application's controller (its capacity and ttl apply), the farm (never pruned)
_LEGACY_RECORD = re.compile(r"[0-9a-f]{64}\.json")
_LEGACY_INDEX = "farm-index.json"
_LEGACY_TRIALS = "trials"


def replace_row(conn: sqlite3.Connection, key: bytes, owner: int, created: float, problem_id: str | None,
                text: str) -> None:
    # DELETE then INSERT (not INSERT OR REPLACE): the row gets a new write-order id and the count triggers fire.
    conn.execute("DELETE FROM decisions WHERE key = ?", (key,))
    conn.execute("INSERT INTO decisions (key, owner, created, problem_id, record) VALUES (?, ?, ?, ?, ?)",
                 (key, owner, created, problem_id, text))


def write_rows(conn: sqlite3.Connection, sql: str, row: str, rows: Sequence[Any]) -> None:
    """``sql`` (with ``{}`` for the rows) over ``rows``, as many per statement as SQLite's oldest limit of 999
    variables allows (fewer statements, each with its own journal and trigger program, for the same rows);
    ``row``: the placeholders of one row, each row a tuple of its values (one value: the value itself)."""
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


# -- the previous format: read once, migrated -------------------------------------------------------------------


def legacy_files(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if _LEGACY_RECORD.fullmatch(p.name) or p.name == _LEGACY_INDEX]
    except OSError:
        return []


def migrate(conn: sqlite3.Connection, directory: Path) -> list[Path]:
    """Copy a cache directory of the previous format into the new tables; return the files to remove."""
    files = legacy_files(directory)
    if not files:
        return []
    index: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        loaded = json.loads((directory / _LEGACY_INDEX).read_text())
        index = loaded if isinstance(loaded, dict) else {}
    problems: dict[str, Any] = index["problems"] if isinstance(index.get("problems"), dict) else {}
    farm_keys: dict[str, tuple[str, str]] = {}
    for digest, pids in problems.items():
        if isinstance(pids, dict):
            for pid, sha in pids.items():
                farm_keys[str(sha)] = (str(digest), str(pid))
    fingerprints: dict[str, Any] = index["fingerprints"] if isinstance(index.get("fingerprints"), dict) else {}
    for digest, text in fingerprints.items():
        conn.execute("INSERT OR REPLACE INTO fingerprints VALUES (?, ?)", (str(digest), str(text)))
    records = []
    for path in list(files):
        if path.name == _LEGACY_INDEX:
            continue
        try:
            text = path.read_text()
            record = DecisionRecord.from_json(text)
            records.append((path.stat().st_mtime, path, record, text))
        except (OSError, ValueError, CorruptRecord) as e:  # it would be a miss: it is left behind, not migrated
            log.warning("not migrating %s: %s", path, e)
            files.remove(path)
    trials_dir = directory / _LEGACY_TRIALS
    for _, path, record, text in sorted(records, key=lambda r: r[0]):
        sha = path.name[:-5]
        key = key_hash(record.cache_key)
        if key.hex() != sha:
            continue
        owner, pid = (FARM, farm_keys[sha][1]) if sha in farm_keys else (APP, None)
        replace_row(conn, key, owner, record.created, pid, text)
        trial_path = trials_dir / path.name
        if owner == FARM:
            with contextlib.suppress(OSError):
                conn.execute("INSERT OR REPLACE INTO trials VALUES (?, ?)", (key, trial_path.read_text()))
            conn.execute("INSERT OR REPLACE INTO problems VALUES (?, ?, ?)", (farm_keys[sha][0], pid, key))
        if trial_path.is_file():
            files.append(trial_path)
    if trials_dir.is_dir():
        files.append(trials_dir)  # removed last, and only when empty
    return files
