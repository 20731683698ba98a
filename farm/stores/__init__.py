"""Decision stores: the tiers behind the controller's memory.

``memory`` and ``local`` (this process; this machine's one-file cache), ``redis`` (the fleet's decision cache; imports redis-py
lazily) and ``archive`` (Parquet archives per fingerprint; imports pyarrow lazily). Import the last two from their
modules: ``from farm.stores.archive import ArchiveStore``.
"""

from pathlib import Path

from farm.errors import CorruptRecord as CorruptRecord
from farm.stores.base import SCHEMA_VERSION as SCHEMA_VERSION
from farm.stores.base import DecisionRecord as DecisionRecord
from farm.stores.base import DecisionStore
from farm.stores.local import LocalStore
from farm.stores.memory import MemoryStore


def open_fleet_source(source: DecisionStore | str | Path, trusted_keys: tuple[str, ...] = ()) -> DecisionStore:
    """A fleet tier from a store, a Redis URL or an archive directory (Redis and pyarrow load lazily). An archive
    directory serves the archives signed by ``trusted_keys`` (key lines; empty: ``FARM_TRUSTED_KEYS``)."""
    if isinstance(source, str) and source.split("://", 1)[0] in ("redis", "rediss", "unix"):
        from farm.stores.redis import RedisDecisions

        return RedisDecisions(source)
    if isinstance(source, (str, Path)):
        from farm.stores.archive import ArchiveStore, Trust

        trust = Trust.from_env(trusted_keys="\n".join(trusted_keys)) if trusted_keys else None
        return ArchiveStore(Path(source), trust=trust)
    return source


__all__ = [
    "SCHEMA_VERSION", "CorruptRecord", "DecisionRecord", "DecisionStore", "LocalStore", "MemoryStore",
    "open_fleet_source",
]
