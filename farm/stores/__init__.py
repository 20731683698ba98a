"""Decision stores: the tiers behind the controller's memory (memory, disk, and later Redis and Parquet)."""

from farm.stores.base import SCHEMA_VERSION, CorruptRecord, DecisionRecord, DecisionStore
from farm.stores.disk import DiskStore
from farm.stores.memory import MemoryStore

__all__ = ["SCHEMA_VERSION", "CorruptRecord", "DecisionRecord", "DecisionStore", "DiskStore", "MemoryStore"]
