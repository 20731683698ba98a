"""Schema 1 archives: read, never written (``farm archive merge`` rewrites one as schema 2).

Schema 1 stored each decision's exact ``record_json`` beside columns derived from it (``farm.stores.archive.derived``)
and its ``key_sha256``; trial rows were tied to their decision by ``key_sha256``. Every check of that format is
kept: keys sorted and unique, key parts equal to ``cache_key``, the derived columns equal to what the record gives,
the record's own checksum.
"""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path
from typing import Any

from farm.environment import fingerprint_digest
from farm.errors import CorruptRecord
from farm.stores.archive.checks import check_decision_ranges, check_key_parts, check_keys
from farm.stores.archive.derived import SCALAR_COLUMNS, derived_scalars
from farm.stores.archive.files import batches
from farm.stores.archive.rows import ArchiveRows
from farm.stores.archive.schema import (
    DECISIONS_FILE,
    KEY_PARTS,
    TRIAL_FIELDS,
    TRIAL_TYPES,
    TRIALS_FILE,
    ArchiveError,
    _same,
    _short,
    check_trial_ranges,
    record_text,
)
from farm.stores.base import DecisionRecord, key_sha256

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
TRIAL_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("key_sha256", "string", False),
    *((name, kind, True) for name, kind in TRIAL_TYPES),
    ("extra_json", "string", True),
)
# The decision columns converted to Python row by row: the rest is checked column-wise.
_PER_ROW = ("key_sha256", "cache_key", "record_json", "problem_id", "operation_key", "reference_position",
            "manifest", *SCALAR_COLUMNS)


def read_v1(folder: Path, manifest: dict[str, Any], pf: Any, trial_pf: Any | None) -> ArchiveRows:
    """Verify the decisions (and trial rows) of a schema 1 archive whose files are open as Parquet."""
    import pyarrow.compute as pc

    fingerprint, digest = manifest["fingerprint"], manifest["digest"]
    path = folder / DECISIONS_FILE
    entries: dict[str, tuple[DecisionRecord, str, str | None]] = {}
    last: str | None = None
    for at, batch in batches(path, pf, DECISION_COLUMNS):
        environment = batch.column("environment")
        wrong = pc.not_equal(environment, fingerprint)
        if pc.any(wrong).as_py():
            i = pc.index(wrong, True).as_py()
            raise ArchiveError(f"{path}: row {at + i}: column 'environment': the key's fingerprint (digest "
                               f"{fingerprint_digest(environment[i].as_py())}) is not the manifest's ({digest})")
        keys = batch.column(0)
        last = check_keys(path, keys, at, last)
        check_decision_ranges(path, batch, at, functools.partial(_label, keys))
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
            entries[sha] = (record, text, pid)
    trials = _trials(folder / TRIALS_FILE, trial_pf, entries) if trial_pf is not None else {}
    rows = ArchiveRows()
    for sha, (record, text, pid) in entries.items():
        found = trials.get(sha)
        rows.add(record, text, pid, json.dumps(found, separators=(",", ":")) if found else "")
    return rows


def _label(keys: Any, i: int) -> str:
    return str(keys[i].as_py())[:12]


def _trials(path: Path, pf: Any, entries: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    known = pa.array(list(entries), pa.string())
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
    return grouped
