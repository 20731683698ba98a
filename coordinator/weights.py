"""The weights file: how much fleet time each workload of a catalog is worth (docs/catalog.md, "Weights").

A weight is relative: a workload's calls (per hour, or over any period common to the file) times its seconds per
call at the reference when known, calls alone otherwise. It comes from a workload's ``weight`` field in the
catalog, from the weights file the catalog names (``[weights] file = "..."``: JSON, schema ``farm-weights``
version 1, written by ``farm catalog weights``, coordinator/weights_import.py), or, for ``farm tune
--from-fleet``, from the calls the fleet's runtimes counted (coordinator/feedback.py). The default is 1. A weight
never enters a problem's identity: no problem id or cache key depends on it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Any

from farm.decisions import canonical_json
from farm.errors import ConfigError

log = logging.getLogger(__name__)

SCHEMA = "farm-weights"
VERSION = 1
TABLE_FIELDS = {"file"}  # the catalog's [weights] table


def parse_weight(value: Any, source: str, where: str) -> float:
    """A weight as a catalog or a weights file writes it: a finite number > 0 (an int is fine, a bool is not);
    anything else is a ConfigError naming ``source``, ``where`` and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(source, where, value, "must be a number (fleet time the problem is worth per hour, relative)")
    try:
        weight = float(value)
    except OverflowError as e:
        raise ConfigError(source, where, value, "must be a finite number > 0") from e
    if not math.isfinite(weight) or weight <= 0:
        raise ConfigError(source, where, value, "must be a finite number > 0")
    return weight


def read_weights(path: Path | str) -> dict[tuple[str, str], float]:
    """A weights file: weight by (operation, canonical normalized spec). ConfigError names file, field and value."""
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError as e:
        raise ConfigError(source, "<file>", source, "no such weights file (write it with `farm catalog weights`)") from e
    except OSError as e:
        raise ConfigError(source, "<file>", source, f"cannot read: {e.strerror or e}") from e
    return parse_weights(data, source)


def parse_weights(data: bytes, source: str) -> dict[tuple[str, str], float]:
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise ConfigError(source, "<file>", None, f"not a weights file (JSON): {e}") from e
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ConfigError(source, "schema", doc.get("schema") if isinstance(doc, dict) else doc,
                          f"not a weights file (expected schema {SCHEMA!r})")
    if doc.get("v") != VERSION:
        raise ConfigError(source, "v", doc.get("v"), f"unsupported weights file version (this farm reads {VERSION}); "
                                                     f"re-import it with `farm catalog weights`")
    entries = doc.get("weights")
    if not isinstance(entries, list):
        raise ConfigError(source, "weights", entries, "must be a list")
    out: dict[tuple[str, str], float] = {}
    for i, entry in enumerate(entries):
        at = f"weights[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(source, at, entry, "must be an object")
        operation, workload = entry.get("operation"), entry.get("workload")
        if not isinstance(operation, str) or not operation:
            raise ConfigError(source, f"{at}.operation", operation, "must be an operation name")
        if not isinstance(workload, dict):
            raise ConfigError(source, f"{at}.workload", workload, "must be the workload's normalized spec (an object)")
        out[(operation, canonical_json(workload))] = parse_weight(entry.get("weight"), source, f"{at}.weight")
    return out


def apply_table(table: Any, catalog: str, workloads: list[Any], explicit: set[str]) -> list[Any]:
    """The catalog's workloads with the weights of its ``[weights]`` table's file (relative to the catalog's
    folder). A workload with its own ``weight`` field (``explicit``, by ``where``) that the file also weights is a
    ConfigError: one weight per workload."""
    if not isinstance(table, dict):
        raise ConfigError(catalog, "weights", table, "must be a table ([weights] file = \"...\")")
    extra = sorted(set(table) - TABLE_FIELDS)
    if extra:
        raise ConfigError(catalog, f"weights.{extra[0]}", table[extra[0]], f"unknown field (expected {sorted(TABLE_FIELDS)})")
    name = table.get("file")
    if not isinstance(name, str) or not name:
        raise ConfigError(catalog, "weights.file", name, "must be the path of a weights file (farm catalog weights)")
    path = Path(catalog).parent / name
    try:
        weights = read_weights(path)
    except ConfigError as e:  # said once, from the catalog: "field 'weights.file' = ...: field 'v' = 2: ..."
        inner = e.problem if e.field == "<file>" else f"{path}: field {e.field!r} = {e.value!r}: {e.problem}"
        raise ConfigError(catalog, "weights.file", name, inner) from e
    out, used = [], set()
    for w in workloads:
        key = (w.operation, canonical_json(w.normalized))
        weight = weights.get(key)
        if weight is None:
            out.append(w)
            continue
        used.add(key)
        if w.where in explicit and weight != w.weight:
            raise ConfigError(catalog, f"{w.where}.weight", w.weight,
                              f"{name} weights this workload {weight:g}: give each workload one weight")
        out.append(dataclasses.replace(w, weight=weight))
    if len(used) < len(weights):
        log.warning("%s: %d weights of %s name workloads the catalog no longer has", catalog,
                    len(weights) - len(used), name)
    return out
