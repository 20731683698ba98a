"""A farm publication into the local cache, staged decision by decision under the replacement rule, then written
in key order (``farm.stores.local`` publishes through it, in a transaction or into a file built aside)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable

from farm.environment import fingerprint_digest
from farm.errors import CorruptRecord
from farm.stores.base import DecisionRecord, PublicationBatch, outranks
from farm.stores.local_nearest import write_index
from farm.stores.sqlrows import FARM, write_rows

BATCH = 1000  # stored records are looked up this many keys at a time
# A key's staged publication: (verified, created, record text, problem id, trial rows JSON, cache key).
_Staged = tuple[bool, float, str, str | None, str, str]
_NEW = (True, "new")
_KEPT = (False, "kept: the stored record wins under the replacement rule")


class Staging:
    """What a publication will write, decision by decision under the replacement rule."""

    def __init__(self) -> None:
        self.staged: dict[bytes, _Staged] = {}
        self.indexed: list[tuple[str, str, bytes]] = []  # (digest, problem id, key) of every publication accepted
        self.stored: set[bytes] = set()  # keys with a row to delete first
        self.fingerprints: dict[str, str] = {}

    def add(self, batch: PublicationBatch, lookup: Callable[[set[bytes]], dict[bytes, str]]) -> list[tuple[bool, str]]:
        """Stage a batch; ``lookup(keys)`` gives the stored record text of those keys that have one."""
        digest = fingerprint_digest(batch.fingerprint)
        replies: list[tuple[bool, str]] = []
        for at in range(0, len(batch), BATCH):
            stop = min(at + BATCH, len(batch))
            keys = batch.digests[at:stop]
            unseen = {k for k in keys if k not in self.staged}
            old_rows = lookup(unseen) if unseen else {}
            self.stored.update(old_rows)
            if not old_rows and len(unseen) == len(keys):  # distinct keys, none stored or staged: all new
                pids = batch.problem_ids[at:stop]
                self.staged.update(zip(keys, zip(batch.verified[at:stop], batch.created[at:stop],
                                                 batch.texts[at:stop], pids, batch.trials[at:stop],
                                                 batch.cache_keys[at:stop], strict=True), strict=True))
                self.indexed += [(digest, pid, key) for pid, key in zip(pids, keys, strict=True) if pid]
                if batch.aliases:
                    self.indexed += [(digest, alias, key) for i, key in zip(range(at, stop), keys, strict=True)
                                     for alias in batch.aliases[i]]
                replies += [_NEW] * len(keys)
            else:
                replies += [self._stage(batch, i, digest, old_rows) for i in range(at, stop)]
        self.fingerprints[digest] = batch.fingerprint
        return replies

    def _stage(self, batch: PublicationBatch, i: int, digest: str, old_rows: dict[bytes, str]) -> tuple[bool, str]:
        """Decision ``i`` of ``batch`` against what its key holds (staged in this publication, or stored)."""
        key = batch.digests[i]
        verified, created = batch.verified[i], batch.created[i]
        held = self.staged.get(key)
        if held is not None:
            if not outranks(verified, created, held[0], held[1]):
                return _KEPT
        elif key in old_rows:
            with contextlib.suppress(CorruptRecord):
                old = DecisionRecord.from_json(old_rows[key], expected_key=batch.cache_keys[i])
                if not outranks(verified, created, old.verified, old.created):
                    return _KEPT
        pid = batch.problem_ids[i]
        self.staged[key] = (verified, created, batch.texts[i], pid, batch.trials[i], batch.cache_keys[i])
        if pid:  # as if published one by one: two problems may share a cache key
            self.indexed.append((digest, pid, key))
        if batch.aliases:
            self.indexed += [(digest, alias, key) for alias in batch.aliases[i]]
        return (True, "new" if held is None and key not in old_rows else "replaced")

    @property
    def bytes(self) -> int:
        return sum(len(v[2]) + len(v[4] or "") for v in self.staged.values())

    def write(self, conn: sqlite3.Connection) -> None:
        """Write what is staged, rows in key order (the B-trees fill in order), many per statement."""
        conn.executemany("INSERT OR REPLACE INTO fingerprints VALUES (?, ?)", self.fingerprints.items())
        items = sorted(self.staged.items())
        write_rows(conn, "DELETE FROM decisions WHERE key IN ({})", "?", [k for k, _ in items if k in self.stored])
        write_rows(conn, "INSERT INTO decisions (key, owner, created, problem_id, record) VALUES {}",
                   "(?, ?, ?, ?, ?)", [(k, FARM, v[1], v[3] or None, v[2]) for k, v in items])
        write_rows(conn, "INSERT OR REPLACE INTO trials VALUES {}", "(?, ?)", [(k, v[4] or "[]") for k, v in items])
        write_index(conn, [(k, v[5]) for k, v in items])
        problems = {(d, pid): key for d, pid, key in self.indexed}  # a problem indexed twice: the later key
        write_rows(conn, "INSERT OR REPLACE INTO problems VALUES {}", "(?, ?, ?)",
                   [(d, pid, key) for (d, pid), key in sorted(problems.items())])
