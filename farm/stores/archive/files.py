"""Reading archive files safely: regular files only, sizes and sha256 against the manifest, Parquet checked before
anything is decoded.

The checks, in order: docs/archives.md, "What every read checks" (1, 3 and 4).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from farm.stores.archive.schema import (
    MANIFEST_FILE,
    PARQUET_DIGEST_KEY,
    PARQUET_VERSION_KEY,
    ArchiveError,
    arrow_schema,
)

READ_BATCH_ROWS = 8192
MAX_GROUP_ROWS = 65536  # the writer's row groups hold 1,024 decisions or 65,536 trial rows
MAX_GROUP_BYTES = 1 << 28


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
        with open(fd, "rb", closefd=False) as f:
            data = f.read(st.st_size)  # reads until st_size bytes or the end of the file
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
                 rows: int, version: int, dictionary: Sequence[str] = ()) -> Any:
    """Open verified bytes as Parquet and check its schema (of schema ``version``) and row count; the string
    columns named in ``dictionary`` are decoded as dictionary arrays (each value checked once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(pa.BufferReader(data), read_dictionary=list(dictionary) or None)
        schema = pa.schema([pa.field(f.name, f.type.value_type, f.nullable) if pa.types.is_dictionary(f.type) else f
                            for f in pf.schema_arrow], metadata=pf.schema_arrow.metadata)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ArchiveError(f"{path}: not a readable Parquet file: {e}") from None
    expected = arrow_schema(columns, digest, version)
    meta = schema.metadata or {}
    for key, value, shown in ((PARQUET_VERSION_KEY, str(version), str(version)),
                              (PARQUET_DIGEST_KEY, digest, repr(digest))):
        if meta.get(key) != value.encode():
            raise ArchiveError(f"{path}: Parquet metadata {key.decode()!r} = {meta.get(key)!r}, "
                               f"expected {shown}")
    if not schema.equals(expected, check_metadata=False):
        want, have = {f.name: f for f in expected}, {f.name: f for f in schema}
        for name in want.keys() | have.keys():
            if name not in have:
                raise ArchiveError(f"{path}: column {name!r} is missing")
            if name not in want:
                raise ArchiveError(f"{path}: column {name!r} is not in schema version {version}")
            if not have[name].equals(want[name]):
                raise ArchiveError(f"{path}: column {name!r} is {have[name].type}"
                                   f"{'' if have[name].nullable else ' not null'}, expected {want[name].type}"
                                   f"{'' if want[name].nullable else ' not null'}")
        raise ArchiveError(f"{path}: columns are not in the order of schema version {version}")
    groups = [pf.metadata.row_group(g) for g in range(pf.num_row_groups)]
    for g, group in enumerate(groups):
        if group.num_rows > MAX_GROUP_ROWS or group.total_byte_size > MAX_GROUP_BYTES:
            raise ArchiveError(f"{path}: row group {g} holds {group.num_rows} rows ({group.total_byte_size} bytes), "
                               f"more than a reader decodes at once ({MAX_GROUP_ROWS} rows, {MAX_GROUP_BYTES} bytes)")
    if pf.metadata.num_rows != rows or sum(group.num_rows for group in groups) != rows:
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
