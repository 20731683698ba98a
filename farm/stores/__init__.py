"""Decision stores: the tiers behind the controller's memory.

``memory`` and ``disk`` (this process, this machine), ``redis`` (the fleet's decision cache; imports redis-py
lazily) and ``archive`` (Parquet archives per fingerprint; imports pyarrow lazily). Import the last two from their
modules: ``from farm.stores.archive import ArchiveStore``.
"""

from farm.stores.base import SCHEMA_VERSION, CorruptRecord, DecisionRecord, DecisionStore
from farm.stores.disk import DiskStore
from farm.stores.memory import MemoryStore

__all__ = ["SCHEMA_VERSION", "CorruptRecord", "DecisionRecord", "DecisionStore", "DiskStore", "MemoryStore"]
