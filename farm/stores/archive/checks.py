"""Column-wise checks of archive batches with pyarrow compute: key form and order, key parts, value ranges.

Each raises ArchiveError naming the file, the first bad row and the column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from farm.errors import ArchiveError
from farm.stores.archive.schema import KEY_PARTS, _short


def check_keys(path: Path, keys: Any, at: int, previous: str | None) -> str | None:
    """Columnar: every ``key_sha256`` is 64 lowercase hex digits and greater than the one before it (the writer
    sorts them: a repeat is a duplicate key). Returns the last key."""
    import pyarrow.compute as pc

    if len(keys) == 0:
        return previous
    bad = pc.invert(pc.match_substring_regex(keys, "^[0-9a-f]{64}$"))
    if pc.any(bad).as_py():
        i = pc.index(bad, True).as_py()
        raise ArchiveError(f"{path}: row {at + i}: column 'key_sha256' = {_short(keys[i].as_py())} is not a sha256")
    order = pc.less_equal(keys[1:], keys[:-1]) if len(keys) > 1 else None
    first = keys[0].as_py()
    if previous is not None and first <= previous:
        i, key = 0, first
    elif order is not None and pc.any(order).as_py():
        i = pc.index(order, True).as_py() + 1
        key = keys[i].as_py()
    else:
        return str(keys[-1].as_py())
    before = previous if i == 0 else keys[i - 1].as_py()
    what = "duplicate key" if key == before else "keys out of order (the writer sorts them)"
    raise ArchiveError(f"{path}: row {at + i} (key {key[:12]}): {what}: refused")


def check_key_parts(path: Path, batch: Any, at: int) -> None:
    """Columnar: the key-part columns, length-delimited and joined, are exactly column ``cache_key``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    encoded = []
    for name in KEY_PARTS:
        column = batch.column(name)
        encoded.append(pc.binary_join_element_wise(pc.cast(pc.binary_length(column), pa.string()), column, ":"))
    joined = pc.binary_join_element_wise(*encoded, "")
    wrong = pc.fill_null(pc.not_equal(joined, batch.column("cache_key")), True)
    i = pc.index(wrong, True).as_py()
    if i >= 0:
        raise ArchiveError(f"{path}: row {at + i}: the key-part columns ({', '.join(KEY_PARTS)}) disagree with "
                           f"column 'cache_key'")


def check_decision_ranges(path: Path, batch: Any, at: int) -> None:
    """Columnar range checks of a batch of decision rows (ArchiveError naming the first bad row)."""
    import pyarrow.compute as pc

    def refuse(name: str, ok: Any, rule: str) -> None:
        ok = pc.fill_null(ok, False)
        i = pc.index(ok, False).as_py()
        if i >= 0:
            raise ArchiveError(f"{path}: row {at + i} (key {batch.column(0)[i].as_py()[:12]}): column {name!r} = "
                               f"{batch.column(name)[i].as_py()!r} is out of range ({rule})")

    ratio, created, mad = batch.column("ratio"), batch.column("created"), batch.column("relative_mad")
    refuse("ratio", pc.and_(pc.is_finite(ratio), pc.greater(ratio, 0.0)), "must be finite and > 0")
    refuse("winner_index", pc.greater_equal(batch.column("winner_index"), 0), "must be >= 0")
    refuse("reference_index", pc.greater_equal(batch.column("reference_index"), 0), "must be >= 0")
    refuse("created", pc.and_(pc.is_finite(created), pc.greater_equal(created, 0.0)), "must be finite and >= 0")
    refuse("relative_mad", pc.or_kleene(pc.is_null(mad), pc.and_(pc.is_finite(mad), pc.greater_equal(mad, 0.0))),
           "must be null or finite and >= 0")
    samples = batch.column("samples")
    refuse("samples", pc.or_kleene(pc.is_null(samples), pc.greater_equal(samples, 0)), "must be null or >= 0")
