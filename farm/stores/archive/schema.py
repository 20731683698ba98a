"""The archive format: files, columns, the row of a decision and its checks (docs/archives.md).

An archive holds the decisions of ONE environment fingerprint in one folder named by its digest::

    ARCHIVE_DIR/<fingerprint digest>/decisions.parquet   one row per decision (ARCHIVE_SCHEMA_VERSION 1)
                                     trials.parquet      every timing pair and verdict behind them
                                     manifest.json       fingerprint, schema version, row counts, bytes and sha256

pyarrow is imported lazily: ``import farm`` stays light.
"""

from __future__ import annotations

import functools
import json
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.environment import fingerprint_digest
from farm.errors import ArchiveError as ArchiveError
from farm.identity import KEY_VERSION, CacheKey, OperationKey, decode_manifest, manifest
from farm.stores.base import DecisionRecord, canonical_json, key_sha256

ARCHIVE_SCHEMA_VERSION = 1
DECISIONS_FILE = "decisions.parquet"
TRIALS_FILE = "trials.parquet"
MANIFEST_FILE = "manifest.json"
DATA_FILES = (DECISIONS_FILE, TRIALS_FILE)
ROW_GROUP_ROWS = 1024  # decisions.parquet: a runtime hit decodes one row group's record_json
TRIAL_ROW_GROUP_ROWS = 65536  # trials.parquet is only ever read whole
PARQUET_VERSION_KEY = b"farm.archive.schema_version"
PARQUET_DIGEST_KEY = b"farm.archive.fingerprint_digest"

# The parts of a cache key (farm.identity.cache_key), in order: the columns named after them.
KEY_PARTS = (
    "key_version", "scope", "operation_key", "environment", "workload", "execution_context", "reference_position",
    "manifest", "accuracy_key",
)

# (column, type name, nullable). Types: string, int32, float64, bool.
DECISION_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("key_sha256", "string", False),
    ("cache_key", "string", False),
    *((part, "string", False) for part in KEY_PARTS),
    ("operation", "string", False),
    ("device_kind", "string", True),
    ("spec_json", "string", True),
    ("problem_id", "string", True),
    ("winner", "string", False),
    ("winner_index", "int32", False),
    ("reference", "string", False),
    ("reference_index", "int32", False),
    ("ratio", "float64", False),
    ("relative_mad", "float64", True),
    ("verified", "bool", False),
    ("samples", "int32", True),
    ("created", "float64", False),
    ("farm_version", "string", True),
    ("run_id", "string", True),
    ("confirmation", "string", True),
    ("record_json", "string", False),
)
DECISION_FIELDS = tuple(name for name, _, _ in DECISION_COLUMNS)
_DECISION_GETTER = operator.itemgetter(*DECISION_FIELDS)

# The trial row fields with their types: the one definition (farm_coordinator.aggregate imports TRIAL_FIELDS).
TRIAL_TYPES: tuple[tuple[str, str], ...] = (
    ("run", "string"), ("problem_id", "string"), ("group", "string"), ("role", "string"), ("candidate", "string"),
    ("candidate_index", "int32"), ("verdict", "string"), ("note", "string"), ("pair", "int32"),
    ("reference_seconds", "float64"), ("candidate_seconds", "float64"), ("max_abs_error", "float64"),
    ("max_rel_error", "float64"), ("host", "string"), ("device", "string"), ("worker", "string"),
    ("attempt", "int32"),
)
TRIAL_FIELDS = tuple(name for name, _ in TRIAL_TYPES)
# key_sha256 ties a row to its decision; extra_json keeps fields a newer farm added to trial rows.
TRIAL_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("key_sha256", "string", False),
    *((name, kind, True) for name, kind in TRIAL_TYPES),
    ("extra_json", "string", True),
)
_TRIAL_KEYS = frozenset(TRIAL_FIELDS)
_TRIAL_GETTER = operator.itemgetter(*TRIAL_FIELDS)
_TRIAL_NONNEGATIVE = ("candidate_index", "pair", "attempt", "reference_seconds", "candidate_seconds",
                      "max_abs_error", "max_rel_error")
_INT32 = (-(2**31), 2**31 - 1)


def _arrow_type(pa: Any, kind: str) -> Any:
    return {"string": pa.string(), "int32": pa.int32(), "float64": pa.float64(), "bool": pa.bool_()}[kind]


def arrow_schema(columns: Sequence[tuple[str, str, bool]], digest: str = "") -> Any:
    """The explicit pyarrow schema of a table, with the archive's schema version in its metadata."""
    import pyarrow as pa

    schema = pa.schema([pa.field(name, _arrow_type(pa, kind), nullable=nullable) for name, kind, nullable in columns])
    return schema.with_metadata({PARQUET_VERSION_KEY: str(ARCHIVE_SCHEMA_VERSION).encode(),
                                 PARQUET_DIGEST_KEY: digest.encode()})


# -- entries and rows -------------------------------------------------------------------------------------------


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

    def row(self) -> dict[str, Any]:
        """The decisions.parquet row of this entry (see :func:`decision_row`)."""
        return decision_row(self.record, self.problem_id, self.text)


def record_text(raw: str | bytes) -> str | None:
    """``raw`` when it has the shape of :meth:`DecisionRecord.to_json` text (checksum last), else None. Only for
    text that :meth:`DecisionRecord.from_json` has just verified."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    at = text.rfind(_CHECKSUM_MARK)
    return text if at > 0 and text.endswith('"}') and len(text) - at == len(_CHECKSUM_MARK) + 66 else None


_CHECKSUM_MARK = ',"checksum":"'


def _meta_str(meta: Any, name: str) -> str | None:
    value = meta.get(name)
    return value if isinstance(value, str) else None


# The decision columns derived from the record and three parts of its key, in this order (see derived_scalars).
SCALAR_COLUMNS = (
    "operation", "device_kind", "spec_json", "winner", "winner_index", "reference", "reference_index", "ratio",
    "relative_mad", "verified", "samples", "created", "farm_version", "run_id", "confirmation",
)


def decision_row(record: DecisionRecord, problem_id: str | None, record_json: str | None = None) -> dict[str, Any]:
    """The columns of a decision. Everything but ``problem_id`` is derived from the record, so a reader can check
    that a row agrees with its ``record_json``. Raises ArchiveError for a key that is not a v1 cache key or whose
    winner or reference is not in the key's candidate manifest."""
    key = record.cache_key
    parts = key_columns(key)
    scalars = derived_scalars(record, parts["operation_key"], parts["reference_position"], parts["manifest"])
    return {
        "key_sha256": key_sha256(key),
        "cache_key": key,
        **parts,
        **dict(zip(SCALAR_COLUMNS, scalars, strict=True)),
        "problem_id": problem_id,
        "record_json": record.to_json() if record_json is None else record_json,
    }


def key_columns(key: str) -> dict[str, str]:
    """The key's parts by column name (``KEY_PARTS``), read through :class:`farm.identity.CacheKey`; ArchiveError
    for a key that is not a canonical v1 cache key."""
    try:
        parsed = CacheKey.decode(key)
    except ValueError as e:  # UnicodeDecodeError included
        raise ArchiveError(f"cache key is not a {KEY_VERSION} key: {e}") from e
    if parsed.version != KEY_VERSION:
        raise ArchiveError(f"cache key is not a {KEY_VERSION} key (version {parsed.version!r})")
    return {
        "key_version": parsed.version, "scope": parsed.scope, "operation_key": parsed.operation,
        "environment": parsed.environment, "workload": parsed.workload, "execution_context": parsed.execution_context,
        "reference_position": str(parsed.reference), "manifest": manifest(parsed.candidates),
        "accuracy_key": parsed.accuracy.encode(),
    }


@functools.lru_cache(maxsize=1024)
def _operation_parts(operation_key: str) -> tuple[str | None, str | None]:
    op = OperationKey.decode(operation_key)  # the runtime adapter's operation key, or text of another form
    return (op.name, op.device_kind) if op is not None else (None, None)


def derived_scalars(record: DecisionRecord, operation_key: str, reference_position: str, manifest: str,
                    spec_json: str | None = None) -> tuple[Any, ...]:
    """The values of ``SCALAR_COLUMNS`` for a record whose key has these operation, reference-position and
    manifest parts. ``spec_json``: a stored column to reuse when it holds the record's spec (saves encoding)."""
    names = _manifest_names(manifest)
    if str(record.reference_index) != reference_position:
        raise ArchiveError(f"field 'reference_index' = {record.reference_index} differs from the key's reference "
                           f"position {reference_position!r}")
    for what, index in (("winner_index", record.index), ("reference_index", record.reference_index)):
        if not 0 <= index < len(names):
            raise ArchiveError(f"field {what!r} = {index} is out of range for {len(names)} candidates")
    if names[record.index] != record.name:
        raise ArchiveError(f"field 'winner' = {record.name!r} is not candidate {record.index} of the key "
                           f"({names[record.index]!r})")
    meta = record.meta
    operation = _meta_str(meta, "operation")
    device_kind = _meta_str(meta, "device_kind")
    if operation is None or device_kind is None:
        op_name, op_kind = _operation_parts(operation_key)
        operation = operation or op_name
        device_kind = device_kind or op_kind
    mad: Any = meta.get("relative_mad")
    samples = meta.get("samples")
    spec = meta.get("spec")
    if spec is None:
        spec_json = None
    elif spec_json is None or _loads(spec_json) != spec:
        spec_json = canonical_json(spec)
    return (
        operation or operation_key, device_kind, spec_json, record.name, record.index,
        names[record.reference_index], record.reference_index, record.ratio,
        float(mad) if _number(mad) and math.isfinite(mad) and mad >= 0 else None, record.verified,
        samples if isinstance(samples, int) and not isinstance(samples, bool) and 0 <= samples <= _INT32[1] else None,
        record.created, _meta_str(meta, "farm_version"), _meta_str(meta, "run"), _meta_str(meta, "confirmation"),
    )


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@functools.lru_cache(maxsize=1024)
def _manifest_names(manifest: str) -> tuple[str, ...]:
    try:
        return tuple(c.name for c in decode_manifest(manifest))
    except ValueError as e:  # UnicodeDecodeError included
        raise ArchiveError(f"the key's candidate manifest cannot be read: {e}") from e


def check_ranges(row: dict[str, Any]) -> None:
    """Refuse out-of-range values (ArchiveError naming the column)."""
    ratio = row["ratio"]
    if not (_number(ratio) and math.isfinite(ratio) and ratio > 0):
        raise ArchiveError(f"column 'ratio' = {ratio!r} is out of range (must be finite and > 0)")
    for name in ("winner_index", "reference_index"):
        if not (isinstance(row[name], int) and row[name] >= 0):
            raise ArchiveError(f"column {name!r} = {row[name]!r} is out of range (must be >= 0)")
    created = row["created"]
    if not (_number(created) and math.isfinite(created) and created >= 0):
        raise ArchiveError(f"column 'created' = {created!r} is out of range (must be finite and >= 0)")
    mad = row["relative_mad"]
    if mad is not None and not (math.isfinite(mad) and mad >= 0):
        raise ArchiveError(f"column 'relative_mad' = {mad!r} is out of range (must be null or finite and >= 0)")
    if row["samples"] is not None and row["samples"] < 0:
        raise ArchiveError(f"column 'samples' = {row['samples']!r} is out of range (must be null or >= 0)")


def rekey(entry: ArchiveEntry, fingerprint: str) -> ArchiveEntry:
    """The entry under another environment fingerprint (``--force``): the key's environment part is replaced, the
    record rebuilt (so its checksum is right) and its meta gains ``forced_from`` (the old digest); a meta
    ``fingerprint`` digest is updated. Trial rows and the problem id are kept."""
    record = entry.record
    key = CacheKey.decode(record.cache_key)
    old = key.environment
    if old == fingerprint:
        return entry
    meta = dict(record.meta)
    meta["forced_from"] = fingerprint_digest(old)
    if "fingerprint" in meta:
        meta["fingerprint"] = fingerprint_digest(fingerprint)
    new = DecisionRecord(key.replace(environment=fingerprint).encode(), record.index, record.reference_index, record.name, record.verified,
                         record.ratio, record.created, meta)
    return ArchiveEntry(new, entry.problem_id, entry.trials)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _same(a: Any, b: Any) -> bool:
    if _number(a) and _number(b):
        return bool(a == b or (math.isnan(a) and math.isnan(b)))
    return type(a) is type(b) and bool(a == b)


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
