"""The farm's write-ahead log moved into the local cache file on a thread of its own.

A publishing farm (``farm.stores.local.LocalStore`` with owner FARM) asks for a checkpoint after every few MiB it
wrote; a daemon thread runs it on its own connection in PASSIVE mode, which never waits for, nor blocks, the
writer or readers. The copy of the log's pages into the file and its fsyncs (``synchronous=NORMAL``: commits do not
sync, checkpoints do) then overlap the farm's own work instead of stalling its commits: their cost grows with the
file, so a long run would otherwise slow down as its cache grows. SQLite's automatic checkpoint on the writer stays
as the backstop. A checkpoint that fails is retried with the next request; the log is never lost, only longer.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger(__name__)


class Checkpoints:
    """Checkpoints of the database at ``path`` on request, on a daemon thread that lives while there are requests
    (it opens its own connection, serves them one after the other, closes it and ends: nothing lingers idle)."""

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
