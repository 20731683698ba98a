"""Reading archives: every byte is checked before it is trusted, and hostile files are refused, never followed.

The reader opens only regular files inside the archive folder (no symlinks, FIFOs or devices: ``O_NOFOLLOW`` and
``O_NONBLOCK``, then ``fstat``), compares each file's size with the manifest before reading it and its sha256
after, compares the Parquet row counts with the manifest before decoding, and decodes in batches of
``READ_BATCH_ROWS`` rows. Keys must be strictly increasing (the writer sorts them), so a duplicate key is refused
at the first repeat, in constant memory. Columns are checked with pyarrow compute (nulls, ranges, key form, the
environment) and every record's own checksum and its agreement with its columns per row. Any failure is an
:class:`ArchiveError` naming the file, the row and the field.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.environment import fingerprint_digest
from farm.errors import CorruptRecord
from farm.stores.archive.checks import check_decision_ranges, check_key_parts
from farm.stores.archive.checks import check_keys as check_keys
from farm.stores.archive.schema import (
    ARCHIVE_SCHEMA_VERSION,
    DATA_FILES,
    DECISION_COLUMNS,
    DECISIONS_FILE,
    MANIFEST_FILE,
    PARQUET_DIGEST_KEY,
    PARQUET_VERSION_KEY,
    SCALAR_COLUMNS,
    TRIAL_COLUMNS,
    TRIAL_FIELDS,
    TRIALS_FILE,
    ArchiveEntry,
    ArchiveError,
    _same,
    _short,
    arrow_schema,
    check_trial_ranges,
    derived_scalars,
    record_text,
)
from farm.stores.base import DecisionRecord, key_sha256

READ_BATCH_ROWS = 8192
MAX_MANIFEST_BYTES = 1 << 20
MAX_GROUP_ROWS = 65536  # the writer's row groups hold 1,024 decisions or 65,536 trial rows
MAX_GROUP_BYTES = 1 << 28
# The decision columns a reader converts to Python, row by row: the rest is checked column-wise.
_PER_ROW = ("key_sha256", "cache_key", "record_json", "problem_id", "operation_key", "reference_position",
            "manifest", *SCALAR_COLUMNS)  # uncompressed, as the file's metadata declares it


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
    return os.path.lexists(path / MANIFEST_FILE)


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
        data = json.loads(read_regular(path, limit=MAX_MANIFEST_BYTES))
    except ValueError as e:
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
    if not (isinstance(sizes, dict) and all(isinstance(sizes.get(n), int) and not isinstance(sizes.get(n), bool)
                                            and sizes[n] >= 0 for n in DATA_FILES)):
        raise ArchiveError(f"{path}: field 'bytes' = {sizes!r}: must hold the byte count of each file")
    return data


def read_regular(path: Path, size: int | None = None, limit: int | None = None) -> bytes:
    """The bytes of ``path`` if it is a regular file (never through a symlink, never blocking on a FIFO), checked
    against ``size`` before reading (or read up to ``limit``). ArchiveError naming the path otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ArchiveError(f"{path}: missing") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ArchiveError(f"{path}: a symbolic link, not a regular file: refused") from None
        raise ArchiveError(f"{path}: unreadable: {e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(
                st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file"
            raise ArchiveError(f"{path}: {kind}, not a regular file: refused")
        if size is not None and st.st_size != size:
            raise ArchiveError(f"{path}: {st.st_size} bytes, but {MANIFEST_FILE} field 'bytes.{path.name}' says "
                               f"{size} (truncated or replaced)")
        if limit is not None and st.st_size > limit:
            raise ArchiveError(f"{path}: {st.st_size} bytes, more than the {limit} a {path.name} may hold")
        want = st.st_size
        chunks = []
        while want > 0:
            chunk = os.read(fd, min(want, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            want -= len(chunk)
        data = b"".join(chunks)
        if len(data) != st.st_size:
            raise ArchiveError(f"{path}: changed size while being read")
        return data
    except OSError as e:
        raise ArchiveError(f"{path}: unreadable: {e}") from None
    finally:
        os.close(fd)


def verified_bytes(folder: Path, name: str, manifest: dict[str, Any]) -> bytes:
    """A data file's bytes after its size (before reading) and sha256 (after) matched the manifest's."""
    path = folder / name
    data = read_regular(path, size=manifest["bytes"][name])
    actual = hashlib.sha256(data).hexdigest()
    if actual != manifest["sha256"][name]:
        raise ArchiveError(f"{path}: sha256 {actual[:16]}… does not match {MANIFEST_FILE} field 'sha256.{name}' "
                           f"({manifest['sha256'][name][:16]}…): the file was modified or is truncated")
    return data


def parquet_file(path: Path, data: bytes, columns: Sequence[tuple[str, str, bool]], digest: str,
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
    for g in range(pf.num_row_groups):
        group = pf.metadata.row_group(g)
        if group.num_rows > MAX_GROUP_ROWS or group.total_byte_size > MAX_GROUP_BYTES:
            raise ArchiveError(f"{path}: row group {g} holds {group.num_rows} rows ({group.total_byte_size} bytes), "
                               f"more than a reader decodes at once ({MAX_GROUP_ROWS} rows, {MAX_GROUP_BYTES} bytes)")
    if pf.metadata.num_rows != rows or sum(pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)) != rows:
        raise ArchiveError(f"{path}: {pf.metadata.num_rows} rows, but {MANIFEST_FILE} field "
                           f"'rows.{path.stem}' says {rows}")
    return pf


def batches(path: Path, pf: Any, columns: Sequence[tuple[str, str, bool]]) -> Iterator[tuple[int, Any]]:
    """(first row, record batch) of ``READ_BATCH_ROWS`` rows at a time, with the not-null columns checked."""
    import pyarrow as pa

    at = 0
    try:
        for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS):
            for i, (name, _, nullable) in enumerate(columns):
                if not nullable and batch.column(i).null_count:
                    raise ArchiveError(f"{path}: column {name!r} holds nulls")
            yield at, batch
            at += batch.num_rows
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ArchiveError(f"{path}: not a readable Parquet file: {e}") from None


def read_archive(folder: Path | str, *, trials: bool = True) -> Archive:
    """Read and verify one archive folder completely; ArchiveError (naming file, row and field) on any problem.
    A key that appears twice is refused."""
    import pyarrow.compute as pc

    folder = Path(folder)
    manifest = read_manifest(folder)
    digest = manifest["digest"]
    fingerprint = manifest["fingerprint"]
    path = folder / DECISIONS_FILE
    pf = parquet_file(path, verified_bytes(folder, DECISIONS_FILE, manifest), DECISION_COLUMNS, digest,
                      manifest["rows"]["decisions"])
    trial_pf = parquet_file(folder / TRIALS_FILE, verified_bytes(folder, TRIALS_FILE, manifest), TRIAL_COLUMNS,
                            digest, manifest["rows"]["trials"]) if trials else None
    entries: dict[str, ArchiveEntry] = {}
    last: str | None = None
    for at, batch in batches(path, pf, DECISION_COLUMNS):
        environment = batch.column("environment")
        wrong = pc.not_equal(environment, fingerprint)
        if pc.any(wrong).as_py():
            i = pc.index(wrong, True).as_py()
            raise ArchiveError(f"{path}: row {at + i}: column 'environment': the key's fingerprint (digest "
                               f"{fingerprint_digest(environment[i].as_py())}) is not the manifest's ({digest})")
        last = check_keys(path, batch.column(0), at, last)
        check_decision_ranges(path, batch, at)
        check_key_parts(path, batch, at)
        py = {name: batch.column(name).to_pylist() for name in _PER_ROW}
        scalars = list(zip(*(py[name] for name in SCALAR_COLUMNS), strict=True))
        for i, (sha, key, text, pid, op_key, position, manifest_part, spec_json) in enumerate(zip(
                py["key_sha256"], py["cache_key"], py["record_json"], py["problem_id"], py["operation_key"],
                py["reference_position"], py["manifest"], py["spec_json"], strict=True)):
            where = f"{path}: row {at + i} (key {sha[:12]})"
            try:
                if key_sha256(key) != sha:
                    raise ArchiveError(f"column 'key_sha256' = {sha[:12]}… is not the sha256 of column 'cache_key'")
                if record_text(text) is None:
                    raise ArchiveError("column 'record_json' is not DecisionRecord.to_json text (checksum last)")
                try:
                    record = DecisionRecord.from_json(text, expected_key=key)
                except CorruptRecord as e:
                    raise ArchiveError(f"column 'record_json': {e}") from None
                derived = derived_scalars(record, op_key, position, manifest_part, spec_json)
            except ArchiveError as e:
                raise ArchiveError(f"{where}: {e}") from None
            if derived != scalars[i]:  # (column types are fixed by the schema)
                for name, have, want in zip(SCALAR_COLUMNS, scalars[i], derived, strict=True):
                    if not _same(have, want):
                        raise ArchiveError(f"{where}: column {name!r} = {_short(have)} disagrees with "
                                           f"record_json ({_short(want)})")
            entries[sha] = ArchiveEntry(record, pid, (), text)
    archive = Archive(folder, manifest, entries)
    if trial_pf is not None:
        _attach_trials(archive, folder / TRIALS_FILE, trial_pf)
    return archive


def _attach_trials(archive: Archive, path: Path, pf: Any) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    known = pa.array(list(archive.entries), pa.string())
    grouped: dict[str, list[dict[str, Any]]] = {}
    names = [name for name, _, _ in TRIAL_COLUMNS]
    extra_at = names.index("extra_json")
    for at, batch in batches(path, pf, TRIAL_COLUMNS):
        check_trial_ranges(batch, path, at)
        keys = batch.column(0)
        orphan = pc.invert(pc.is_in(keys, value_set=known))
        if pc.any(orphan).as_py():
            i = pc.index(orphan, True).as_py()
            raise ArchiveError(f"{path}: row {at + i}: column 'key_sha256' = {keys[i].as_py()[:12]}… names no "
                               f"decision of the archive")
        keys_py = keys.to_pylist()
        rows = [dict(zip(TRIAL_FIELDS, values, strict=True))
                for values in zip(*(batch.column(i).to_pylist() for i in range(1, extra_at)), strict=True)]
        extras = batch.column(extra_at)
        if extras.null_count < len(extras):  # fields a newer farm added
            for i, extra in enumerate(extras.to_pylist()):
                if extra is None:
                    continue
                try:
                    more = json.loads(extra)
                except ValueError as e:
                    raise ArchiveError(f"{path}: row {at + i}: column 'extra_json' is not JSON: {e}") from None
                if not isinstance(more, dict) or set(more) & set(TRIAL_FIELDS):
                    raise ArchiveError(f"{path}: row {at + i}: column 'extra_json' must be an object of other fields")
                rows[i].update(more)
        start = 0
        for key, run in itertools.groupby(keys_py):  # a decision's rows are contiguous (the writer's order)
            count = sum(1 for _ in run)
            grouped.setdefault(key, []).extend(rows[start : start + count])
            start += count
    for key, rows in grouped.items():
        entry = archive.entries[key]
        archive.entries[key] = ArchiveEntry(entry.record, entry.problem_id, tuple(rows), entry.text)
