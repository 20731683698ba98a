"""Kernel cache entries as a Parquet file, so a new site gets compiled kernels with the decisions archive.

One row per entry: ``key``, ``status``, ``reason``, ``resources`` (JSON), ``seconds``, ``cubin`` (binary); the
file's metadata carries the schema version (``farm.kernels.schema``). :func:`export_kernels` writes the entries of
the given keys atomically (the whole file, then a rename); :func:`import_kernels` validates every row (schema,
key, status, cubin size: nothing is stored when one row is bad) and then stores each entry the cache lacks.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from pathlib import Path

from farm.atomicfile import write_atomic
from farm.errors import ConfigError
from farm_kernels.cuda.kcache import SCHEMA, KernelCache, KernelEntry

SCHEMA_KEY = b"farm.kernels.schema"


def export_kernels(cache: KernelCache, keys: Iterable[str], path: Path | str) -> int:
    """Write the entries of ``keys`` found in ``cache`` to the Parquet file ``path``; the number written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    entries = [e for e in (cache.get(k) for k in dict.fromkeys(keys)) if e is not None]
    schema = pa.schema([("key", pa.string()), ("status", pa.string()), ("reason", pa.string()),
                        ("resources", pa.string()), ("seconds", pa.float64()), ("cubin", pa.binary())],
                       metadata={SCHEMA_KEY: str(SCHEMA).encode()})
    table = pa.table({"key": [e.key for e in entries], "status": [e.status for e in entries],
                      "reason": [e.reason for e in entries],
                      "resources": [json.dumps(e.resources, sort_keys=True) for e in entries],
                      "seconds": [e.seconds for e in entries], "cubin": [e.cubin for e in entries]}, schema=schema)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    write_atomic(Path(path), buffer.getvalue())
    return len(entries)


def import_kernels(path: Path | str, cache: KernelCache) -> int:
    """Store the entries of the Parquet file ``path`` that ``cache`` lacks; the number stored. ConfigError naming
    the file, the row and the field for anything malformed, before anything is stored."""
    import pyarrow.parquet as pq

    source = str(path)
    try:
        table = pq.read_table(source)
    except (OSError, ValueError) as e:
        raise ConfigError(source, "<file>", None, f"not a kernel archive: {e}") from e
    version = (table.schema.metadata or {}).get(SCHEMA_KEY)
    if version != str(SCHEMA).encode():
        raise ConfigError(source, "farm.kernels.schema", version, f"unsupported kernel archive schema (expected {SCHEMA})")
    entries = []
    for i, row in enumerate(table.to_pylist()):
        where = f"{source} row {i}"
        try:
            resources = json.loads(row["resources"])
        except (TypeError, ValueError) as e:
            raise ConfigError(where, "resources", row.get("resources"), f"not JSON: {e}") from e
        cubin = row["cubin"] or b""
        meta = {"schema": SCHEMA, "key": row["key"], "status": row["status"], "reason": row["reason"],
                "resources": resources, "seconds": row["seconds"], "cubin_bytes": len(cubin)}
        entry = KernelEntry.from_meta(where, meta, cubin)
        if len(entry.key) != 64 or any(c not in "0123456789abcdef" for c in entry.key):
            raise ConfigError(where, "key", entry.key, "not a sha256 hex digest")
        entries.append(entry)
    stored = 0
    for entry in entries:
        if cache.get(entry.key) is None:
            cache.put(entry)
            stored += 1
    return stored
