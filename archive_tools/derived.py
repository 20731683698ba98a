"""The derived view of a decision: the values ``farm archive inspect`` and ``farm report`` show.

Everything here is computed from a :class:`DecisionRecord` and its cache key: the key's parts by name, the
operation, device kind, workload spec, winner and reference names, relative MAD, samples, run and confirmation.
An archive stores the record itself and leaves the view to readers.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

from farm.encoding import fields, split_fields
from farm.errors import ArchiveError
from farm.identity import KEY_VERSION, OperationKey, decode_manifest, manifest
from farm.keyroster import KeyRoster
from farm.policy import AccuracyKey
from farm.stores.archive.schema import KEY_PARTS
from farm.stores.base import DecisionRecord, canonical_json, key_sha256

_INT32_MAX = 2**31 - 1

# The derived columns, from the record and three parts of its key, in this order (see derived_scalars).
SCALAR_COLUMNS = (
    "operation", "device_kind", "spec_json", "winner", "winner_index", "reference", "reference_index", "ratio",
    "relative_mad", "verified", "samples", "created", "farm_version", "run_id", "confirmation",
)


def _meta_str(meta: Any, name: str) -> str | None:
    value = meta.get(name)
    return value if isinstance(value, str) else None


def decision_row(record: DecisionRecord, problem_id: str | None, record_json: str | None = None) -> dict[str, Any]:
    """The derived view of a decision (schema 1's row): ``key_sha256``, ``cache_key``, the key's parts, the
    ``SCALAR_COLUMNS``, ``problem_id`` and ``record_json``. Raises ArchiveError for a key that is not a v1 cache
    key or whose winner or reference is not in the key's candidate manifest."""
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
    """The key's parts by column name (``KEY_PARTS``); ArchiveError for a key that is not a canonical v1 cache
    key."""
    return dict(zip(KEY_PARTS, key_parts(key), strict=True))


def key_parts(key: str) -> list[str]:
    """The nine parts of a canonical v1 cache key: exactly what :meth:`farm.identity.CacheKey.decode` accepts
    (with this key version), its candidate manifest and accuracy parts checked once per distinct value.
    ArchiveError otherwise."""
    try:
        parts = split_fields(key)
    except ValueError as e:  # UnicodeDecodeError included
        raise ArchiveError(f"cache key is not a {KEY_VERSION} key: {e}") from e
    if len(parts) != 9:
        raise ArchiveError(f"cache key is not a {KEY_VERSION} key: {len(parts)} parts, expected 9")
    if parts[0] != KEY_VERSION:
        raise ArchiveError(f"cache key is not a {KEY_VERSION} key (version {parts[0]!r})")
    problem = (None if parts[6].isdigit() and str(int(parts[6])) == parts[6] else "its reference is not an index") \
        or canonical_manifest(parts[7]) or canonical_accuracy(parts[8]) \
        or (None if fields(parts) == key else "not in canonical form")
    if problem is not None:
        raise ArchiveError(f"cache key is not a {KEY_VERSION} key: {problem}")
    return parts


@functools.lru_cache(maxsize=1024)
def canonical_manifest(text: str) -> str | None:
    """None when a key's candidate-manifest part is canonical, else why not."""
    try:
        return None if manifest(decode_manifest(text)) == text else "its candidate manifest is not in canonical form"
    except ValueError as e:
        return f"its candidate manifest cannot be read: {e}"


@functools.lru_cache(maxsize=1024)
def canonical_accuracy(text: str) -> str | None:
    """None when a key's accuracy part is canonical, else why not."""
    try:
        return None if AccuracyKey.decode(text).encode() == text else "its accuracy key is not in canonical form"
    except ValueError as e:
        return f"its accuracy key cannot be read: {e}"


@functools.lru_cache(maxsize=1024)
def _operation_parts(operation_key: str) -> tuple[str | None, str | None]:
    op = OperationKey.decode(operation_key)  # the runtime adapter's operation key, or text of another form
    return (op.name, op.device_kind) if op is not None else (None, None)


def derived_scalars(record: DecisionRecord, operation_key: str, reference_position: str, manifest: str,
                    spec_json: str | None = None) -> tuple[Any, ...]:
    """The values of ``SCALAR_COLUMNS`` for a record whose key has these operation, reference-position and
    manifest parts. ``spec_json``: a stored column to reuse when it holds the record's spec (saves encoding)."""
    names = manifest_names(manifest)
    if str(record.reference_index) != reference_position:
        raise ArchiveError(f"field 'reference_index' = {record.reference_index} differs from the key's reference "
                           f"position {reference_position!r}")
    check_winner(names, record.index, record.reference_index, record.name)
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
        names.name(record.reference_index), record.reference_index, record.ratio,
        float(mad) if _number(mad) and math.isfinite(mad) and mad >= 0 else None, record.verified,
        samples if isinstance(samples, int) and not isinstance(samples, bool) and 0 <= samples <= _INT32_MAX else None,
        record.created, _meta_str(meta, "farm_version"), _meta_str(meta, "run"), _meta_str(meta, "confirmation"),
    )


def check_winner(names: KeyRoster, index: int, reference_index: int, name: str) -> None:
    """The winner and the reference are positions of the key's roster (``farm.keyroster``: a space's configs are
    computed from its descriptor), and the winner's name is the roster's name at its index."""
    problem = winner_problem(names, index, reference_index, name, "field")
    if problem is not None:
        raise ArchiveError(problem)


def winner_problem(names: KeyRoster, index: int, reference_index: int, name: str, what: str) -> str | None:
    """What is wrong with a record's winner and reference positions for its key (``what``: "field" or "column"
    in the message), or None."""
    for field, i in (("winner_index", index), ("reference_index", reference_index)):
        if not names.in_range(i):
            return f"{what} {field!r} = {i} is out of range for the key's {len(names)} candidates"
    expected = names.name(index)
    if expected is not None and expected != name:
        return f"{what} 'winner' = {_short(name)} is not candidate {index} of the key ({expected!r})"
    if names.name(reference_index) is None:
        return f"{what} 'reference_index' = {reference_index} is not a listed candidate of the key"
    return None


def _short(value: str, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@functools.lru_cache(maxsize=1024)
def manifest_names(manifest: str) -> KeyRoster:
    """The candidate roster of a key's manifest part (its entries' names, a space's configs unranked from its
    descriptor); ArchiveError when it cannot be read."""
    try:
        return KeyRoster([c.name for c in decode_manifest(manifest)])
    except ValueError as e:  # UnicodeDecodeError included
        raise ArchiveError(f"the key's candidate manifest cannot be read: {e}") from e
