"""The in-memory tier: bounded, FIFO or LRU. Not locked itself: the controller calls it under its own lock."""

from __future__ import annotations

from collections import OrderedDict

from farm.policy import MemoryEviction
from farm.stores.base import DecisionRecord


class MemoryStore:
    """At most ``capacity`` records; FIFO evicts the oldest insert, LRU the least recently read."""

    def __init__(self, capacity: int, eviction: MemoryEviction = MemoryEviction.FIFO) -> None:
        self.capacity, self.eviction = capacity, eviction
        self._records: OrderedDict[str, DecisionRecord] = OrderedDict()
        self._lru = eviction is MemoryEviction.LRU

    def get(self, cache_key: str) -> DecisionRecord | None:
        record = self._records.get(cache_key)
        if record is not None and self._lru:
            self._records.move_to_end(cache_key)
        return record

    def put(self, record: DecisionRecord) -> list[str]:
        """Insert or replace; return the keys evicted to stay within capacity."""
        self._records.pop(record.cache_key, None)
        self._records[record.cache_key] = record
        return [self._records.popitem(last=False)[0] for _ in range(len(self._records) - self.capacity)]

    def delete(self, cache_key: str) -> None:
        self._records.pop(cache_key, None)

    def __len__(self) -> int:
        return len(self._records)

    def keys(self) -> list[str]:
        return list(self._records)
