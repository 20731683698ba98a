"""The disk tier: one JSON record per cache key, written atomically, safe for several processes at once."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from farm.atomicfile import write_atomic
from farm.stores.base import CorruptRecord, DecisionRecord


class DiskStore:
    """Records under ``directory/<sha256(key)>.json``; the full key is stored and compared on read.

    Writers never expose a partial file (temp + fsync + rename), so readers in other processes see the old
    record or the new one. Beyond ``capacity`` files the oldest by modification time are pruned.
    """

    def __init__(self, directory: Path | str, capacity: int) -> None:
        self.directory = Path(directory)
        self.capacity = capacity

    def path(self, cache_key: str) -> Path:
        return self.directory / (hashlib.sha256(cache_key.encode()).hexdigest() + ".json")

    def get(self, cache_key: str) -> DecisionRecord | None:
        try:
            raw = self.path(cache_key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CorruptRecord(f"unreadable record: {e}") from e
        return DecisionRecord.from_json(raw, expected_key=cache_key)

    def put(self, record: DecisionRecord) -> None:
        write_atomic(self.path(record.cache_key), record.to_json().encode())
        self._prune()

    def delete(self, cache_key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(cache_key))

    def _prune(self) -> None:
        entries = []
        for path in self.directory.glob("*.json"):
            with contextlib.suppress(FileNotFoundError):
                entries.append((path.stat().st_mtime, path))
        excess = len(entries) - self.capacity
        if excess <= 0:
            return
        entries.sort()
        for _, path in entries[:excess]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
