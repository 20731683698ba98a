"""Parquet archives of decisions: the schema, the writer, the verifying reader and the runtime's read-only tier.

An archive holds the decisions of ONE environment fingerprint in one folder named by its digest::

    ARCHIVE_DIR/<fingerprint digest>/decisions.parquet   one row per decision (ARCHIVE_SCHEMA_VERSION 1)
                                     trials.parquet      every timing pair and verdict behind them
                                     manifest.json       fingerprint, schema version, row counts, sha256 of each file

``docs/archives.md`` documents every column. The reader trusts nothing: schema version, byte counts and sha256 of
each file, the Parquet schema, every record's own checksum (``record_json`` is the exact
:meth:`DecisionRecord.to_json` text), the agreement of every column with that record, value ranges, duplicate keys
and the fingerprint of every key are checked, and any failure is an :class:`ArchiveError` naming the file, the row
and the field. Writes are atomic: the folder is built beside its target and renamed into place.

:class:`ArchiveStore` serves archives to the runtime as a fleet tier (``StackTuner(policy, fleet=[...])``).

pyarrow is imported lazily: ``import farm`` stays light.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import functools
import hashlib
import json
import logging
import math
import operator
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.atomicfile import fsync_directory
from farm.environment import farm_version, fingerprint_digest
from farm.errors import ArchiveError, TuneFailure
from farm.identity import KEY_VERSION, CacheKey, OperationKey, key_environment, manifest
from farm.stores.base import CorruptRecord, DecisionRecord, replaces

log = logging.getLogger(__name__)

ARCHIVE_SCHEMA_VERSION = 1
DECISIONS_FILE = "decisions.parquet"
TRIALS_FILE = "trials.parquet"
MANIFEST_FILE = "manifest.json"
DATA_FILES = (DECISIONS_FILE, TRIALS_FILE)
ROW_GROUP_ROWS = 1024  # decisions.parquet: a runtime hit decodes one row group's record_json
TRIAL_ROW_GROUP_ROWS = 65536  # trials.parquet is only ever read whole
PARQUET_VERSION_KEY = b"farm.archive.schema_version"
PARQUET_DIGEST_KEY = b"farm.archive.fingerprint_digest"

# The parts of a cache key (farm.identity.CacheKey), in order: the columns named after them.
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
# Every decision column except these two is derived from record_json and must agree with it.
_FREE_COLUMNS = ("problem_id", "record_json")
_CHECKED_GETTER = operator.itemgetter(*(name for name in DECISION_FIELDS if name not in _FREE_COLUMNS))

# The trial row fields (farm_coordinator.aggregate.TRIAL_FIELDS, which the tests keep equal) with their types.
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


def key_sha256(cache_key: str) -> str:
    """The archive's (and Redis') name of a cache key: its sha256 (= farm.stores.redis.field_for)."""
    return hashlib.sha256(cache_key.encode()).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


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


def decision_row(record: DecisionRecord, problem_id: str | None, record_json: str | None = None) -> dict[str, Any]:
    """The columns of a decision. Everything but ``problem_id`` is derived from the record, so a reader can check
    that a row agrees with its ``record_json``. Raises ArchiveError for a key that is not a v1 cache key or whose
    winner or reference is not in the key's candidate manifest."""
    key = record.cache_key
    parsed = _parse_key(key)
    names = parsed.names
    if record.reference_index != parsed.reference:
        raise ArchiveError(f"field 'reference_index' = {record.reference_index} differs from the key's reference "
                           f"position {str(parsed.reference)!r}")
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
        op = OperationKey.decode(parsed.operation)  # the runtime adapter's operation key
        if op is not None:
            operation = operation or op.name
            device_kind = device_kind or op.device_kind
    mad: Any = meta.get("relative_mad")
    samples = meta.get("samples")
    spec = meta.get("spec")
    row = {
        "key_sha256": key_sha256(key),
        "cache_key": key,
        "key_version": parsed.version,
        "scope": parsed.scope,
        "operation_key": parsed.operation,
        "environment": parsed.environment,
        "workload": parsed.workload,
        "execution_context": parsed.execution_context,
        "reference_position": str(parsed.reference),
        "manifest": manifest(parsed.candidates),
        "accuracy_key": parsed.accuracy.encode(),
        "operation": operation or parsed.operation,
        "device_kind": device_kind,
        "spec_json": canonical_json(spec) if spec is not None else None,
        "problem_id": problem_id,
        "winner": record.name,
        "winner_index": record.index,
        "reference": names[record.reference_index],
        "reference_index": record.reference_index,
        "ratio": record.ratio,
        "relative_mad": float(mad) if _number(mad) and math.isfinite(mad) and mad >= 0 else None,
        "verified": record.verified,
        "samples": samples if isinstance(samples, int) and not isinstance(samples, bool)
        and 0 <= samples <= _INT32[1] else None,
        "created": record.created,
        "farm_version": _meta_str(meta, "farm_version"),
        "run_id": _meta_str(meta, "run"),
        "confirmation": _meta_str(meta, "confirmation"),
        "record_json": record.to_json() if record_json is None else record_json,
    }
    return row


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@functools.lru_cache(maxsize=1024)
def _parse_key(key: str) -> CacheKey:
    try:
        parsed = CacheKey.decode(key)
    except ValueError as e:  # UnicodeDecodeError included
        raise ArchiveError(f"cache key is not a {KEY_VERSION} key: {e}") from e
    if parsed.version != KEY_VERSION:
        raise ArchiveError(f"cache key is not a {KEY_VERSION} key (version {parsed.version!r})")
    return parsed


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


# -- writing ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WrittenArchive:
    path: Path
    decisions: int
    trials: int
    bytes: int


def write_archive(parent: Path | str, fingerprint: str, entries: Iterable[ArchiveEntry], *,
                  created: float | None = None, skipped: list[str] | None = None) -> WrittenArchive:
    """Write the archive of ``fingerprint`` to ``parent/<digest>/``, atomically replacing any archive there.

    Every entry is checked as a reader would check it (key structure, fingerprint, ranges); two entries with the
    same key must be identical. A bad entry is an ArchiveError, or, given a ``skipped`` list, left out with the
    reason appended there (exports skip what cannot be archived). Rows are sorted by ``key_sha256``, so the same
    decisions give the same files.
    """
    import pyarrow as pa

    digest = fingerprint_digest(fingerprint)
    by_key: dict[str, tuple[dict[str, Any], ArchiveEntry]] = {}
    for entry in entries:
        record = entry.record
        sha = key_sha256(record.cache_key)
        try:
            try:
                row = decision_row(record, entry.problem_id, entry.text)
                check_ranges(row)
            except ArchiveError as e:
                raise ArchiveError(f"decision {sha[:12]}: {e}") from None
            if row["environment"] != fingerprint:
                raise ArchiveError(f"decision {sha[:12]}: its key's environment is not the archive's fingerprint "
                                   f"{digest}")
            seen = by_key.get(sha)
            if seen is not None and (seen[0] != row or seen[1].trials != entry.trials):
                raise ArchiveError(f"decision {sha[:12]}: two different entries for one cache key")
        except ArchiveError as e:
            if skipped is None:
                raise
            skipped.append(str(e))
            continue
        by_key[sha] = (row, entry)
    ordered = [by_key[sha] for sha in sorted(by_key)]

    decision_rows = [_DECISION_GETTER(row) for row, _ in ordered]
    columns = list(zip(*decision_rows, strict=True)) if decision_rows else [() for _ in DECISION_FIELDS]
    decisions = pa.Table.from_pydict(
        {name: _column(pa, list(values), kind, name, DECISIONS_FILE)
         for (name, kind, _), values in zip(DECISION_COLUMNS, columns, strict=True)},
        schema=arrow_schema(DECISION_COLUMNS, digest))
    shas: list[str] = []
    values: list[tuple[Any, ...]] = []
    extras: list[str | None] = []
    for row, entry in ordered:
        sha = row["key_sha256"]
        for i, trial in enumerate(entry.trials):
            if not isinstance(trial, dict):
                raise ArchiveError(f"decision {sha[:12]}: trial row {i} is a {type(trial).__name__}, not an object")
            tie = trial.get("key_sha256", sha)
            if tie != sha:
                raise ArchiveError(f"decision {sha[:12]}: trial row {i} has field 'key_sha256' = {_short(tie)}")
            shas.append(sha)
            if trial.keys() == _TRIAL_KEYS:
                values.append(_TRIAL_GETTER(trial))
                extras.append(None)
            else:
                values.append(tuple(trial.get(name) for name in TRIAL_FIELDS))
                extra = {k: v for k, v in trial.items() if k not in _TRIAL_KEYS and k != "key_sha256"}
                extras.append(canonical_json(extra) if extra else None)
    trial_columns = list(zip(*values, strict=True)) if values else [() for _ in TRIAL_FIELDS]
    trials = pa.Table.from_pydict(
        {name: _column(pa, list(column), kind, name, TRIALS_FILE)
         for (name, kind, _), column in zip(TRIAL_COLUMNS, [shas, *trial_columns, extras], strict=True)},
        schema=arrow_schema(TRIAL_COLUMNS, digest))
    _check_trial_ranges(trials, TRIALS_FILE)

    blobs = {DECISIONS_FILE: _parquet_bytes(decisions, ROW_GROUP_ROWS),
             TRIALS_FILE: _parquet_bytes(trials, TRIAL_ROW_GROUP_ROWS)}
    manifest = {
        "schema_version": ARCHIVE_SCHEMA_VERSION,
        "fingerprint": fingerprint,
        "digest": digest,
        "farm_version": farm_version(),
        "created": time.time() if created is None else created,
        "rows": {"decisions": decisions.num_rows, "trials": trials.num_rows},
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in blobs.items()},
        "bytes": {name: len(data) for name, data in blobs.items()},
    }
    blobs[MANIFEST_FILE] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    target = Path(parent) / digest
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{digest}.tmp-"))
    try:
        for name, data in blobs.items():
            with open(staging / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        fsync_directory(staging)
        swap_directory(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return WrittenArchive(target, decisions.num_rows, trials.num_rows, sum(len(b) for b in blobs.values()))


def _column(pa: Any, values: list[Any], kind: str, name: str, file: str) -> Any:
    try:
        return pa.array(values, type=_arrow_type(pa, kind))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as e:
        for i, value in enumerate(values):  # name the first value that does not fit
            try:
                pa.array([value], type=_arrow_type(pa, kind))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
                raise ArchiveError(f"{file}: row {i}: field {name!r} = {value!r} is not a {kind}") from e
        raise ArchiveError(f"{file}: column {name!r}: {e}") from e


def _parquet_bytes(table: Any, row_group_rows: int) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=row_group_rows)
    return bytes(sink.getvalue().to_pybytes())


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with Linux renameat2(RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOENT):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_directory(staging: Path, target: Path) -> None:
    """Put the complete folder ``staging`` at ``target`` (same parent), replacing what was there.

    Where the kernel can (Linux renameat2 RENAME_EXCHANGE), the swap is one atomic step: readers see the old
    folder or the new one. Elsewhere the old folder is renamed aside (``.<name>.old-*``) and the new one renamed
    in: a crash between the two renames leaves ``target`` missing and the previous content intact in the
    ``.old-*`` folder (rename it back). The old folder is removed afterwards.
    """
    parent = target.parent
    if target.exists() and _exchange(staging, target):
        fsync_directory(parent)
        shutil.rmtree(staging, ignore_errors=True)
        return
    if target.exists():
        aside = Path(tempfile.mkdtemp(dir=parent, prefix=f".{target.name}.old-"))
        os.rmdir(aside)
        os.replace(target, aside)
        try:
            os.replace(staging, target)
        except BaseException:
            os.replace(aside, target)
            raise
        fsync_directory(parent)
        shutil.rmtree(aside, ignore_errors=True)
        return
    os.replace(staging, target)
    fsync_directory(parent)


# -- reading and verification -----------------------------------------------------------------------------------


@dataclass
class Archive:
    """A verified archive: its manifest and its decisions by ``key_sha256`` (file order)."""

    path: Path
    manifest: dict[str, Any]
    entries: dict[str, ArchiveEntry] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["fingerprint"])

    @property
    def digest(self) -> str:
        return str(self.manifest["digest"])

    @property
    def trial_rows(self) -> int:
        return sum(len(e.trials) for e in self.entries.values())


def is_archive(path: Path) -> bool:
    return (path / MANIFEST_FILE).is_file()


def archive_folders(path: Path | str) -> list[Path]:
    """``path`` itself when it is one archive (holds manifest.json), else every archive folder directly inside it
    (hidden temp folders skipped), sorted. ArchiveError when the path is missing or holds no archive."""
    path = Path(path)
    if not path.is_dir():
        raise ArchiveError(f"{path}: no such archive directory")
    if is_archive(path):
        return [path]
    found = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".") and is_archive(p))
    if not found:
        raise ArchiveError(f"{path}: holds no archive (no {MANIFEST_FILE} in it or in its folders)")
    return found


def read_manifest(folder: Path) -> dict[str, Any]:
    """Parse and check manifest.json: schema version, fingerprint and digest (= the folder name), row counts,
    checksums. ArchiveError naming the field otherwise."""
    path = folder / MANIFEST_FILE
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ArchiveError(f"{path}: missing") from None
    except (OSError, ValueError) as e:
        raise ArchiveError(f"{path}: not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise ArchiveError(f"{path}: a {type(data).__name__}, not an object")
    version = data.get("schema_version")
    if version != ARCHIVE_SCHEMA_VERSION or isinstance(version, bool):
        raise ArchiveError(f"{path}: field 'schema_version' = {version!r}: this farm reads archive schema version "
                           f"{ARCHIVE_SCHEMA_VERSION} only")
    fingerprint = data.get("fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise ArchiveError(f"{path}: field 'fingerprint' = {fingerprint!r}: must be the fingerprint text")
    digest = fingerprint_digest(fingerprint)
    if data.get("digest") != digest:
        raise ArchiveError(f"{path}: field 'digest' = {data.get('digest')!r} is not the digest of field "
                           f"'fingerprint' ({digest})")
    if folder.name != digest:
        raise ArchiveError(f"{path}: the folder is named {folder.name!r}, not after its fingerprint digest {digest}")
    rows = data.get("rows")
    if not isinstance(rows, dict):
        raise ArchiveError(f"{path}: field 'rows' = {rows!r}: must be an object")
    for name in ("decisions", "trials"):
        n = rows.get(name)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ArchiveError(f"{path}: field 'rows.{name}' = {n!r}: must be a count")
    sums = data.get("sha256")
    if not isinstance(sums, dict):
        raise ArchiveError(f"{path}: field 'sha256' = {sums!r}: must be an object")
    for name in DATA_FILES:
        value = sums.get(name)
        if not (isinstance(value, str) and len(value) == 64):
            raise ArchiveError(f"{path}: field 'sha256.{name}' = {value!r}: must be a sha256 hex digest")
    sizes = data.get("bytes")
    if sizes is not None and not (isinstance(sizes, dict) and all(isinstance(sizes.get(n), int) for n in DATA_FILES)):
        raise ArchiveError(f"{path}: field 'bytes' = {sizes!r}: must hold the byte count of each file")
    return data


def _verified_bytes(folder: Path, name: str, manifest: dict[str, Any]) -> bytes:
    path = folder / name
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ArchiveError(f"{path}: missing") from None
    except OSError as e:
        raise ArchiveError(f"{path}: unreadable: {e}") from None
    sizes = manifest.get("bytes")
    if isinstance(sizes, dict) and sizes.get(name) != len(data):
        raise ArchiveError(f"{path}: {len(data)} bytes, but {MANIFEST_FILE} field 'bytes.{name}' says "
                           f"{sizes.get(name)} (truncated or replaced)")
    actual = hashlib.sha256(data).hexdigest()
    if actual != manifest["sha256"][name]:
        raise ArchiveError(f"{path}: sha256 {actual[:16]}… does not match {MANIFEST_FILE} field 'sha256.{name}' "
                           f"({manifest['sha256'][name][:16]}…): the file was modified or is truncated")
    return data


def _parquet_file(path: Path, data: bytes, columns: Sequence[tuple[str, str, bool]], digest: str,
                  rows: int) -> Any:
    """Open verified bytes as Parquet and check the schema and row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ArchiveError(f"{path}: not a readable Parquet file: {e}") from None
    expected = arrow_schema(columns, digest)
    meta = schema.metadata or {}
    if meta.get(PARQUET_VERSION_KEY) != str(ARCHIVE_SCHEMA_VERSION).encode():
        raise ArchiveError(f"{path}: Parquet metadata {PARQUET_VERSION_KEY.decode()!r} = "
                           f"{meta.get(PARQUET_VERSION_KEY)!r}, expected {ARCHIVE_SCHEMA_VERSION}")
    if meta.get(PARQUET_DIGEST_KEY) != digest.encode():
        raise ArchiveError(f"{path}: Parquet metadata {PARQUET_DIGEST_KEY.decode()!r} = "
                           f"{meta.get(PARQUET_DIGEST_KEY)!r}, expected {digest!r}")
    if not schema.equals(expected, check_metadata=False):
        want = {f.name: f for f in expected}
        have = {f.name: f for f in schema}
        for name in want.keys() | have.keys():
            if name not in have:
                raise ArchiveError(f"{path}: column {name!r} is missing")
            if name not in want:
                raise ArchiveError(f"{path}: column {name!r} is not in schema version {ARCHIVE_SCHEMA_VERSION}")
            if not have[name].equals(want[name]):
                raise ArchiveError(f"{path}: column {name!r} is {have[name].type}"
                                   f"{'' if have[name].nullable else ' not null'}, expected {want[name].type}"
                                   f"{'' if want[name].nullable else ' not null'}")
        raise ArchiveError(f"{path}: columns are not in the order of schema version {ARCHIVE_SCHEMA_VERSION}")
    if pf.metadata.num_rows != rows:
        raise ArchiveError(f"{path}: {pf.metadata.num_rows} rows, but {MANIFEST_FILE} field "
                           f"'rows.{path.stem}' says {rows}")
    return pf


def _read_table(path: Path, pf: Any, columns: Sequence[tuple[str, str, bool]]) -> Any:
    import pyarrow as pa

    try:
        table = pf.read()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ArchiveError(f"{path}: not a readable Parquet file: {e}") from None
    for name, _, nullable in columns:
        if not nullable and table.column(name).null_count:
            raise ArchiveError(f"{path}: column {name!r} holds {table.column(name).null_count} nulls")
    return table


def _same(a: Any, b: Any) -> bool:
    if _number(a) and _number(b):
        return bool(a == b or (math.isnan(a) and math.isnan(b)))
    return type(a) is type(b) and bool(a == b)


def read_archive(folder: Path | str, *, trials: bool = True) -> Archive:
    """Read and verify one archive folder completely; ArchiveError (naming file, row and field) on any problem.

    Exact duplicate decision rows are read once; two different rows for one key are refused.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    digest = manifest["digest"]
    fingerprint = manifest["fingerprint"]
    data = _verified_bytes(folder, DECISIONS_FILE, manifest)
    trial_data = _verified_bytes(folder, TRIALS_FILE, manifest) if trials else b""
    path = folder / DECISIONS_FILE
    pf = _parquet_file(path, data, DECISION_COLUMNS, digest, manifest["rows"]["decisions"])
    table = _read_table(path, pf, DECISION_COLUMNS)
    columns = [table.column(name).to_pylist() for name in DECISION_FIELDS]
    entries: dict[str, ArchiveEntry] = {}
    texts: dict[str, tuple[str, str | None]] = {}
    json_at = DECISION_FIELDS.index("record_json")
    for i, values in enumerate(zip(*columns, strict=True)):
        row = dict(zip(DECISION_FIELDS, values, strict=True))
        where = f"{path}: row {i} (key {str(row['key_sha256'])[:12]})"
        try:
            check_ranges(row)
            if record_text(values[json_at]) is None:
                raise ArchiveError("column 'record_json' is not DecisionRecord.to_json text (checksum last)")
            try:
                record = DecisionRecord.from_json(values[json_at], expected_key=row["cache_key"])
            except CorruptRecord as e:
                raise ArchiveError(f"column 'record_json': {e}") from None
            derived = decision_row(record, row["problem_id"], values[json_at])
        except ArchiveError as e:
            raise ArchiveError(f"{where}: {e}") from None
        if derived["environment"] != fingerprint:
            raise ArchiveError(f"{where}: column 'environment': the key's fingerprint (digest "
                               f"{fingerprint_digest(derived['environment'])}) is not the manifest's ({digest})")
        if _CHECKED_GETTER(row) != _CHECKED_GETTER(derived):  # (column types are fixed by the schema)
            for name in DECISION_FIELDS:
                if name not in _FREE_COLUMNS and not _same(row[name], derived[name]):
                    raise ArchiveError(f"{where}: column {name!r} = {_short(row[name])} disagrees with "
                                       f"record_json ({_short(derived[name])})")
        pid = row["problem_id"]
        sha = row["key_sha256"]
        seen = texts.get(sha)
        if seen is not None:
            if seen != (values[json_at], pid):
                raise ArchiveError(f"{where}: duplicate key with a conflicting row (the key first appears with "
                                   f"winner {entries[sha].record.name!r}, created {entries[sha].record.created!r})")
            continue
        texts[sha] = (values[json_at], pid)
        entries[sha] = ArchiveEntry(record, pid, (), values[json_at])
    archive = Archive(folder, manifest, entries)
    if trials:
        _attach_trials(archive, folder / TRIALS_FILE, trial_data)
    return archive


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _check_trial_ranges(table: Any, path: Path | str) -> None:
    import numpy as np

    for name in _TRIAL_NONNEGATIVE:
        values = table.column(name).to_numpy(zero_copy_only=False).astype(float)
        bad = np.flatnonzero(np.nan_to_num(values, nan=0.0, posinf=0.0) < 0)
        if bad.size:
            i = int(bad[0])
            raise ArchiveError(f"{path}: row {i}: column {name!r} = {values[i]!r} is out of range (must be >= 0)")


def _attach_trials(archive: Archive, path: Path, data: bytes) -> None:
    manifest = archive.manifest
    pf = _parquet_file(path, data, TRIAL_COLUMNS, archive.digest, manifest["rows"]["trials"])
    table = _read_table(path, pf, TRIAL_COLUMNS)
    _check_trial_ranges(table, path)
    keys = table.column("key_sha256").to_pylist()
    values = [table.column(name).to_pylist() for name in TRIAL_FIELDS]
    extras = table.column("extra_json").to_pylist()
    grouped: dict[str, list[dict[str, Any]]] = {}
    for i, (key, row_values, extra) in enumerate(zip(keys, zip(*values, strict=True), extras, strict=True)):
        rows = grouped.get(key)
        if rows is None:
            if key not in archive.entries:
                raise ArchiveError(f"{path}: row {i}: column 'key_sha256' = {key[:12]}… names no decision of the "
                                   f"archive")
            rows = grouped[key] = []
        row = dict(zip(TRIAL_FIELDS, row_values, strict=True))
        if extra is not None:
            try:
                more = json.loads(extra)
            except ValueError as e:
                raise ArchiveError(f"{path}: row {i}: column 'extra_json' is not JSON: {e}") from None
            if not isinstance(more, dict) or set(more) & set(TRIAL_FIELDS):
                raise ArchiveError(f"{path}: row {i}: column 'extra_json' must be an object of other fields")
            row.update(more)
        rows.append(row)
    for key, rows in grouped.items():
        entry = archive.entries[key]
        archive.entries[key] = ArchiveEntry(entry.record, entry.problem_id, tuple(rows), entry.text)


# -- the runtime's fleet tier -----------------------------------------------------------------------------------


class _Loaded:
    """One archive's decisions for lookups: the verified file bytes, key_sha256 -> row, a few decoded groups."""

    def __init__(self, folder: Path, manifest: dict[str, Any], row_groups: int) -> None:
        path = folder / DECISIONS_FILE
        data = _verified_bytes(folder, DECISIONS_FILE, manifest)
        self.pf = _parquet_file(path, data, DECISION_COLUMNS, manifest["digest"], manifest["rows"]["decisions"])
        self.path = path
        self.starts: list[int] = []
        at = 0
        for g in range(self.pf.num_row_groups):
            self.starts.append(at)
            at += self.pf.metadata.row_group(g).num_rows
        try:
            keys = self.pf.read(columns=["key_sha256"]).column(0).to_pylist()
        except Exception as e:
            raise ArchiveError(f"{path}: not a readable Parquet file: {e}") from None
        self.rows = dict(zip(keys, range(len(keys)), strict=True))
        self.groups: OrderedDict[int, Any] = OrderedDict()
        self.max_groups = row_groups

    def text(self, row: int) -> str:
        g = bisect.bisect_right(self.starts, row) - 1
        column = self.groups.get(g)
        if column is None:
            column = self.pf.read_row_group(g, columns=["record_json"]).column(0)
            self.groups[g] = column
            if len(self.groups) > self.max_groups:
                self.groups.popitem(last=False)
        else:
            self.groups.move_to_end(g)
        return str(column[row - self.starts[g]].as_py())


class ArchiveStore:
    """A read-only fleet tier over archive directories (each one archive folder or a folder of them).

    Folders are discovered and their manifests checked at construction (ArchiveError for a missing directory or
    a bad manifest). An archive is loaded on the first lookup of its fingerprint (or by :meth:`load`): its
    decisions.parquet is read once, checked against the manifest's byte count and sha256, and only its
    ``key_sha256`` column is indexed; a hit decodes the ``record_json`` of one row group (kept in a small LRU of
    ``row_groups`` groups per archive) and parses and verifies that one record. Memory is bounded by the
    compressed file, the index and the decoded groups. An archive that fails to load is logged once and every
    lookup that needed it raises CorruptRecord (the controller counts a cache warning and treats it as a miss).
    When several archives hold the key, the replacement rule picks the record (``farm.stores.base.replaces``).

    ``put`` raises TuneFailure UNAVAILABLE (archives are written by ``farm archive``, never by the runtime);
    ``delete`` is a no-op (the controller never deletes from the fleet tier; it forgets in memory).
    """

    def __init__(self, *directories: Path | str, row_groups: int = 4) -> None:
        self.directories = tuple(Path(d) for d in directories)
        self.row_groups = row_groups
        self._manifests: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
        for directory in self.directories:
            for folder in archive_folders(directory):
                manifest = read_manifest(folder)
                self._manifests.setdefault(manifest["digest"], []).append((folder, manifest))
        self._loaded: dict[str, list[_Loaded]] = {}
        self._broken: dict[str, str] = {}
        self._digests: dict[str, str] = {}
        self._lock = threading.Lock()
        self.lookups = 0

    @property
    def digests(self) -> tuple[str, ...]:
        return tuple(sorted(self._manifests))

    def load(self) -> int:
        """Load every archive now (instead of on first lookup); return the number of decisions indexed."""
        for digest in self._manifests:
            self._archives(digest)
        return len(self)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(a.rows) for loaded in self._loaded.values() for a in loaded)

    def _archives(self, digest: str) -> list[_Loaded]:
        loaded = self._loaded.get(digest)
        if loaded is not None:
            return loaded
        with self._lock:
            loaded = self._loaded.get(digest)
            if loaded is None:
                loaded = []
                for folder, manifest in self._manifests.get(digest, []):
                    try:
                        loaded.append(_Loaded(folder, manifest, self.row_groups))
                    except ArchiveError as e:
                        log.warning("archive %s is unusable: %s", folder, e)
                        self._broken[digest] = str(e)
                self._loaded[digest] = loaded
            return loaded

    def _digest(self, cache_key: str) -> str | None:
        digest = self._digests.get(cache_key)
        if digest is None:
            try:
                digest = fingerprint_digest(key_environment(cache_key))
            except ValueError:
                return None
            if len(self._digests) > 4096:
                self._digests.clear()
            self._digests[cache_key] = digest
        return digest

    def get(self, cache_key: str) -> DecisionRecord | None:
        """The record for ``cache_key``; None on a miss; CorruptRecord for a bad record or unusable archive."""
        self.lookups += 1
        digest = self._digest(cache_key)
        if digest is None or digest not in self._manifests:
            return None
        archives = self._archives(digest)
        sha = key_sha256(cache_key)
        best: DecisionRecord | None = None
        problem: str | None = self._broken.get(digest)
        for archive in archives:
            row = archive.rows.get(sha)
            if row is None:
                continue
            try:
                with self._lock:
                    text = archive.text(row)
                record = DecisionRecord.from_json(text, expected_key=cache_key)
            except CorruptRecord as e:
                problem = f"{archive.path}: row {row}: {e}"
                continue
            except Exception as e:  # an unreadable row group
                problem = f"{archive.path}: row {row}: {e}"
                continue
            if replaces(record, best):
                best = record
        if best is None and problem is not None:
            raise CorruptRecord(problem)
        return best

    def put(self, record: DecisionRecord) -> None:
        raise TuneFailure.unavailable("an ArchiveStore is read-only: write archives with `farm archive`")

    def delete(self, cache_key: str) -> None:
        return None
