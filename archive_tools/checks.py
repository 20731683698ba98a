"""Column-wise checks of archive batches with pyarrow compute: key form and order, key parts, value ranges.

Each raises ArchiveError naming the file, the first bad row and the column.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from farm.errors import ArchiveError
from farm.identity import KEY_VERSION
from farm.stores.archive.schema import _short


def check_order(path: Path, keys: Any, at: int, previous: str | None,
                label: Callable[[str], str] | None = None) -> str | None:
    """Columnar: every key is greater than the one before it (the writer sorts the rows: a repeat is a duplicate
    key), ``previous`` being the last key of the batch before. Returns the last key. ``label``: how a key is
    named in the error (default: the first digits of its sha256)."""
    import pyarrow.compute as pc

    if len(keys) == 0:
        return previous
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
    name = label(key) if label is not None else hashlib.sha256(key.encode()).hexdigest()[:12]
    raise ArchiveError(f"{path}: row {at + i} (key {name}): {what}: refused")


def per_value(column: Any, function: Callable[[Any], Any]) -> Any:
    """``function`` of a column, computed once per distinct value when the column is dictionary-encoded."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        return function(column.dictionary).take(column.indices)
    return function(column)


def constant(column: Any) -> str | None:
    """The one value of a dictionary-encoded string column whose dictionary holds a single value and which has no
    nulls (every row holds it), else None: such a column joins as a scalar."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type) and len(column.dictionary) == 1 and column.null_count == 0 and len(column):
        value = column.dictionary[0].as_py()
        return value if isinstance(value, str) else None
    return None


def join_fields(parts: list[Any], json_text: bool = False) -> Any:
    """Columnar ``farm.encoding.fields``: each part (a string column or a str) as ``<UTF-8 length>:<text>``,
    joined. ``json_text``: the joined text as it appears inside a JSON string (json.dumps' escapes). Parts that
    hold one value in every row (a str, or a dictionary column of one value) are encoded once and joined with
    their neighbours before the columns are."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def encode(values: Any) -> Any:
        text = json_escaped(values) if json_text else values
        return pc.binary_join_element_wise(pc.cast(pc.binary_length(values), pa.string()), text, ":")

    encoded: list[Any] = []
    for part in parts:
        value = part if isinstance(part, str) else constant(part)
        if value is None:
            encoded.append(per_value(part, encode))
            continue
        text = f"{len(value.encode())}:{_escape(value) if json_text else value}"
        if encoded and isinstance(encoded[-1], str):
            encoded[-1] += text
        else:
            encoded.append(text)
    if all(isinstance(e, str) for e in encoded):  # every row the same: as many rows as the columns have
        return pa.array(encoded * len(next(p for p in parts if not isinstance(p, str))), pa.string())
    return pc.binary_join_element_wise(*encoded, "")


_escape_string = json.encoder.encode_basestring_ascii  # json.dumps' own string form


def _escape(text: str) -> str:
    return str(_escape_string(text))[1:-1]


_PLAIN_JSON = "^[\\x20-\\x21\\x23-\\x5b\\x5d-\\x7e]*$"  # what json.dumps writes as it is: printable ASCII but " and \\


def needs_escape(part: Any) -> bool:
    """Whether a string, or some value of a string column, is not written as it is inside a JSON string."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(part, str):
        return _escape(part) != part
    if pa.types.is_dictionary(part.type):
        part = part.dictionary
    return pc.all(pc.match_substring_regex(part, _PLAIN_JSON)).as_py() is False


def json_escaped(values: Any) -> Any:
    """Each string as it appears between the quotes of its JSON string (json.dumps, ASCII only): as it is when
    it holds only printable ASCII other than " and \\, else escaped by :mod:`json`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pc.all(pc.match_substring_regex(values, _PLAIN_JSON)).as_py() is not False:
        return values
    return pa.array([None if v is None else _escape(v) for v in values.to_pylist()], pa.string())


def check_key_version(path: Path, batch: Any, at: int) -> None:
    import pyarrow.compute as pc

    column = batch.column("key_version")
    i = pc.index(per_value(column, lambda values: pc.not_equal(values, KEY_VERSION)), True).as_py()
    if i >= 0:
        raise ArchiveError(f"{path}: row {at + i}: column 'key_version' = {_short(column[i].as_py())}: this farm "
                           f"reads {KEY_VERSION} keys only")


def check_decision_ranges(path: Path, batch: Any, at: int, label: Callable[[int], str]) -> None:
    """Columnar range checks of a batch of decision rows (ArchiveError naming the first bad row); ``label(i)``
    names row i's key."""
    import pyarrow.compute as pc

    def refuse(name: str, ok: Any, rule: str) -> None:
        ok = pc.fill_null(ok, False)
        i = pc.index(ok, False).as_py()
        if i >= 0:
            raise ArchiveError(f"{path}: row {at + i} (key {label(i)}): column {name!r} = "
                               f"{batch.column(name)[i].as_py()!r} is out of range ({rule})")

    ratio, created = batch.column("ratio"), batch.column("created")
    refuse("ratio", pc.and_(pc.is_finite(ratio), pc.greater(ratio, 0.0)), "must be finite and > 0")
    refuse("winner_index", pc.greater_equal(batch.column("winner_index"), 0), "must be >= 0")
    refuse("reference_index", pc.greater_equal(batch.column("reference_index"), 0), "must be >= 0")
    refuse("created", pc.and_(pc.is_finite(created), pc.greater_equal(created, 0.0)), "must be finite and >= 0")
