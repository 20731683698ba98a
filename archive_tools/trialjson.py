"""The trial rows of every decision as the JSON text Redis and the local cache store, built column-wise.

Each distinct string is encoded once, and a column that holds the same value in every row of a batch once for
the batch; rows with characters JSON escapes, non-finite numbers or extra fields are encoded by :mod:`json`
instead, so every text is what ``json.dumps`` of the rows gives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from farm.errors import ArchiveError
from farm.stores.archive.schema import TRIAL_FIELDS, TRIAL_TYPES
from farm_archives.checks import per_value
from farm_archives.columns import TextColumn

_PLAIN = "^[\\x20-\\x7e]*$"  # strings json.dumps writes as they are (after escaping " and \\)


def _odd(values: Any) -> Any:
    """Which strings json.dumps would escape beyond " and \\ (control and non-ASCII characters)."""
    import pyarrow.compute as pc

    return pc.invert(pc.fill_null(pc.match_substring_regex(values, _PLAIN), True))


def _json_strings(values: Any) -> Any:
    """The JSON string of each value (null stays null), " and \\ escaped."""
    import pyarrow.compute as pc

    if pc.any(pc.match_substring_regex(values, '["\\\\]')).as_py():
        values = pc.replace_substring(pc.replace_substring(values, "\\", "\\\\"), '"', '\\"')
    return pc.binary_join_element_wise('"', values, '"', "")


def _same_in_every_row(values: Any, kind: str) -> bool:
    """Whether every row of a trial column holds the same value (null in every row, or one value bit for bit)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(values) == 0 or values.null_count == len(values):
        return len(values) > 0
    if values.null_count:
        return False
    if kind == "string":
        return pa.types.is_dictionary(values.type) and len(pc.unique(values.indices)) == 1
    bits = values.view(pa.int64()) if kind == "float64" else values  # -0.0 and 0.0 are written differently
    low_high = pc.min_max(bits)
    return bool(low_high["min"].as_py() == low_high["max"].as_py())


def _pieces(values: Any, kind: str) -> tuple[list[Any], Any]:
    """The JSON of each value (``null`` for a null) as pieces to join (arrays, or a str: the same in every row),
    and which rows hold a value that only :mod:`json` encodes as json.dumps does (control or non-ASCII
    characters, non-finite numbers; None: no row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    odd: Any = None
    if kind == "string":
        text = per_value(values, _json_strings)
        if pc.any(per_value(values, _odd) if not pa.types.is_dictionary(values.type) else _odd(values.dictionary)
                  ).as_py():
            odd = per_value(values, _odd)
        return [pc.fill_null(text, "null") if values.null_count else text], odd
    text = pc.cast(values, pa.string())
    if values.null_count:
        text = pc.fill_null(text, "null")
    if kind != "float64":
        return [text], odd
    if not pc.all(pc.fill_null(pc.is_finite(values), True)).as_py():
        odd = pc.invert(pc.fill_null(pc.is_finite(values), True))
    whole = pc.fill_null(pc.and_(pc.equal(pc.trunc(values), values), pc.less(pc.abs(values), 1e16)), False)
    if whole.true_count == 0:
        return [text], odd
    return [text, pc.if_else(whole, ".0", "")], odd  # Arrow writes 1.0 as "1": JSON would read an integer


def trial_fragments(path: Path, batch: Any, at: int, decisions: int, previous: int,
                    following: int | None) -> tuple[int, Any, Any]:
    """Check one trials.parquet batch (column ``decision`` names rows of decisions.parquet, in order) and encode
    its rows: returns (the batch's last decision, its ``decision`` column, each row's JSON object text as an
    Arrow array, with "[" before a decision's first row and "]" after its last). ``previous``: the last decision
    of the batch before (-1 at first); ``following``: the first decision of the batch after (None at the end).
    :func:`group_trials` joins them into each decision's list."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    column = batch.column("decision")
    if batch.num_rows == 0:
        return previous, column, pa.array([], pa.string())
    bad = pc.or_(pc.less(column, 0), pc.greater_equal(column, decisions))
    i = pc.index(bad, True).as_py()
    if i >= 0:
        raise ArchiveError(f"{path}: row {at + i}: column 'decision' = {column[i].as_py()} names no row of "
                           f"decisions.parquet ({decisions} rows)")
    owners = column.to_numpy()
    down = np.flatnonzero(owners[1:] < owners[:-1])
    i = 0 if owners[0] < previous else int(down[0]) + 1 if len(down) else -1
    if i >= 0:
        raise ArchiveError(f"{path}: row {at + i}: column 'decision' = {column[i].as_py()}: rows out of order (the "
                           f"writer writes them in the order of their decisions)")
    opens = np.empty(len(owners), bool)  # a decision's first row, and its last
    opens[0] = owners[0] != previous
    opens[1:] = owners[1:] != owners[:-1]
    closes = np.empty(len(owners), bool)
    closes[:-1] = opens[1:]
    closes[-1] = following is None or following != owners[-1]
    pieces: list[Any] = [pc.if_else(pa.array(opens), "[", "")]
    python = pc.is_valid(batch.column("extra_json"))  # rows json.dumps encodes
    for f, (name, kind) in enumerate(TRIAL_TYPES):
        values = batch.column(name)
        head = f'{"{" if f == 0 else ","}"{name}":'
        parts: list[Any] | None = None
        if _same_in_every_row(values, kind):
            one, odd = _pieces(values.slice(0, 1), kind)
            if odd is None:
                parts = ["".join(p if isinstance(p, str) else p[0].as_py() for p in one)]
        if parts is None:
            parts, odd = _pieces(values, kind)
            if odd is not None:
                python = pc.or_(python, odd)
        for piece in (head, *parts):
            if isinstance(piece, str) and pieces and isinstance(pieces[-1], str):
                pieces[-1] += piece
            else:
                pieces.append(piece)
    if isinstance(pieces[-1], str):
        pieces[-1] += "}"
    else:
        pieces.append("}")
    pieces.append(pc.if_else(pa.array(closes), "]", ""))
    rows = pc.binary_join_element_wise(*pieces, "")
    fallback = pc.indices_nonzero(python).to_pylist()
    if fallback:  # rows with characters JSON escapes, non-finite numbers or extra fields: json.dumps encodes them
        texts = rows.to_pylist()
        for r in fallback:
            texts[r] = f"{'[' if opens[r] else ''}{_python_row(path, batch, at, r)}{']' if closes[r] else ''}"
        rows = pa.array(texts, pa.string())
    return int(owners[-1]), column, rows


_GROUP = 65536  # decisions grouped at once


def group_trials(decisions: int, parts: list[tuple[Any, Any]]) -> TextColumn:
    """Each decision's trial rows as one JSON list text ("" for a decision without rows), from the
    ``(decision column, row texts)`` of every batch (:func:`trial_fragments`, in file order)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def text(value: str) -> Any:
        return pa.scalar(value, pa.large_string())

    texts = TextColumn()
    owners = [np.asarray(column, np.int64) for column, _ in parts if len(column)]
    counts = np.bincount(np.concatenate(owners), minlength=decisions) if owners else np.zeros(decisions, np.int64)
    ends = np.concatenate([[0], np.cumsum(counts)])
    rows = pa.chunked_array([r for _, r in parts if len(r)], pa.string())
    for d in range(0, decisions, _GROUP):
        stop = min(d + _GROUP, decisions)
        offsets = pa.array(ends[d : stop + 1] - ends[d], pa.int64())
        values = rows.slice(int(ends[d]), int(ends[stop] - ends[d])).combine_chunks().cast(pa.large_string())
        # Each row holds its brackets: the list of a decision without rows joins as "".
        texts.append_array(pc.binary_join(pa.LargeListArray.from_arrays(offsets, values), text(",")))
    return texts


def _python_row(path: Path, batch: Any, at: int, r: int) -> str:
    """The JSON of row ``r`` of a batch, by :mod:`json` (with its extra fields)."""
    row = {name: batch.column(name)[r].as_py() for name in TRIAL_FIELDS}
    extra = batch.column("extra_json")[r].as_py()
    if extra is not None:
        try:
            more = json.loads(extra)
        except ValueError as e:
            raise ArchiveError(f"{path}: row {at + r}: column 'extra_json' is not JSON: {e}") from None
        if not isinstance(more, dict) or set(more) & {*TRIAL_FIELDS, "decision", "key_sha256"}:
            raise ArchiveError(f"{path}: row {at + r}: column 'extra_json' must be an object of other fields")
        row.update(more)
    return json.dumps(row, separators=(",", ":"))
