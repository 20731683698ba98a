"""The trial rows of every decision as the JSON text Redis and the local cache store, built column-wise.

Each distinct string is encoded once, and a column that holds the same value in every row of a batch once for
the batch; rows with characters JSON escapes, non-finite numbers or extra fields are encoded by :mod:`json`
instead, so every text is what ``json.dumps`` of the rows gives.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from farm.errors import ArchiveError
from farm.stores.archive.checks import per_value
from farm.stores.archive.schema import TRIAL_FIELDS, TRIAL_TYPES

_PLAIN = "^[\\x20-\\x7e]*$"  # strings json.dumps writes as they are (after escaping " and \\)


def _odd(values: Any) -> Any:
    """Which strings json.dumps would escape beyond " and \\ (control and non-ASCII characters)."""
    import pyarrow.compute as pc

    return pc.invert(pc.fill_null(pc.match_substring_regex(values, _PLAIN), True))


def _string_fragment(values: Any, head: str, tail: str) -> Any:
    """``head`` + the JSON string of each value + ``tail`` (null stays null)."""
    import pyarrow.compute as pc

    if pc.any(pc.match_substring_regex(values, '["\\\\]')).as_py():
        values = pc.replace_substring(pc.replace_substring(values, "\\", "\\\\"), '"', '\\"')
    return pc.binary_join_element_wise(head + '"', values, '"' + tail, "")


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


def _fragment(values: Any, kind: str, head: str, tail: str) -> tuple[Any, Any]:
    """``head`` + the JSON of each value + ``tail`` (``null`` for a null), and which rows hold a value that only
    :mod:`json` encodes as json.dumps does (control or non-ASCII characters, non-finite numbers)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if kind == "string":
        text = per_value(values, functools.partial(_string_fragment, head=head, tail=tail))
        odd = per_value(values, _odd)
    elif kind == "float64":
        odd = pc.invert(pc.fill_null(pc.is_finite(values), True))
        whole = pc.fill_null(pc.and_(pc.equal(pc.trunc(values), values), pc.less(pc.abs(values), 1e16)), False)
        suffix = pc.if_else(whole, ".0" + tail, tail)  # Arrow writes 1.0 as "1": JSON would read an integer
        text = pc.binary_join_element_wise(head, pc.cast(values, pa.string()), suffix, "")
    else:
        odd = pa.array([False] * len(values))
        text = pc.binary_join_element_wise(head, pc.cast(values, pa.string()), tail, "")
    return pc.fill_null(text, f"{head}null{tail}"), odd


def trial_texts(path: Path, batch: Any, at: int, decisions: int, texts: list[str], previous: int) -> int:
    """Append the rows of one trials.parquet batch to ``texts`` (one JSON list text per decision, "" for none),
    after checking that column ``decision`` names rows of decisions.parquet in order. Returns the last decision
    of the batch (``previous``: the last of the batch before, -1 at first)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return previous
    column = batch.column("decision")
    bad = pc.or_(pc.less(column, 0), pc.greater_equal(column, decisions))
    i = pc.index(bad, True).as_py()
    if i >= 0:
        raise ArchiveError(f"{path}: row {at + i}: column 'decision' = {column[i].as_py()} names no row of "
                           f"decisions.parquet ({decisions} rows)")
    first = column[0].as_py()
    i = 0 if first < previous or len(column) < 2 else pc.index(pc.less(column[1:], column[:-1]), True).as_py() + 1
    if i > 0 or first < previous:
        raise ArchiveError(f"{path}: row {at + i}: column 'decision' = {column[i].as_py()}: rows out of order (the "
                           f"writer writes them in the order of their decisions)")
    fragments: list[Any] = []  # a str: the same text in every row (encoded once, joined with its neighbours)
    python = pc.is_valid(batch.column("extra_json"))  # rows json.dumps encodes
    last = len(TRIAL_TYPES) - 1
    for f, (name, kind) in enumerate(TRIAL_TYPES):
        values = batch.column(name)
        head = f'{"{" if f == 0 else ""}"{name}":'
        tail = "}" if f == last else ""
        text: Any = None
        if _same_in_every_row(values, kind):
            one, odd = _fragment(values.slice(0, 1), kind, head, tail)
            if not odd[0].as_py():
                text = one[0].as_py()
        if text is None:
            text, odd = _fragment(values, kind, head, tail)
            python = pc.or_(python, odd)
        elif fragments and isinstance(fragments[-1], str):
            text = f"{fragments.pop()},{text}"
        fragments.append(text)
    if all(isinstance(fragment, str) for fragment in fragments):
        fragments = [pa.array([",".join(fragments)] * batch.num_rows, pa.string())]
    rows = pc.binary_join_element_wise(*fragments, ",")
    runs = pc.run_end_encode(column)
    ends = runs.run_ends.to_pylist()
    owners = runs.values.to_pylist()
    offsets = pa.array([0, *ends], pa.int32())
    lists = pc.binary_join(pa.ListArray.from_arrays(offsets, rows), ",")
    joined = pc.binary_join_element_wise("[", lists, "]", "").to_pylist()
    fallback = set(pc.indices_nonzero(python).to_pylist())
    if not fallback and owners[0] == len(texts) and owners[-1] - owners[0] + 1 == len(owners):
        texts += joined  # consecutive decisions, none begun in the batch before: the common case
        return int(owners[-1])
    start = 0
    for owner, end, text in zip(owners, ends, joined, strict=True):
        if fallback and any(r in fallback for r in range(start, end)):
            text = f"[{_python_rows(path, batch, at, start, end)}]"
        if len(texts) <= owner:
            texts.extend([""] * (owner - len(texts)))
            texts.append(text)
        else:  # the decision's rows began in the batch before
            texts[owner] = f"{texts[owner][:-1]},{text[1:]}"
        start = end
    return int(owners[-1])


def _python_rows(path: Path, batch: Any, at: int, start: int, end: int) -> str:
    """The JSON of rows ``start`` to ``end`` of a batch, by :mod:`json` (with their extra fields)."""
    part = batch.slice(start, end - start)
    values = zip(*(part.column(name).to_pylist() for name in TRIAL_FIELDS), strict=True)
    rows = [dict(zip(TRIAL_FIELDS, v, strict=True)) for v in values]
    for i, extra in enumerate(part.column("extra_json").to_pylist()):
        if extra is None:
            continue
        try:
            more = json.loads(extra)
        except ValueError as e:
            raise ArchiveError(f"{path}: row {at + start + i}: column 'extra_json' is not JSON: {e}") from None
        if not isinstance(more, dict) or set(more) & {*TRIAL_FIELDS, "decision", "key_sha256"}:
            raise ArchiveError(f"{path}: row {at + start + i}: column 'extra_json' must be an object of other fields")
        rows[i].update(more)
    return json.dumps(rows, separators=(",", ":"))[1:-1]
