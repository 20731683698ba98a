"""Verified decisions in columns, and the schema 2 decoding that produces them.

A batch of decisions.parquet is checked column-wise first (ranges, key version, the cache keys rebuilt from their
parts and strictly increasing, ``meta_json`` a JSON object), its record texts are built column-wise (the canonical
JSON ``record_body`` gives, strings escaped as json.dumps escapes them), then each row is checked in one tight
loop: the key's sha256 against ``key_hash``, the key's manifest and accuracy parts (once per distinct value), the
winner in the manifest, and the sha256 of the record text against the stored ``checksum``. The trial rows of every
decision become the JSON text that Redis and the local cache store, built column-wise, each distinct string once
(rows with characters JSON escapes, non-finite numbers or extra fields are encoded by :mod:`json` instead).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import ArchiveError
from farm.stores.archive.checks import (
    check_decision_ranges,
    check_key_version,
    check_order,
    join_fields,
    needs_escape,
    per_value,
)
from farm.stores.archive.derived import canonical_accuracy, canonical_manifest, manifest_names
from farm.stores.archive.schema import (
    TRIAL_FIELDS,
    TRIAL_TYPES,
    _encode_string,
    _short,
)
from farm.stores.base import SCHEMA_VERSION, DecisionRecord, PublicationBatch, event_run


@dataclass
class ArchiveRows:
    """Verified decisions, column by column, in file order: what an import publishes."""

    keys: list[str] = field(default_factory=list)  # cache keys
    digests: list[bytes] = field(default_factory=list)  # their sha256 (``farm.stores.base.key_hash``)
    texts: list[str] = field(default_factory=list)  # DecisionRecord.to_json text, checksum verified
    verified: list[bool] = field(default_factory=list)
    created: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # the winners' names
    runs: list[str] = field(default_factory=list)  # meta.run as an update event shows it
    problem_ids: list[str | None] = field(default_factory=list)
    trials: list[str] = field(default_factory=list)  # JSON list of the trial rows; "" for none

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


def decode_decisions(path: Path, batch: Any, at: int, fingerprint: str, previous: str | None,
                     rows: ArchiveRows) -> str | None:
    """Verify one batch of schema 2 decision rows and append them to ``rows``; return the batch's last cache key
    (``previous``: the last key of the batch before)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = [batch.column("key_version"), batch.column("scope"), batch.column("operation_key"), fingerprint,
             batch.column("workload"), batch.column("execution_context"),
             pc.cast(batch.column("reference_index"), pa.string()), batch.column("manifest"), batch.column("accuracy_key")]
    keys_array = join_fields(parts)

    def label(i: int) -> str:
        return hashlib.sha256(str(keys_array[i].as_py()).encode()).hexdigest()[:12]

    check_decision_ranges(path, batch, at, label)
    check_key_version(path, batch, at)
    last = check_order(path, keys_array, at, previous)
    col = {name: batch.column(name).to_pylist() for name in (
        "key_hash", "winner_index", "reference_index", "verified", "ratio", "created", "meta_json", "checksum",
        "problem_id")}
    hashes, indexes, references = col["key_hash"], col["winner_index"], col["reference_index"]
    checksums, created = col["checksum"], col["created"]
    meta_runs = _meta_runs(path, batch.column("meta_json"), col["meta_json"], at, label)
    # The record texts, column-wise: the canonical JSON of each record with its stored checksum.
    json_key = join_fields(parts, json_text=True) if any(map(needs_escape, parts)) else keys_array
    body = pc.binary_join_element_wise(
        '{"cache_key":"', json_key, '","created":', _reprs(created), ',"index":',
        pc.cast(batch.column("winner_index"), pa.string()), ',"meta":', batch.column("meta_json"), ',"name":',
        per_value(batch.column("winner"), _json_strings), ',"ratio":', _reprs(col["ratio"]), ',"reference_index":',
        parts[6], f',"schema":{SCHEMA_VERSION},"verified":',
        pc.if_else(batch.column("verified"), "true", "false"), "")
    bodies = pc.binary_join_element_wise(body, "}", "").cast(pa.binary()).to_pylist()
    texts = pc.binary_join_element_wise(body, ',"checksum":"', pa.array([c.hex() for c in checksums], pa.string()),
                                        '"}', "")
    m_codes, m_values = _codes(batch.column("manifest"))
    a_codes, a_values = _codes(batch.column("accuracy_key"))
    w_codes, w_values = _codes(batch.column("winner"))
    names_of = [_names(value) for value in m_values]  # None: not a canonical manifest
    accuracy_ok = [canonical_accuracy(value) is None for value in a_values]
    sha256, from_bytes = hashlib.sha256, int.from_bytes
    digests = rows.digests
    for i, key in enumerate(keys_array.cast(pa.binary()).to_pylist()):
        digest = sha256(key).digest()
        names = names_of[m_codes[i]]
        index, reference, winner = indexes[i], references[i], w_values[w_codes[i]]
        if from_bytes(digest[:8], "big", signed=True) != hashes[i]:
            problem = f"column 'key_hash' = {hashes[i]} is not the sha256 of the row's cache key"
        elif names is None:
            problem = f"column 'manifest' = {_short(m_values[m_codes[i]])} is not a candidate manifest: " \
                      f"{canonical_manifest(m_values[m_codes[i]])}"
        elif not accuracy_ok[a_codes[i]]:
            problem = f"column 'accuracy_key' = {_short(a_values[a_codes[i]])} is not an accuracy key: " \
                      f"{canonical_accuracy(a_values[a_codes[i]])}"
        elif index >= len(names) or reference >= len(names) or names[index] != winner:
            problem = _winner_problem(names, index, reference, winner)
        elif sha256(bodies[i]).digest() != checksums[i]:
            problem = (f"column 'checksum' = {checksums[i].hex()[:12]}… is not the sha256 of the record rebuilt "
                       f"from the row's columns: a column was modified")
        else:
            digests.append(digest)
            continue
        raise ArchiveError(f"{path}: row {at + i} (key {digest.hex()[:12]}): {problem}")
    rows.keys += keys_array.to_pylist()
    rows.texts += texts.to_pylist()
    rows.names += [w_values[c] for c in w_codes]
    rows.runs += meta_runs
    rows.verified += col["verified"]
    rows.created += created
    rows.problem_ids += col["problem_id"]
    return last


def _reprs(values: list[float]) -> Any:
    """Python's own text of each float (``repr``, as json.dumps writes it)."""
    import pyarrow as pa

    return pa.array(list(map(float.__repr__, values)), pa.string())


def _json_strings(values: Any) -> Any:
    """The JSON string (json.dumps: quotes, escapes, ASCII only) of each value of a (small) string array."""
    import pyarrow as pa

    return pa.array([_encode_string(v) for v in values.to_pylist()], pa.string())


_RUN_SCHEMA: Any = None
_MAX_BRACKETS = 500  # more opening brackets than this (a nesting json.loads may refuse): json.loads decides


def _meta_runs(path: Path, column: Any, metas: list[str], at: int, label: Any) -> list[str]:
    """Check that every ``meta_json`` is a JSON object, and return the ``run`` of each as an update event shows
    it. Arrow's JSON reader checks a batch at once when every value is one line holding one object; whatever it
    does not accept is decided by :func:`json.loads`, as :meth:`DecisionRecord.from_json` decides, row by row."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    global _RUN_SCHEMA
    if _RUN_SCHEMA is None:
        _RUN_SCHEMA = pj.ParseOptions(explicit_schema=pa.schema([("run", pa.string())]),
                                      unexpected_field_behavior="ignore")
    data = "\n".join(metas).encode()
    # One line per value (no line break inside one), each an object, none with so many brackets that json.loads
    # could refuse its nesting (only a value longer than twice the limit can hold more).
    simple = (bool(metas) and data.count(b"\n") == len(metas) - 1 and b"\r" not in data
              and pc.all(pc.and_(pc.starts_with(column, "{"), pc.ends_with(column, "}"))).as_py()
              and all(metas[i].count("{") + metas[i].count("[") <= _MAX_BRACKETS
                      for i in pc.indices_nonzero(pc.greater(pc.binary_length(column), 2 * _MAX_BRACKETS)).to_pylist()))
    if simple:
        try:
            table = pj.read_json(pa.BufferReader(data), parse_options=_RUN_SCHEMA,
                                 read_options=pj.ReadOptions(block_size=1 << 26))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            table = None
        if table is not None and table.num_rows == len(metas):
            return [run or "" for run in table.column(0).to_pylist()]
    runs = []
    for i, text in enumerate(metas):
        try:
            meta = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ArchiveError(f"{path}: row {at + i} (key {label(i)}): column 'meta_json' is not JSON: {e}") from None
        if type(meta) is not dict:
            raise ArchiveError(f"{path}: row {at + i} (key {label(i)}): column 'meta_json' is a "
                               f"{type(meta).__name__}, not an object")
        runs.append(event_run(meta.get("run")))
    return runs


def _codes(column: Any) -> tuple[list[int], list[Any]]:
    """The dictionary codes of a column's rows and the dictionary's values (encoded here if it is plain)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    return column.indices.to_pylist(), column.dictionary.to_pylist()


def _names(manifest_part: str) -> tuple[str, ...] | None:
    if canonical_manifest(manifest_part) is not None:
        return None
    return manifest_names(manifest_part)


def _winner_problem(names: tuple[str, ...], index: int, reference: int, winner: str) -> str:
    for what, i in (("winner_index", index), ("reference_index", reference)):
        if i >= len(names):
            return f"column {what!r} = {i} is out of range for the key's {len(names)} candidates"
    return f"column 'winner' = {_short(winner)} is not candidate {index} of the key ({names[index]!r})"


# -- trial rows as JSON -----------------------------------------------------------------------------------------

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
    fragments = []
    python = pc.is_valid(batch.column("extra_json"))  # rows json.dumps encodes
    last = len(TRIAL_TYPES) - 1
    for f, (name, kind) in enumerate(TRIAL_TYPES):
        values = batch.column(name)
        head = f'{"{" if f == 0 else ""}"{name}":'
        tail = "}" if f == last else ""
        if kind == "string":
            text = per_value(values, functools.partial(_string_fragment, head=head, tail=tail))
            odd = per_value(values, _odd)
            python = pc.or_(python, odd)
        elif kind == "float64":
            python = pc.or_(python, pc.invert(pc.fill_null(pc.is_finite(values), True)))
            whole = pc.fill_null(pc.and_(pc.equal(pc.trunc(values), values), pc.less(pc.abs(values), 1e16)), False)
            suffix = pc.if_else(whole, ".0" + tail, tail)  # Arrow writes 1.0 as "1": JSON would read an integer
            text = pc.binary_join_element_wise(head, pc.cast(values, pa.string()), suffix, "")
        else:
            text = pc.binary_join_element_wise(head, pc.cast(values, pa.string()), tail, "")
        fragments.append(pc.fill_null(text, f"{head}null{tail}"))
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
