"""Importing weights (docs/catalog.md, "Weights"): what ``farm catalog weights`` does.

``farm catalog weights FILE --catalog CATALOG`` reads a CSV or Parquet table of (operation, workload, calls[,
seconds_per_call]) rows, matches each row to the catalog's workloads on the normalized spec, and writes the weights
file: JSON, schema-versioned, written atomically. A bad row is a ConfigError naming the file, the row, the field
and the value, and then nothing is written; rows the catalog does not have are reported, never dropped silently.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.atomicfile import write_atomic
from farm.decisions import canonical_json
from farm.errors import ConfigError
from farm.jsontypes import JSONObject
from farm_coordinator.catalog import Workload, workload_label
from farm_coordinator.weights import SCHEMA, VERSION, parse_weights

log = logging.getLogger(__name__)

COLUMNS = ("operation", "workload", "calls", "seconds_per_call")
REQUIRED_COLUMNS = COLUMNS[:3]


@dataclass(frozen=True)
class Row:
    """One row of an imported table; ``row`` counts from 1 (the first row after a CSV's header)."""

    row: int
    operation: str
    workload: str
    calls: float
    seconds_per_call: float | None

    @property
    def weight(self) -> float:
        return self.calls * self.seconds_per_call if self.seconds_per_call is not None else self.calls


@dataclass(frozen=True)
class Weighted:
    """A catalog workload with its imported weight: what one entry of a weights file says."""

    operation: str
    workload: JSONObject  # the normalized spec
    label: str
    calls: float
    seconds_per_call: float | None
    weight: float
    row: int

    def to_dict(self) -> dict[str, Any]:
        return {"operation": self.operation, "workload": self.workload, "label": self.label, "calls": self.calls,
                "seconds_per_call": self.seconds_per_call, "weight": self.weight, "row": self.row}


@dataclass(frozen=True)
class Imported:
    """What an import found: the weighted workloads, the rows the catalog does not have (by reason), and the
    catalog's workloads no row weights (they keep their catalog weight, default 1)."""

    source: str
    weighted: tuple[Weighted, ...]
    unknown_operations: tuple[Row, ...]
    unknown_workloads: tuple[Row, ...]
    unweighted: tuple[Workload, ...]

    @property
    def rows(self) -> int:
        return len(self.weighted) + len(self.unknown_operations) + len(self.unknown_workloads)


# -- reading a table -------------------------------------------------------------------------------------------


def read_rows(path: Path | str) -> list[Row]:
    """The rows of a CSV (``.csv``) or Parquet (``.parquet``, ``.pq``) file. Columns: ``operation``,
    ``workload`` (a JSON object or the label ``farm tune`` prints), ``calls`` (> 0) and optionally
    ``seconds_per_call`` (> 0, on every row or none). ConfigError names the file, row, field and value."""
    source = str(path)
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in (".csv", ".parquet", ".pq"):
        raise ConfigError(source, "<file>", file.suffix, "a weights table is a .csv or .parquet file")
    if not file.is_file():
        raise ConfigError(source, "<file>", source, "no such file")
    raw = _read_parquet(file, source) if suffix != ".csv" else _read_csv(file, source)
    if not raw:
        raise ConfigError(source, "<rows>", 0, "no rows: expected one row per (operation, workload)")
    rows = [_row(i, values, source) for i, values in enumerate(raw, start=1)]
    timed = [r for r in rows if r.seconds_per_call is not None]
    if timed and len(timed) != len(rows):
        first = next(r for r in rows if r.seconds_per_call is None)
        raise ConfigError(source, f"row {first.row}.seconds_per_call", None,
                          "give seconds_per_call on every row or on none (a weight mixes no units)")
    return rows


def _read_csv(file: Path, source: str) -> list[dict[str, Any]]:
    try:
        with file.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            _check_columns(reader.fieldnames or [], source)
            out: list[dict[str, Any]] = []
            for n, values in enumerate(reader, start=1):
                if None in values:  # more cells than the header names
                    raise ConfigError(source, f"row {n}", values[None], "more cells than columns")
                out.append(dict(values))
            return out
    except UnicodeDecodeError as e:
        raise ConfigError(source, "<file>", None, f"not UTF-8 text (byte {e.start}): a weights table is CSV") from e
    except csv.Error as e:
        raise ConfigError(source, "<file>", None, f"not valid CSV: {e}") from e


def _read_parquet(file: Path, source: str) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(source, "<file>", None, f"not a readable Parquet file: {e}") from e
    _check_columns(table.column_names, source)
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _check_columns(columns: Sequence[str], source: str) -> None:
    names = [str(c).strip() for c in columns]
    unknown = [c for c in names if c not in COLUMNS]
    if unknown:
        raise ConfigError(source, "<columns>", unknown[0], f"unknown column (expected {', '.join(COLUMNS)})")
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise ConfigError(source, "<columns>", names, f"missing column {missing[0]!r} "
                                                       f"(expected operation, workload, calls[, seconds_per_call])")


def _row(n: int, values: dict[str, Any], source: str) -> Row:
    values = {str(k).strip(): v for k, v in values.items()}
    texts = {}
    for name in ("operation", "workload"):
        value = values.get(name)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(source, f"row {n}.{name}", value, f"must be a non-empty {name}")
        texts[name] = value.strip()
    calls = _number(values.get("calls"), source, f"row {n}.calls")
    seconds = values.get("seconds_per_call")
    per_call = None if seconds is None or seconds == "" else _number(seconds, source, f"row {n}.seconds_per_call")
    return Row(n, texts["operation"], texts["workload"], calls, per_call)


def _number(value: Any, source: str, where: str) -> float:
    """A cell as a finite number > 0: CSV text is parsed, Parquet values must be numbers already."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise ConfigError(source, where, value, "must be a number")
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(source, where, value, "must be a finite number > 0 (leave out what the fleet does not run)")
    return float(number)


# -- matching rows to a catalog ---------------------------------------------------------------------------------


class _Index:
    """The catalog's workloads by (operation, canonical spec) and by (operation, label)."""

    def __init__(self, workloads: tuple[Workload, ...]) -> None:
        self.operations = {w.operation for w in workloads}
        self.by_spec: dict[tuple[str, str], list[int]] = {}
        self.by_label: dict[tuple[str, str], list[int]] = {}
        for i, w in enumerate(workloads):
            for spec in (w.normalized, w.spec):
                _add(self.by_spec, (w.operation, canonical_json(spec)), i)
            for spec in (w.normalized, w.spec):
                _add(self.by_label, (w.operation, " ".join(workload_label(w.operation, spec).split())), i)


def _add(index: dict[tuple[str, str], list[int]], key: tuple[str, str], i: int) -> None:
    found = index.setdefault(key, [])
    if i not in found:
        found.append(i)


def match(workloads: tuple[Workload, ...], rows: list[Row], source: str) -> Imported:
    """Match each row to the catalog's workloads (one workload on several device kinds is several catalog
    entries with one weight). A row whose workload does not parse or is not valid for its operation is a
    ConfigError; two rows of one workload too."""
    from farm_kernels import registry

    index = _Index(workloads)
    weighted: dict[int, Row] = {}
    unknown_operations: list[Row] = []
    unknown_workloads: list[Row] = []
    for row in rows:
        if row.operation not in index.operations:
            unknown_operations.append(row)
            continue
        found = _find(index, row, source, registry)
        if not found:
            unknown_workloads.append(row)
            continue
        for i in found:
            if i in weighted and weighted[i].row != row.row:
                raise ConfigError(source, f"row {row.row}.workload", row.workload,
                                  f"the same workload as row {weighted[i].row} ({workloads[i].where} of the catalog)")
            weighted[i] = row
    entries: dict[tuple[str, str], Weighted] = {}
    for i, row in sorted(weighted.items()):
        w = workloads[i]
        key = (w.operation, canonical_json(w.normalized))
        if key not in entries:
            entries[key] = Weighted(w.operation, dict(w.normalized), workload_label(w.operation, w.spec), row.calls,
                                    row.seconds_per_call, row.weight, row.row)
    unweighted = tuple(w for i, w in enumerate(workloads) if i not in weighted)
    return Imported(source, tuple(entries.values()), tuple(unknown_operations), tuple(unknown_workloads), unweighted)


def _find(index: _Index, row: Row, source: str, registry: Any) -> list[int]:
    where = f"row {row.row}.workload"
    known = row.operation in registry.names()
    if row.workload.startswith("{"):
        try:
            spec = json.loads(row.workload)
        except ValueError as e:
            raise ConfigError(source, where, row.workload, f"not a JSON object: {e}") from e
        if not isinstance(spec, dict):
            raise ConfigError(source, where, row.workload, "must be a JSON object or a workload label")
    else:
        by_label = index.by_label.get((row.operation, " ".join(row.workload.split())))
        if by_label is not None or not known:
            return list(by_label or ())
        spec = _spec_from_label(registry.get(row.operation), row.workload, source, where)
    if known:
        try:
            spec = registry.get(row.operation).normalize(spec, source, prefix=where)
        except (TypeError, ValueError, OverflowError) as e:  # ConfigError included: it names the field
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(source, where, row.workload, f"invalid workload: {e}") from e
    return list(index.by_spec.get((row.operation, canonical_json(spec)), ()))


def _spec_from_label(operation: Any, label: str, source: str, where: str) -> dict[str, Any]:
    """The spec a label writes (``m=64 n=64 k=64 a_transposed float32``): ``name=value`` pairs, and bare values of
    the fields with choices (a layout) or else the dtype."""
    spec: dict[str, Any] = {}
    choices = {c: f.name for f in operation.spec_fields if f.choices for c in f.choices}
    for token in label.split():
        name, eq, value = token.partition("=")
        if eq:
            spec[name] = int(value) if value.lstrip("-").isdigit() else value
        elif token in choices:
            spec[choices[token]] = token
        elif "dtype" not in spec:
            spec["dtype"] = token
        else:
            raise ConfigError(source, where, label, f"cannot read {token!r}: a label is name=value pairs, the "
                                                    f"layout and the dtype (or write the workload as a JSON object)")
    return spec


# -- the weights file --------------------------------------------------------------------------------------------


def weights_document(imported: Imported, source_bytes: bytes) -> dict[str, Any]:
    """The weights file's content (schema ``farm-weights`` version 1)."""
    return {"schema": SCHEMA, "v": VERSION, "source": Path(imported.source).name,
            "source_sha256": hashlib.sha256(source_bytes).hexdigest(), "written": round(time.time(), 3),
            "weights": [w.to_dict() for w in imported.weighted]}


def write_weights(path: Path, imported: Imported) -> None:
    """Write the weights file atomically (readers see the old file or the new one); its content is read back with
    :func:`read_weights` before it replaces anything."""
    data = (json.dumps(weights_document(imported, Path(imported.source).read_bytes()), indent=1, sort_keys=True)
            + "\n").encode()
    parse_weights(data, str(path))
    write_atomic(path, data)


