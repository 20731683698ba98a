"""Verified decisions in columns, and the schema 2 decoding that produces them.

A batch of decisions.parquet is checked column-wise first (ranges, key version, the cache keys rebuilt from their
parts and strictly increasing, ``meta_json`` a JSON object), its record texts are built column-wise (the canonical
JSON ``record_body`` gives, strings escaped as json.dumps escapes them), then each row is checked in one tight
loop: the key's sha256 against ``key_hash``, the key's manifest and accuracy parts (once per distinct value), the
winner in the manifest, and the sha256 of the record text against the stored ``checksum`` (the whole batch's
sums compared at once; the first failing row is named). ``meta_json`` is checked by Arrow's JSON reader on a
thread beside this loop (:class:`MetaChecks`). The trial rows become JSON in ``farm_archives.trialjson``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import ArchiveError
from farm.keyroster import KeyRoster
from farm.stores.archive.schema import _encode_string, _short
from farm.stores.base import SCHEMA_VERSION, DecisionRecord, PublicationBatch, event_run
from farm_archives.checks import (
    check_decision_ranges,
    check_key_version,
    check_order,
    join_fields,
    needs_escape,
    per_value,
)
from farm_archives.columns import TextColumn
from farm_archives.derived import canonical_accuracy, canonical_manifest, manifest_names, winner_problem


@dataclass
class ArchiveRows:
    """Verified decisions, column by column, in file order: what an import publishes."""

    keys: TextColumn = field(default_factory=TextColumn)  # cache keys
    digests: list[bytes] = field(default_factory=list)  # their sha256 (``farm.stores.base.key_hash``)
    texts: TextColumn = field(default_factory=TextColumn)  # DecisionRecord.to_json text, checksum verified
    verified: list[bool] = field(default_factory=list)
    created: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # the winners' names
    runs: list[str] = field(default_factory=list)  # meta.run as an update event shows it
    problem_ids: list[str | None] = field(default_factory=list)
    trials: TextColumn = field(default_factory=TextColumn)  # JSON list of the trial rows; "" for none

    def __len__(self) -> int:
        return len(self.keys)

    def batch(self, fingerprint: str) -> PublicationBatch:
        """These decisions as one publication batch of ``fingerprint``."""
        return PublicationBatch(fingerprint, self.keys, self.digests, self.texts, self.verified, self.created,
                                self.names, self.runs, self.problem_ids, self.trials)

    def add(self, record: DecisionRecord, text: str, problem_id: str | None, trials: str) -> None:
        """Append one decision given as a record (schema 1, re-keyed imports)."""
        self.keys.append(record.cache_key)
        self.digests.append(hashlib.sha256(record.cache_key.encode()).digest())
        self.texts.append(text)
        self.verified.append(record.verified)
        self.created.append(record.created)
        self.names.append(record.name)
        self.runs.append(event_run(record.meta.get("run")))
        self.problem_ids.append(problem_id)
        self.trials.append(trials)


class MetaChecks:
    """Checks of the ``meta_json`` columns on a thread of ``pool`` (Arrow's JSON reader works without the GIL),
    batch after batch, beside the rest of the decoding. ``check()`` raises the first batch's error, in file
    order; ``runs()`` gives every row's ``meta.run`` once all are checked."""

    def __init__(self, pool: Executor) -> None:
        self._pool = pool
        self._pending: list[Future[list[str]]] = []

    def submit(self, path: Path, column: Any, at: int, label: Callable[[int], str]) -> None:
        self._pending.append(self._pool.submit(_meta_runs, path, column, at, label))

    def check(self) -> None:
        for future in self._pending:
            future.result()

    def cancel(self) -> None:
        for future in self._pending:
            future.cancel()

    def runs(self) -> list[str]:
        return [run for future in self._pending for run in future.result()]


def decode_decisions(path: Path, batch: Any, at: int, fingerprint: str, previous: str | None,
                     rows: ArchiveRows, metas: MetaChecks) -> str | None:
    """Verify one batch of schema 2 decision rows and append them to ``rows`` (their ``meta_json`` checked by
    ``metas``, which gives their runs); return the batch's last cache key (``previous``: the last key of the
    batch before). The checks of a row run in this order, and the first failing row is reported: key hash,
    manifest, accuracy key, winner, checksum."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    if n == 0:  # a row group of no rows (a hand-made file): nothing to check or add
        return previous
    reference = pc.cast(batch.column("reference_index"), pa.string())
    parts = [batch.column("key_version"), batch.column("scope"), batch.column("operation_key"), fingerprint,
             batch.column("workload"), batch.column("execution_context"), reference, batch.column("manifest"),
             batch.column("accuracy_key")]
    keys_array = join_fields(parts)

    def label(i: int) -> str:
        return hashlib.sha256(str(keys_array[i].as_py()).encode()).hexdigest()[:12]

    check_decision_ranges(path, batch, at, label)
    check_key_version(path, batch, at)
    last = check_order(path, keys_array, at, previous)
    metas.submit(path, batch.column("meta_json"), at, label)
    created, ratios = batch.column("created").to_pylist(), batch.column("ratio").to_pylist()
    # The record texts, column-wise: the canonical JSON of each record ending with its stored checksum. The text
    # before that checksum, closed by "}", is what the checksum is the sha256 of.
    json_key = join_fields(parts, json_text=True) if any(map(needs_escape, parts)) else keys_array
    winner = batch.column("winner")
    column = batch.column("checksum")
    stored = column.buffers()[1].to_pybytes()[32 * column.offset : 32 * (column.offset + n)]
    checksums = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(0, 64 * n + 1, 64, dtype=np.int32)),
                                                       pa.py_buffer(stored.hex().encode())])
    texts = pc.binary_join_element_wise(
        '{"cache_key":"', json_key, '","created":', _reprs(created), ',"index":',
        pc.cast(batch.column("winner_index"), pa.string()), ',"meta":', batch.column("meta_json"), ',"name":',
        per_value(winner, _json_strings), ',"ratio":', _reprs(ratios), ',"reference_index":', reference,
        f',"schema":{SCHEMA_VERSION},"verified":', pc.if_else(batch.column("verified"), "true", "false"),
        ',"checksum":"', checksums, '"}', "")
    sha256 = hashlib.sha256
    row_sums = []
    for text in _views(texts):
        digest = sha256(text[:-_CHECKSUM_TAIL])
        digest.update(b"}")
        row_sums.append(digest.digest())
    sums = b"".join(row_sums)
    digests = [sha256(key).digest() for key in _views(keys_array)]
    key_hashes = np.frombuffer(b"".join(digests), dtype=">i8").reshape(n, 4)[:, 0]
    wrong_hash = np.flatnonzero(key_hashes != batch.column("key_hash").to_numpy())
    # The key's manifest and accuracy parts and the winner, checked once per distinct combination.
    m_codes, m_values = _codes(batch.column("manifest"))
    a_codes, a_values = _codes(batch.column("accuracy_key"))
    w_codes, w_values = _codes(winner)
    combos = np.stack([m_codes, a_codes, batch.column("winner_index").to_numpy(),
                       batch.column("reference_index").to_numpy(), w_codes], axis=1).astype(np.int64)
    distinct, first_rows = np.unique(combos, axis=0, return_index=True)
    wrong_rows = [int(row) for combo, row in zip(distinct.tolist(), first_rows.tolist(), strict=True)
                  if _combo_problem(tuple(combo), m_values, a_values, w_values) is not None]
    firsts = [int(wrong_hash[0])] if len(wrong_hash) else []
    if wrong_rows:
        firsts.append(min(wrong_rows))
    if sums != stored:
        firsts.append(next(i for i in range(n) if sums[32 * i : 32 * i + 32] != stored[32 * i : 32 * i + 32]))
    if firsts:
        i = min(firsts)
        stored_hash = batch.column("key_hash")[i].as_py()
        problem = (f"column 'key_hash' = {stored_hash} is not the sha256 of the row's cache key"
                   if key_hashes[i] != stored_hash else _combo_problem(tuple(combos[i].tolist()), m_values, a_values, w_values)
                   or f"column 'checksum' = {stored[32 * i : 32 * i + 32].hex()[:12]}… is not the sha256 of the "
                      f"record rebuilt from the row's columns: a column was modified")
        raise ArchiveError(f"{path}: row {at + i} (key {digests[i].hex()[:12]}): {problem}")
    rows.digests += digests
    rows.keys.append_array(keys_array)
    rows.texts.append_array(texts)
    rows.names += [w_values[c] for c in w_codes.tolist()]
    rows.verified += batch.column("verified").to_pylist()
    rows.created += created
    rows.problem_ids += batch.column("problem_id").to_pylist()
    return last


def _views(values: Any) -> list[memoryview]:
    """The UTF-8 bytes of each value of a string array without nulls, as views of its data buffer."""
    import numpy as np

    _, offsets, data = values.buffers()
    bounds = np.frombuffer(offsets, np.int32, len(values) + 1, 4 * values.offset).tolist()
    whole = memoryview(data if data is not None else b"")
    return [whole[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _combo_problem(combo: tuple[int, ...], m_values: list[Any], a_values: list[Any],
                   w_values: list[Any]) -> str | None:
    """What is wrong with a row's (manifest code, accuracy code, winner index, reference index, winner code), in
    the order the rows are checked; None when nothing is."""
    m, a, index, reference, w = combo
    names = _names(m_values[m])
    if names is None:
        return f"column 'manifest' = {_short(m_values[m])} is not a candidate manifest: " \
               f"{canonical_manifest(m_values[m])}"
    if canonical_accuracy(a_values[a]) is not None:
        return f"column 'accuracy_key' = {_short(a_values[a])} is not an accuracy key: " \
               f"{canonical_accuracy(a_values[a])}"
    return winner_problem(names, index, reference, w_values[w], "column")


def _reprs(values: list[float]) -> Any:
    """Python's own text of each float (``repr``, as json.dumps writes it)."""
    import pyarrow as pa

    return pa.array(list(map(float.__repr__, values)), pa.string())


def _json_strings(values: Any) -> Any:
    """The JSON string (json.dumps: quotes, escapes, ASCII only) of each value of a (small) string array."""
    import pyarrow as pa

    return pa.array([_encode_string(v) for v in values.to_pylist()], pa.string())


_CHECKSUM_TAIL = len(',"checksum":"') + 64 + len('"}')  # what follows a record's checksummed text
_RUN_SCHEMA: Any = None
_MAX_BRACKETS = 500  # more opening brackets than this (a nesting json.loads may refuse): json.loads decides


def _meta_runs(path: Path, column: Any, at: int, label: Callable[[int], str]) -> list[str]:
    """Check that every ``meta_json`` is a JSON object, and return the ``run`` of each as an update event shows
    it. Arrow's JSON reader checks a batch at once when every value is one line holding one object; whatever it
    does not accept is decided by :func:`json.loads`, as :meth:`DecisionRecord.from_json` decides, row by row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    global _RUN_SCHEMA
    if _RUN_SCHEMA is None:
        _RUN_SCHEMA = pj.ParseOptions(explicit_schema=pa.schema([("run", pa.string())]),
                                      unexpected_field_behavior="ignore")
    if len(column) == 0:
        return []
    if _one_line_objects(column):
        lines = pc.binary_join_element_wise(column, "\n", "")  # a new array: its values are the whole buffer
        size = int(np.frombuffer(lines.buffers()[1], np.int32, len(lines) + 1)[-1])
        try:
            table = pj.read_json(pa.BufferReader(lines.buffers()[2][:size]), parse_options=_RUN_SCHEMA,
                                 read_options=pj.ReadOptions(block_size=1 << 26))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            table = None
        if table is not None and table.num_rows == len(column):
            return [run or "" for run in table.column(0).to_pylist()]
    runs = []
    for i, text in enumerate(column.to_pylist()):
        try:
            meta = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ArchiveError(f"{path}: row {at + i} (key {label(i)}): column 'meta_json' is not JSON: {e}") from None
        if type(meta) is not dict:
            raise ArchiveError(f"{path}: row {at + i} (key {label(i)}): column 'meta_json' is a "
                               f"{type(meta).__name__}, not an object")
        runs.append(event_run(meta.get("run")))
    return runs


def _one_line_objects(column: Any) -> bool:
    """Whether every value of a string column (no nulls) is one line that Arrow's JSON reader may take as one
    object: no control character in it (json.dumps writes none; JSON allows them only as whitespace), ``{``
    first and ``}`` last, and no more opening brackets than json.loads surely accepts as nesting. Decided on
    the column's bytes at once."""
    import numpy as np

    _, offsets, data = column.buffers()
    bounds = np.frombuffer(offsets, np.int32, len(column) + 1, 4 * column.offset)
    if data is None or bool((bounds[1:] <= bounds[:-1]).any()):  # an empty value
        return False
    text = np.frombuffer(data, np.uint8)[bounds[0] : bounds[-1]]
    starts = bounds[:-1] - bounds[0]
    if bool((text < 0x20).any()) or not (bool((text[starts] == ord("{")).all())
                                          and bool((text[bounds[1:] - bounds[0] - 1] == ord("}")).all())):
        return False
    if len(text) <= 2 * _MAX_BRACKETS:  # no value long enough to hold more brackets than the limit
        return True
    brackets = np.flatnonzero((text == ord("{")) | (text == ord("[")))
    counts = np.diff(np.searchsorted(brackets, bounds - bounds[0]))
    return bool(counts.max() <= _MAX_BRACKETS)


def _codes(column: Any) -> tuple[Any, list[Any]]:
    """The dictionary codes of a column's rows (a numpy array) and the dictionary's values (encoded here if the
    column is plain)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    return column.indices.to_numpy(zero_copy_only=False), column.dictionary.to_pylist()


def _names(manifest_part: str) -> KeyRoster | None:
    if canonical_manifest(manifest_part) is not None:
        return None
    return manifest_names(manifest_part)
