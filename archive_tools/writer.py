"""Writing archives (schema 2): one folder per fingerprint, built beside its target and swapped in atomically."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import math
import operator
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.atomicfile import fsync_directory, make_temp_directory
from farm.environment import farm_version, fingerprint_digest
from farm.stores.archive.schema import (
    ARCHIVE_SCHEMA_VERSION,
    DECISION_COLUMNS,
    DECISIONS_FILE,
    DICTIONARY_COLUMNS,
    MANIFEST_FILE,
    ROW_GROUP_ROWS,
    TRIAL_COLUMNS,
    TRIAL_FIELDS,
    TRIAL_KEYS,
    TRIAL_ROW_GROUP_ROWS,
    TRIALS_FILE,
    ArchiveEntry,
    ArchiveError,
    _short,
    arrow_schema,
    arrow_type,
    check_trial_ranges,
    key_digest,
    key_hash64,
    record_body,
)
from farm.stores.archive.signing import SIGNATURE_FILE
from farm.stores.base import canonical_json
from farm_archives.derived import check_winner, key_parts, manifest_names
from farm_archives.signing import SigningKey

_TRIAL_GETTER = operator.itemgetter(*TRIAL_FIELDS)

# -- writing ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WrittenArchive:
    path: Path
    decisions: int
    trials: int
    bytes: int


def decision_values(entry: ArchiveEntry, fingerprint: str) -> tuple[Any, ...]:
    """The decisions.parquet values of an entry (``DECISION_COLUMNS`` order), checked as a reader checks them:
    a canonical v1 cache key of ``fingerprint``, the winner and reference in its manifest, values in range.
    ArchiveError otherwise."""
    record = entry.record
    key = record.cache_key
    version, scope, operation, environment, workload, context, reference, candidates, accuracy = key_parts(key)
    if environment != fingerprint:
        raise ArchiveError(f"its key's environment is not the archive's fingerprint {fingerprint_digest(fingerprint)}")
    if str(record.reference_index) != reference:
        raise ArchiveError(f"field 'reference_index' = {record.reference_index} differs from the key's reference "
                           f"position {reference!r}")
    check_winner(manifest_names(candidates), record.index, record.reference_index, record.name)
    ratio, created = record.ratio, record.created
    if not (math.isfinite(ratio) and ratio > 0):
        raise ArchiveError(f"field 'ratio' = {ratio!r} is out of range (must be finite and > 0)")
    if not (math.isfinite(created) and created >= 0):
        raise ArchiveError(f"field 'created' = {created!r} is out of range (must be finite and >= 0)")
    meta_json = canonical_json(dict(record.meta))
    body = record_body(key, float(created), record.index, meta_json, record.name, float(ratio),
                       record.reference_index, record.verified)
    return (version, scope, operation, workload, context, candidates, accuracy, key_hash64(key_digest(key)),
            record.name, record.index, record.reference_index, record.verified, float(ratio), float(created),
            meta_json, hashlib.sha256(body.encode()).digest(), entry.problem_id)


def write_archive(parent: Path | str, fingerprint: str, entries: Iterable[ArchiveEntry], *,
                  created: float | None = None, skipped: list[str] | None = None,
                  signer: SigningKey | None = None, provenance: dict[str, int] | None = None) -> WrittenArchive:
    """Write the archive of ``fingerprint`` to ``parent/<digest>/`` (schema 2), atomically replacing any archive
    there.

    Every entry is checked as a reader would check it (key structure, fingerprint, ranges); two entries with the
    same key must be identical. A bad entry is an ArchiveError, or, given a ``skipped`` list, left out with the
    reason appended there (exports skip what cannot be archived). Rows are sorted by cache key, so the same
    decisions give the same files. Given ``signer``, the manifest is signed (``manifest.sig``, docs/archives.md,
    "Signatures"); without one the archive is unsigned, and readers that check trust refuse it. ``provenance``
    (key id -> decisions) names the signers of the archives some decisions were imported from: the manifest's
    optional ``provenance.signers``.
    """
    import pyarrow as pa

    digest = fingerprint_digest(fingerprint)
    by_key: dict[str, tuple[tuple[Any, ...], ArchiveEntry]] = {}
    hashes: dict[int, str] = {}
    for entry in entries:
        key = entry.record.cache_key
        try:
            try:
                values = decision_values(entry, fingerprint)
            except ArchiveError as e:
                raise ArchiveError(f"decision {entry.key_sha256[:12]}: {e}") from None
            seen = by_key.get(key)
            if seen is not None and (seen[0] != values or seen[1].trials != entry.trials):
                raise ArchiveError(f"decision {entry.key_sha256[:12]}: two different entries for one cache key")
            other = hashes.setdefault(values[7], key)
            if other != key:  # two keys whose sha256 share 64 bits: never seen, but the index needs it
                raise ArchiveError(f"decision {entry.key_sha256[:12]}: its key_hash is another key's")
        except ArchiveError as e:
            if skipped is None:
                raise
            skipped.append(str(e))
            continue
        by_key[key] = (values, entry)
    ordered = [by_key[key] for key in sorted(by_key)]

    columns = list(zip(*(values for values, _ in ordered), strict=True)) if ordered else [() for _ in
                                                                                         DECISION_COLUMNS]
    decisions = pa.Table.from_pydict(
        {name: _column(pa, list(values), kind, name, DECISIONS_FILE)
         for (name, kind, _), values in zip(DECISION_COLUMNS, columns, strict=True)},
        schema=arrow_schema(DECISION_COLUMNS, digest))
    rows: list[int] = []
    values_: list[tuple[Any, ...]] = []
    extras: list[str | None] = []
    for row, (_, entry) in enumerate(ordered):
        sha = entry.key_sha256
        for i, trial in enumerate(entry.trials):
            if not isinstance(trial, dict):
                raise ArchiveError(f"decision {sha[:12]}: trial row {i} is a {type(trial).__name__}, not an object")
            tie = trial.get("key_sha256", sha)
            if tie != sha:
                raise ArchiveError(f"decision {sha[:12]}: trial row {i} has field 'key_sha256' = {_short(tie)}")
            rows.append(row)
            if trial.keys() == TRIAL_KEYS:
                values_.append(_TRIAL_GETTER(trial))
                extras.append(None)
            else:
                values_.append(tuple(trial.get(name) for name in TRIAL_FIELDS))
                extra = {k: v for k, v in trial.items() if k not in TRIAL_KEYS and k != "key_sha256"}
                extras.append(canonical_json(extra) if extra else None)
    trial_columns = list(zip(*values_, strict=True)) if values_ else [() for _ in TRIAL_FIELDS]
    trials = pa.Table.from_pydict(
        {name: _column(pa, list(column), kind, name, TRIALS_FILE)
         for (name, kind, _), column in zip(TRIAL_COLUMNS, [rows, *trial_columns, extras], strict=True)},
        schema=arrow_schema(TRIAL_COLUMNS, digest))
    check_trial_ranges(trials, TRIALS_FILE)

    blobs = {DECISIONS_FILE: _parquet_bytes(decisions, ROW_GROUP_ROWS, list(DICTIONARY_COLUMNS)),
             TRIALS_FILE: _parquet_bytes(trials, TRIAL_ROW_GROUP_ROWS,
                                         [name for name, kind, _ in TRIAL_COLUMNS if kind == "string"],
                                         {"decision": "DELTA_BINARY_PACKED"})}
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
    if provenance:
        manifest["provenance"] = {"signers": dict(sorted(provenance.items()))}
    blobs[MANIFEST_FILE] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    if signer is not None:
        blobs[SIGNATURE_FILE] = signer.signature_for(blobs[MANIFEST_FILE])
    target = Path(parent) / digest
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = make_temp_directory(target.parent, f".{digest}.tmp-")
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
        return pa.array(values, type=arrow_type(pa, kind))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as e:
        for i, value in enumerate(values):  # name the first value that does not fit
            try:
                pa.array([value], type=arrow_type(pa, kind))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
                raise ArchiveError(f"{file}: row {i}: field {name!r} = {_short(value)} is not a {kind}") from e
        raise ArchiveError(f"{file}: column {name!r}: {e}") from e


def _parquet_bytes(table: Any, row_group_rows: int, dictionary: list[str],
                   encodings: dict[str, str] | None = None) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=row_group_rows, use_dictionary=dictionary,
                   column_encoding=encodings)
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
