"""The archive tools: writing, signing, reading and verifying whole Parquet archives of decisions, and the
operations of ``farm archive`` (export, import, inspect, merge, diff; docs/archives.md).

The core keeps what a runtime reads an archive with (``farm.stores.archive``: the read-only fleet tier, the format,
the checked manifest, trust in signatures) and never imports this package: ``import farm``, and a runtime with an
archive tier, load none of it (tests/test_archive_imports.py). Here: ``writer`` (atomic folders, signed by
``signing``), ``reader`` (a whole archive verified, batched), ``rows``, ``trialjson``, ``checks`` and ``columns``
(the verified decisions in columns, checked column-wise), ``derived`` (the per-decision view ``inspect`` shows),
``export``, ``imports`` (into Redis through ``redis_import``, or into a local cache) and ``operations`` (inspect,
merge, diff). pyarrow and cryptography are imported lazily.
"""

from __future__ import annotations

from farm_archives.derived import decision_row
from farm_archives.reader import Archive, read_archive
from farm_archives.rows import ArchiveRows
from farm_archives.signing import SigningKey, generate_keys, load_signing_key, signing_key_from_env
from farm_archives.writer import WrittenArchive, swap_directory, write_archive

__all__ = [
    "Archive", "ArchiveRows", "SigningKey", "WrittenArchive", "decision_row", "generate_keys", "load_signing_key",
    "read_archive", "signing_key_from_env", "swap_directory", "write_archive",
]
