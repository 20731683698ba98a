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
    """Checkpoints of the database at ``path``, on request, one at a time, on a daemon thread started lazily."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path, self.timeout = path, timeout
        self._wanted = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._pid = 0

    def request(self) -> None:
        """Checkpoint soon (a request while one runs is served once it ends)."""
        if self._thread is None or self._pid != os.getpid():  # none yet, or inherited across a fork: start one
            self._stopping = False
            self._thread = threading.Thread(target=self._serve, name="farm-cache-checkpoints", daemon=True)
            self._pid = os.getpid()
            self._thread.start()
        self._wanted.set()

    def close(self) -> None:
        """Stop the thread after the checkpoint under way, if any."""
        thread, self._thread = self._thread, None
        if thread is not None and self._pid == os.getpid():
            self._stopping = True
            self._wanted.set()
            thread.join()

    def _serve(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                if self._stopping:
                    return
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
