"""Parquet archives of decisions, one folder per environment fingerprint (docs/archives.md).

The runtime's read side; the tools are ``farm_archives``, which the core never imports. Each name below is
imported from its module on first use: a runtime loads only what it needs (tests/test_archive_imports.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from farm.decisions import canonical_json, key_sha256
    from farm.stores.archive.files import read_regular
    from farm.stores.archive.manifest import archive_folders, is_archive, read_manifest
    from farm.stores.archive.schema import (
        ARCHIVE_SCHEMA_VERSION,
        DATA_FILES,
        DECISION_COLUMNS,
        DECISION_FIELDS,
        DECISIONS_FILE,
        KEY_PARTS,
        MANIFEST_FILE,
        READABLE_VERSIONS,
        ROW_GROUP_ROWS,
        TRIAL_COLUMNS,
        TRIAL_FIELDS,
        TRIAL_TYPES,
        TRIALS_FILE,
        ArchiveEntry,
        ArchiveError,
        arrow_schema,
        record_body,
        record_text,
        rekey,
    )
    from farm.stores.archive.signing import SIGNATURE_FILE, UNSIGNED_WARNING, Trust, read_trusted_keys
    from farm.stores.archive.store import ArchiveStore
    from farm.trustedkeys import PublicKey

__all__ = [
    "ARCHIVE_SCHEMA_VERSION", "ArchiveEntry", "ArchiveError", "ArchiveStore", "DATA_FILES", "DECISIONS_FILE",
    "DECISION_COLUMNS", "DECISION_FIELDS", "KEY_PARTS", "MANIFEST_FILE", "PublicKey", "READABLE_VERSIONS",
    "ROW_GROUP_ROWS", "SIGNATURE_FILE", "TRIALS_FILE", "TRIAL_COLUMNS", "TRIAL_FIELDS", "TRIAL_TYPES", "Trust",
    "UNSIGNED_WARNING", "archive_folders", "arrow_schema", "canonical_json", "is_archive", "key_sha256",
    "read_manifest", "read_regular", "read_trusted_keys", "record_body", "record_text", "rekey",
]
_NOT_SCHEMA = {  # the module of each name above that is not farm.stores.archive.schema's
    "farm.decisions": "canonical_json key_sha256",
    "farm.stores.archive.files": "read_regular",
    "farm.stores.archive.manifest": "archive_folders is_archive read_manifest",
    "farm.stores.archive.signing": "SIGNATURE_FILE UNSIGNED_WARNING Trust read_trusted_keys",
    "farm.stores.archive.store": "ArchiveStore",
    "farm.trustedkeys": "PublicKey",
}
_WHERE = dict.fromkeys(__all__, "farm.stores.archive.schema")
_WHERE.update((name, module) for module, names in _NOT_SCHEMA.items() for name in names.split())


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
