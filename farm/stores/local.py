"""The local cache: one SQLite file per cache directory, shared safely by every process of the machine.

``<cache_directory>/farm-cache.sqlite3`` is the controller's disk tier and the embedded farm's sink; ``farm
archive import --into-cache`` and ``export --from-cache`` use it. This module is the only owner of the format
(rows, owners, pruning, transactions, read-only readers: docs/farm.md, "The local cache").
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from farm.errors import CorruptRecord
from farm.nearest import NearestHit, NearestQuery, hit, nearest_first
from farm.stores.base import DecisionRecord, Publication, PublicationBatch, key_hash
from farm.stores.bulkbuild import absent, build_aside
from farm.stores.local_nearest import INDEX_SCHEMA, decoded, ensure_index, near_rows, write_index
from farm.stores.sqlrows import APP as APP
from farm.stores.sqlrows import FARM as FARM
from farm.stores.sqlrows import immediate, replace_row, statements
from farm.stores.staging import Staging

log = logging.getLogger(__name__)

STORE_FILE = "farm-cache.sqlite3"
STORE_SCHEMA = 1
PAGE_SIZE = 16384  # new files: a decision's trial rows (a KiB or more) overflow 4 KiB pages of the trials table
FARM_CHECKPOINT_BYTES = 8 << 20  # the farm asks for a checkpoint (Checkpoints) after this much written
FARM_CHECKPOINT_PAGES = 16384  # ...and SQLite's own automatic one, the backstop, waits for this many WAL pages
# page_size: new files only (set before WAL); cache_size: 64 MiB, for imports touch random B-tree pages
_PRAGMAS = (f"PRAGMA page_size={PAGE_SIZE}", "PRAGMA cache_size=-65536")

_SCHEMA = """
CREATE TABLE decisions (
    id INTEGER PRIMARY KEY,      -- write order: capacity pruning removes the lowest ids of the application's rows
    key BLOB NOT NULL UNIQUE,    -- sha256 of the cache key
    owner INTEGER NOT NULL,      -- 0 the application (its capacity and ttl apply), 1 the farm (never pruned)
    created REAL NOT NULL,
    problem_id TEXT,
    record TEXT NOT NULL         -- DecisionRecord.to_json text: the full key, the checksum last
);
CREATE INDEX decisions_by_owner ON decisions(owner);
CREATE INDEX decisions_by_age ON decisions(owner, created);
CREATE TABLE trials (key BLOB PRIMARY KEY, rows TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE fingerprints (digest TEXT PRIMARY KEY, fingerprint TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE problems (digest TEXT NOT NULL, problem_id TEXT NOT NULL, key BLOB NOT NULL,
                       PRIMARY KEY (digest, problem_id)) WITHOUT ROWID;
CREATE TABLE counts (owner INTEGER PRIMARY KEY, n INTEGER NOT NULL);
CREATE TRIGGER decisions_added AFTER INSERT ON decisions BEGIN
    INSERT INTO counts VALUES (new.owner, 1) ON CONFLICT (owner) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER decisions_removed AFTER DELETE ON decisions BEGIN
    UPDATE counts SET n = n - 1 WHERE owner = old.owner;
    DELETE FROM trials WHERE key = old.key;
END;
""" + INDEX_SCHEMA


class LocalStore:
    """The decisions of ``directory/farm-cache.sqlite3``.

    ``capacity`` and ``ttl`` (seconds) bound this owner's rows when it is ``APP`` (None: unbounded); ``FARM`` rows
    are never pruned. Reads never create the file: a missing cache is a miss. ``timeout``: seconds a write waits
    for another process's transaction (default 5 for an application, 60 for the farm). ``get`` raises
    CorruptRecord for a bad record or an unusable file; writes raise OSError (a lock wait past ``timeout`` too)."""

    def __init__(self, directory: Path | str, capacity: int | None = None, ttl: float | None = None, *,
                 owner: int = APP, timeout: float | None = None) -> None:
        self.directory = Path(directory)
        self.path = self.directory / STORE_FILE
        self.capacity, self.ttl, self.owner = capacity, ttl, owner
        self.timeout = timeout if timeout is not None else 5.0 if owner == APP else 60.0  # lock wait, seconds
        self._conn: sqlite3.Connection | None = None
        self._snapshot: tuple[int, int] | None = None  # (mtime, size) of the file behind a read-only view
        self._pid = 0
        self._lock = threading.RLock()
        self._checkpoints = Checkpoints(self.path, self.timeout)
        self._unchecked = 0  # bytes the farm published since it last asked for a checkpoint

    def _connect(self, create: bool) -> sqlite3.Connection | None:
        """The open connection (reopened after a fork); None when the file is missing and ``create`` is
        false. A reader that may not write the file reads an immutable view, reopened when it changes."""
        if self._conn is not None and self._pid == os.getpid():
            if self._snapshot is None or self._snapshot == _stamp(self.path) or create:
                return self._conn
            self._conn.close()
            self._conn = None
        if not create and not self.path.exists():
            with contextlib.suppress(FileNotFoundError):
                os.stat(self.directory)  # a path through a file is an error, a missing directory a miss
            return None
        if create or not self.path.exists():
            self.directory.mkdir(parents=True, exist_ok=True)
        self._snapshot = None
        try:
            conn = self._open()
        except sqlite3.OperationalError as e:
            if create or not ("readonly" in str(e) or "unable to open" in str(e)):
                raise
            self._snapshot = _stamp(self.path)
            conn = sqlite3.connect(f"file:{urllib.parse.quote(str(self.path))}?immutable=1", uri=True,
                                   isolation_level=None, check_same_thread=False)
            if (version := _version(conn)) != STORE_SCHEMA:
                conn.close()
                raise self._unreadable(version) from None
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
        try:
            for pragma in _PRAGMAS:
                conn.execute(pragma)
            _journal_wal(conn, self.timeout)
            conn.execute("PRAGMA synchronous=NORMAL")  # with WAL: atomic and consistent, fsync at checkpoints
            if self.owner == FARM:  # checkpoints run on a thread of their own (Checkpoints)
                conn.execute(f"PRAGMA wal_autocheckpoint={FARM_CHECKPOINT_PAGES}")
            version = _version(conn)
            if version == 0:
                with immediate(conn):
                    if _version(conn) == 0:  # another process may have won the race
                        for statement in statements(_SCHEMA):
                            conn.execute(statement)
                        conn.execute(f"PRAGMA user_version = {STORE_SCHEMA}")
            elif version != STORE_SCHEMA:
                raise self._unreadable(version)
            else:
                ensure_index(conn)  # a file written before the nearest-decision index: built once
        except BaseException:
            conn.close()
            raise
        return conn

    def _unreadable(self, version: int) -> CorruptRecord:
        return CorruptRecord(f"{self.path}: store schema version {version}; this farm reads {STORE_SCHEMA}")

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; sqlite3 errors become OSError naming the file."""
        with self._lock:
            try:
                conn = self._connect(create=True)
                assert conn is not None
                with immediate(conn):
                    yield conn
            except sqlite3.Error as e:
                raise OSError(f"{self.path}: {e}") from e

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection | None]:
        """The connection to read (None: no file); errors become CorruptRecord naming the file."""
        with self._lock:
            try:
                yield self._connect(create=False)
            except (sqlite3.Error, OSError) as e:
                raise CorruptRecord(f"{self.path}: unusable cache file: {e}") from e

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._reading() as conn:
            return [] if conn is None else conn.execute(sql, args).fetchall()

    def close(self) -> None:
        self._checkpoints.close()
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def get(self, cache_key: str) -> DecisionRecord | None:
        rows = self._read("SELECT record FROM decisions WHERE key = ?", (key_hash(cache_key),))
        return DecisionRecord.from_json(rows[0][0], expected_key=cache_key) if rows else None

    def put(self, record: DecisionRecord) -> None:
        """Store under this store's owner, then prune its expired and excess rows (indexed; never the farm's)."""
        with self._write() as conn:
            key = key_hash(record.cache_key)
            replace_row(conn, key, self.owner, record.created, None, record.to_json())
            write_index(conn, [(key, record.cache_key)])
            if self.owner == APP:
                self._prune(conn)

    def delete(self, cache_key: str) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM decisions WHERE key = ?", (key_hash(cache_key),))

    def nearest(self, query: NearestQuery, max_distance: float) -> list[NearestHit]:
        """The stored decisions of the query's family within ``max_distance``, nearest first (farm.nearest;
        the index of farm.stores.local_nearest). Unreadable records are left out."""
        with self._reading() as conn:
            rows = [] if conn is None else near_rows(conn, query, max_distance)
        return nearest_first(hit(record, query, max_distance) for _, record in decoded(rows))

    def _prune(self, conn: sqlite3.Connection) -> None:
        if self.ttl is not None:
            conn.execute("DELETE FROM decisions WHERE owner = ? AND created < ?", (APP, time.time() - self.ttl))
        if self.capacity is not None:
            (n,) = conn.execute("SELECT n FROM counts WHERE owner = ?", (APP,)).fetchone() or (0,)
            if n > self.capacity:
                conn.execute("DELETE FROM decisions WHERE id IN (SELECT id FROM decisions WHERE owner = ? "
                             "ORDER BY id LIMIT ?)", (APP, n - self.capacity))

    def __len__(self) -> int:
        return sum(n for (n,) in self._read("SELECT n FROM counts"))

    def count(self, owner: int) -> int:
        rows = self._read("SELECT n FROM counts WHERE owner = ?", (owner,))
        return int(rows[0][0]) if rows else 0

    def publish(self, record: DecisionRecord, fingerprint: str, problem_id: str = "",
                trials: Sequence[dict[str, Any]] = ()) -> tuple[bool, str]:
        """Publish one decision as the farm (see :meth:`publish_many`)."""
        return self.publish_many([Publication(record, fingerprint, problem_id, tuple(trials))])[0]

    def publish_many(self, publications: Iterable[Publication]) -> list[tuple[bool, str]]:
        """Publish farm decisions in ONE transaction (:meth:`publish_batches`); one reply per publication."""
        runs = [list(group) for _, group in itertools.groupby(publications, key=lambda p: p.fingerprint)]
        results = self.publish_batches([PublicationBatch.of(run[0].fingerprint, run) for run in runs])
        return [reply for batch in results for reply in batch]

    def publish_batches(self, batches: Iterable[PublicationBatch]) -> list[list[tuple[bool, str]]]:
        """Publish farm decisions, trial rows, fingerprints and problem index in ONE transaction under the
        replacement rule (``replaces``). Returns, per batch, (replaced, "new" | "replaced" | "kept: ...") per
        decision; a key published twice keeps the winner. No cache file yet: it is built aside (bulkbuild)."""
        batches = list(batches)
        if self.owner == FARM and self._conn is None and absent(self.path):
            staging = Staging()
            results = [staging.add(batch, lambda keys: {}) for batch in batches]
            try:
                built = build_aside(self.path, _SCHEMA, list(_PRAGMAS), STORE_SCHEMA, staging.write,
                                    after=f"INSERT INTO counts VALUES ({FARM}, {len(staging.staged)});")
            except sqlite3.Error as e:
                raise OSError(f"{self.path}: {e}") from e
            if built:
                return results
        with self._write() as conn:
            def stored(keys: set[bytes]) -> dict[bytes, str]:
                sql = f"SELECT key, record FROM decisions WHERE key IN ({','.join('?' * len(keys))})"
                return dict(conn.execute(sql, list(keys)).fetchall())

            staging = Staging()
            results = [staging.add(batch, stored) for batch in batches]
            staging.write(conn)
            self._unchecked += staging.bytes
        if self._unchecked >= FARM_CHECKPOINT_BYTES:
            self._unchecked = 0
            self._checkpoints.request()
        return results

    def decided(self, digest: str, problem_ids: list[str]) -> set[str]:
        """Which of ``problem_ids`` have a stored decision for this fingerprint."""
        return {pid for (pid,) in self._problems("p.problem_id", digest, problem_ids)}

    def problem_records(self, digest: str, problem_ids: list[str]) -> dict[str, DecisionRecord]:
        """The published records of ``problem_ids`` for this fingerprint (problem id -> record); unreadable ones are
        left out."""
        return dict(decoded(self._problems("p.problem_id, d.record", digest, problem_ids)))

    def _problems(self, columns: str, digest: str, problem_ids: list[str]) -> list[Any]:
        """``columns`` (of ``p``, the problem index, ``d``, the decisions) of the decided ``problem_ids``."""
        rows = []
        for at in range(0, len(problem_ids), 500):
            chunk = problem_ids[at : at + 500]
            marks = ",".join("?" * len(chunk))
            rows += self._read(f"SELECT {columns} FROM problems p JOIN decisions d ON d.key = p.key "
                               f"WHERE p.digest = ? AND p.problem_id IN ({marks})", (digest, *chunk))
        return rows

    def priors(self, family: str, exclude: str, limit: int) -> list[tuple[str, DecisionRecord]]:
        """(fingerprint digest, record) of up to ``limit`` fingerprints other than ``exclude`` whose problem index
        maps ``family`` (a problem family's id across fingerprints, a publication's alias), in digest order: one
        query, a primary-key lookup per fingerprint. Unreadable records are left out."""
        rows = self._read(
            "SELECT f.digest, d.record FROM fingerprints f JOIN problems p ON p.digest = f.digest AND "
            "p.problem_id = ? JOIN decisions d ON d.key = p.key WHERE f.digest != ? ORDER BY f.digest LIMIT ?",
            (family, exclude, max(0, limit)))
        return [(str(digest), record) for digest, record in decoded(rows)]

    def fingerprints(self) -> dict[str, str]:
        """Digest -> fingerprint text of every fingerprint the farm published."""
        return dict(self._read("SELECT digest, fingerprint FROM fingerprints"))

    def trials(self, cache_key: str) -> list[dict[str, Any]]:
        rows = self._read("SELECT rows FROM trials WHERE key = ?", (key_hash(cache_key),))
        return list(json.loads(rows[0][0])) if rows else []

    def scan(self, batch: int = 10000) -> Iterator[list[tuple[str, str | None, str | None]]]:
        """Every stored decision in batches of (record text, problem id, trial rows JSON or None), in write order.
        Each batch is one consistent read; the records are not verified here."""
        last = 0
        while True:
            rows = self._read(
                "SELECT d.id, d.record, d.problem_id, t.rows FROM decisions d LEFT JOIN trials t ON t.key = d.key "
                "WHERE d.id > ? ORDER BY d.id LIMIT ?", (last, batch))
            if not rows:
                return
            last = rows[-1][0]
            yield [(text, pid, trials) for _, text, pid, trials in rows]


def _journal_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Switch to (or keep) WAL mode. Two processes creating the file at once may find it locked by the other's
    switch: SQLite does not wait for that lock with its busy timeout, so the switch is retried until ``timeout``."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def _version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _stamp(path: Path) -> tuple[int, int]:
    with contextlib.suppress(OSError):
        st = os.stat(path)
        return (st.st_mtime_ns, st.st_size)
    return (0, 0)


class Checkpoints:
    """PASSIVE checkpoints of ``path`` on request, on their own connection and a daemon thread living while
    there are requests, never blocking the writer or readers; a failed one is retried at the next request."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path, self.timeout = path, timeout
        self._lock = threading.Lock()
        self._wanted = False
        self._thread: threading.Thread | None = None
        self._pid = 0

    def request(self) -> None:
        """Checkpoint soon (a request while one runs is served once it ends)."""
        with self._lock:
            self._wanted = True
            if self._thread is not None and self._pid == os.getpid():
                return  # the running thread serves it (a thread inherited across a fork is not running)
            self._thread = threading.Thread(target=self._serve, name="farm-cache-checkpoints", daemon=True)
            self._pid = os.getpid()
            self._thread.start()

    def close(self) -> None:
        """Wait for the checkpoints under way, if any."""
        with self._lock:
            thread = self._thread if self._pid == os.getpid() else None
        if thread is not None:
            thread.join()

    def _serve(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                with self._lock:
                    if not self._wanted:
                        self._thread = None
                        return
                    self._wanted = False
                try:
                    if conn is None:
                        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
                        conn.execute("PRAGMA synchronous=NORMAL")
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as e:
                    log.debug("checkpoint of %s failed (the next one retries): %s", self.path, e)
        finally:
            if conn is not None:
                conn.close()
