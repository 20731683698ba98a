"""The archive format: files, columns, the record text rebuilt from a row (docs/archives.md).

Schema 2 stores each record once, as columns from which its exact :meth:`DecisionRecord.to_json` text is
rebuilt (:func:`record_body`) and checked against the stored ``checksum``. pyarrow is imported lazily.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.environment import fingerprint_digest
from farm.errors import ArchiveError as ArchiveError
from farm.identity import CacheKey
from farm.stores.base import SCHEMA_VERSION, DecisionRecord, key_sha256

ARCHIVE_SCHEMA_VERSION = 2
READABLE_VERSIONS = (2,)  # schema 1 predates signatures: refused (farm.stores.archive.manifest)
DECISIONS_FILE = "decisions.parquet"
TRIALS_FILE = "trials.parquet"
MANIFEST_FILE = "manifest.json"
DATA_FILES = (DECISIONS_FILE, TRIALS_FILE)

# The parts of a cache key (farm.identity.CacheKey), in order, as the derived view names them.
KEY_PARTS = ("key_version", "scope", "operation_key", "environment", "workload", "execution_context",
             "reference_position", "manifest", "accuracy_key")

ROW_GROUP_ROWS = 1024  # decisions.parquet: a runtime hit decodes one row group
TRIAL_ROW_GROUP_ROWS = 65536  # trials.parquet is only ever read whole
PARQUET_VERSION_KEY = b"farm.archive.schema_version"
PARQUET_DIGEST_KEY = b"farm.archive.fingerprint_digest"

# (column, type name, nullable); sha256: 32 bytes. Each column, and how the cache key is rebuilt from the
# key's columns: docs/archives.md, "decisions.parquet" and "trials.parquet".
DECISION_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("key_version", "string", False), ("scope", "string", False), ("operation_key", "string", False),
    ("workload", "string", False), ("execution_context", "string", False), ("manifest", "string", False),
    ("accuracy_key", "string", False), ("key_hash", "int64", False), ("winner", "string", False),
    ("winner_index", "int32", False), ("reference_index", "int32", False), ("verified", "bool", False),
    ("ratio", "float64", False), ("created", "float64", False), ("meta_json", "string", False),
    ("checksum", "sha256", False), ("problem_id", "string", True),
)
DECISION_FIELDS = tuple(name for name, _, _ in DECISION_COLUMNS)
# Columns whose values repeat: dictionary-encoded (the rest is plain, then zstd).
DICTIONARY_COLUMNS = ("key_version", "scope", "operation_key", "execution_context", "manifest", "accuracy_key",
                      "winner", "problem_id")

# The trial row fields with their types: the one definition (farm_coordinator.aggregate imports TRIAL_FIELDS).
TRIAL_TYPES: tuple[tuple[str, str], ...] = (
    ("run", "string"), ("problem_id", "string"), ("group", "string"), ("role", "string"), ("candidate", "string"),
    ("candidate_index", "int32"), ("verdict", "string"), ("note", "string"), ("pair", "int32"),
    ("reference_seconds", "float64"), ("candidate_seconds", "float64"), ("max_abs_error", "float64"),
    ("max_rel_error", "float64"), ("host", "string"), ("device", "string"), ("worker", "string"),
    ("attempt", "int32"),
)
TRIAL_FIELDS = tuple(name for name, _ in TRIAL_TYPES)
TRIAL_COLUMNS: tuple[tuple[str, str, bool], ...] = (("decision", "int32", False),
                                                  *((name, kind, True) for name, kind in TRIAL_TYPES),
                                                  ("extra_json", "string", True))
TRIAL_KEYS = frozenset(TRIAL_FIELDS)
_TRIAL_NONNEGATIVE = ("candidate_index", "pair", "attempt", "reference_seconds", "candidate_seconds",
                      "max_abs_error", "max_rel_error")


def arrow_type(pa: Any, kind: str) -> Any:
    return {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(),
            "bool": pa.bool_(), "sha256": pa.binary(32)}[kind]


def arrow_schema(columns: Sequence[tuple[str, str, bool]], digest: str = "",
                 version: int = ARCHIVE_SCHEMA_VERSION) -> Any:
    """The explicit pyarrow schema of a table, with the archive's schema version in its metadata."""
    import pyarrow as pa

    schema = pa.schema([pa.field(name, arrow_type(pa, kind), nullable=nullable) for name, kind, nullable in columns])
    return schema.with_metadata({PARQUET_VERSION_KEY: str(version).encode(), PARQUET_DIGEST_KEY: digest.encode()})


_encode_string = json.encoder.encode_basestring_ascii  # json.dumps' own string form
_CHECKSUM_MARK = ',"checksum":"'


def record_body(key: str, created: float, index: int, meta_json: str, name: str, ratio: float,
                reference_index: int, verified: bool) -> str:
    """The canonical JSON of a record without its checksum, exactly as :meth:`DecisionRecord.to_json` encodes
    it (sorted keys, no spaces, ``meta`` as ``meta_json``): the record's checksum is the sha256 of this text."""
    return (f'{{"cache_key":{_encode_string(key)},"created":{created!r},"index":{index},"meta":{meta_json},'
            f'"name":{_encode_string(name)},"ratio":{ratio!r},"reference_index":{reference_index},'
            f'"schema":{SCHEMA_VERSION},"verified":{"true" if verified else "false"}}}')


def with_checksum(body: str, digest: bytes) -> str:
    """The :meth:`DecisionRecord.to_json` text of a body whose sha256 is ``digest``."""
    return f'{body[:-1]},"checksum":"{digest.hex()}"}}'


def key_hash64(digest: bytes) -> int:
    """Column ``key_hash``: the first 8 bytes of the key's sha256 as a signed big-endian integer."""
    return int.from_bytes(digest[:8], "big", signed=True)


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def record_text(raw: str | bytes) -> str | None:
    """``raw`` when it has the shape of :meth:`DecisionRecord.to_json` text (checksum last), else None. Only for
    text that :meth:`DecisionRecord.from_json` has just verified."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    at = text.rfind(_CHECKSUM_MARK)
    return text if at > 0 and text.endswith('"}') and len(text) - at == len(_CHECKSUM_MARK) + 66 else None


@dataclass(frozen=True)
class ArchiveEntry:
    """One decision of an archive: the record, the problem id indexed for it (None: none), and its trial rows."""

    record: DecisionRecord
    problem_id: str | None = None
    trials: tuple[dict[str, Any], ...] = ()
    text: str | None = field(default=None, compare=False, repr=False)
    """The record's verified :meth:`DecisionRecord.to_json` text when it was read as such (saves re-encoding)."""

    @property
    def key_sha256(self) -> str:
        return key_sha256(self.record.cache_key)

    @property
    def json(self) -> str:
        return self.text if self.text is not None else self.record.to_json()


def rekey(entry: ArchiveEntry, fingerprint: str) -> ArchiveEntry:
    """The entry under another environment fingerprint (``--force``): key and record rebuilt, meta with
    ``forced_from`` (docs/archives.md, "The fingerprint rule and ``--force``")."""
    record = entry.record
    key = CacheKey.decode(record.cache_key)
    if key.environment == fingerprint:
        return entry
    meta = {**record.meta, "forced_from": fingerprint_digest(key.environment)}
    if "fingerprint" in meta:
        meta["fingerprint"] = fingerprint_digest(fingerprint)
    new = DecisionRecord(key.replace(environment=fingerprint).encode(), record.index, record.reference_index,
                         record.name, record.verified, record.ratio, record.created, meta)
    return ArchiveEntry(new, entry.problem_id, entry.trials)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def check_trial_ranges(table: Any, path: Any, at: int = 0) -> None:
    """Columnar: the counts, indexes, seconds and errors of trial rows are null or >= 0."""
    import pyarrow.compute as pc

    for name in _TRIAL_NONNEGATIVE:
        column = table.column(name)
        ok = pc.fill_null(pc.invert(pc.less(column, 0)), True)
        i = pc.index(ok, False).as_py()
        if i >= 0:
            raise ArchiveError(f"{path}: row {at + i}: column {name!r} = {column[i].as_py()!r} is out of range "
                               f"(must be >= 0)")
