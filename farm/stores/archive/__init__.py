"""Parquet archives of decisions, one folder per environment fingerprint (docs/archives.md).

``schema`` (files, columns, the record text of a row), ``writer`` (schema 2, atomic folders), ``files`` (hostile-file
safe reading), ``reader``, ``rows``, ``trialjson`` and ``checks`` (verifying, batched, column-wise where it can),
``v1`` (schema 1, read only), ``signing`` (Ed25519 signatures of manifests, trusted keys), ``derived`` (the per-decision view ``inspect`` shows) and ``store`` (the runtime's
read-only fleet tier). The fleet-side operations (export, import, merge, diff) live in ``farm_coordinator.archive``. pyarrow is
imported lazily.
"""

from farm.stores.archive.derived import check_ranges, decision_row
from farm.stores.archive.reader import (
    Archive,
    archive_folders,
    is_archive,
    read_archive,
    read_manifest,
    read_regular,
)
from farm.stores.archive.rows import ArchiveRows
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
from farm.stores.archive.signing import (
    SIGNATURE_FILE,
    SigningKey,
    Trust,
    generate_keys,
    load_signing_key,
    read_trusted_keys,
    signing_key_from_env,
)
from farm.stores.archive.store import ArchiveStore
from farm.stores.archive.writer import WrittenArchive, swap_directory, write_archive
from farm.stores.base import canonical_json, key_sha256
from farm.trustedkeys import PublicKey

__all__ = [
    "ARCHIVE_SCHEMA_VERSION", "DATA_FILES", "DECISIONS_FILE", "DECISION_COLUMNS", "DECISION_FIELDS",
    "KEY_PARTS", "MANIFEST_FILE", "SIGNATURE_FILE", "PublicKey", "SigningKey", "Trust", "generate_keys",
    "load_signing_key", "read_trusted_keys", "signing_key_from_env", "READABLE_VERSIONS", "ROW_GROUP_ROWS", "TRIALS_FILE", "TRIAL_COLUMNS",
    "TRIAL_FIELDS", "TRIAL_TYPES", "Archive", "ArchiveEntry", "ArchiveError", "ArchiveRows", "ArchiveStore",
    "WrittenArchive", "archive_folders", "arrow_schema", "canonical_json", "check_ranges", "decision_row",
    "is_archive", "key_sha256", "read_archive", "read_manifest", "read_regular", "record_body", "record_text",
    "rekey", "swap_directory", "write_archive",
]
