"""Reading archives: every byte is checked before it is trusted, and hostile files are refused, never followed.

The files are opened and checked by ``farm.stores.archive.files`` (regular files only, size and sha256 against the
manifest, Parquet schema and row counts before decoding). Schema 2 decisions are verified by
``farm_archives.rows`` (column-wise checks, then each record rebuilt from its columns against its stored
checksum). The manifest is checked first (``farm.stores.archive.manifest``). Any failure is an :class:`ArchiveError` naming the file, the
row and the field.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.stores.archive.files import MAX_GROUP_BYTES as MAX_GROUP_BYTES
from farm.stores.archive.files import MAX_GROUP_ROWS as MAX_GROUP_ROWS
from farm.stores.archive.files import READ_BATCH_ROWS as READ_BATCH_ROWS
from farm.stores.archive.files import batches, parquet_file, verified_bytes
from farm.stores.archive.files import read_regular as read_regular
from farm.stores.archive.manifest import read_manifest
from farm.stores.archive.schema import (
    DECISION_COLUMNS,
    DECISIONS_FILE,
    TRIAL_COLUMNS,
    TRIALS_FILE,
    ArchiveEntry,
    ArchiveError,
    check_trial_ranges,
)
from farm.stores.archive.signing import Trust
from farm.stores.base import DecisionRecord
from farm_archives.columns import TextColumn
from farm_archives.rows import ArchiveRows, MetaChecks, decode_decisions
from farm_archives.trialjson import group_trials, trial_fragments

# Schema 2 columns decoded as dictionaries: each distinct value is checked and encoded once.
_READ_DICTIONARY = ("key_version", "scope", "operation_key", "execution_context", "manifest", "accuracy_key", "winner")
_READ_TRIAL_DICTIONARY = tuple(name for name, kind, _ in TRIAL_COLUMNS if kind == "string" and name != "extra_json")


@dataclass
class Archive:
    """A verified archive: its manifest and its decisions (``rows``, file order). ``entries`` gives them as
    :class:`ArchiveEntry` objects by ``key_sha256``, built on first use (imports publish ``rows`` directly)."""

    path: Path
    manifest: dict[str, Any]
    rows: ArchiveRows
    _entries: dict[str, ArchiveEntry] | None = field(default=None, repr=False)

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["fingerprint"])

    @property
    def digest(self) -> str:
        return str(self.manifest["digest"])

    @property
    def signer(self) -> str | None:
        """The key id that signed the archive (verified), or None (unsigned, or read without a trust check)."""
        return getattr(self.manifest, "signer", None)

    @property
    def trial_rows(self) -> int:
        return int(self.manifest["rows"]["trials"])

    @property
    def entries(self) -> dict[str, ArchiveEntry]:
        if self._entries is None:
            rows = self.rows
            self._entries = {
                digest.hex(): ArchiveEntry(DecisionRecord.from_json(text), pid, tuple(json.loads(trials)) if trials
                                           else (), text)
                for digest, text, pid, trials in zip(rows.digests, rows.texts, rows.problem_ids, rows.trials,
                                                     strict=True)}
        return self._entries


def read_archive(folder: Path | str, *, trials: bool = True, trust: Trust | None = None) -> Archive:
    """Read and verify one archive folder completely; ArchiveError (naming file, row and field) on any problem.
    A key that appears twice is refused. ``trials=False`` leaves the trial rows out. Given ``trust``, the
    manifest's signature is checked first (imports and merges; inspect and diff only read)."""
    folder = Path(folder)
    manifest = read_manifest(folder, trust)
    version = manifest["schema_version"]
    digest = manifest["digest"]
    columns, trial_columns = DECISION_COLUMNS, TRIAL_COLUMNS
    path = folder / DECISIONS_FILE
    pf = parquet_file(path, verified_bytes(folder, DECISIONS_FILE, manifest), columns, digest,
                      manifest["rows"]["decisions"], version, _READ_DICTIONARY)
    trial_path = folder / TRIALS_FILE
    trial_pf = parquet_file(trial_path, verified_bytes(folder, TRIALS_FILE, manifest), trial_columns, digest,
                            manifest["rows"]["trials"], version, _READ_TRIAL_DICTIONARY) if trials else None
    decisions = manifest["rows"]["decisions"]

    def trial_rows() -> TextColumn:  # column-wise (Arrow works without the GIL): beside the decisions' loop
        parts: list[tuple[Any, Any]] = []
        if trial_pf is not None:
            previous = -1
            held: tuple[int, Any] | None = None  # a batch is encoded once the next one's first decision is known

            def encode(following: int | None) -> None:
                nonlocal previous
                assert held is not None
                previous, column, rows = trial_fragments(trial_path, held[1], held[0], decisions, previous, following)
                parts.append((column, rows))

            for at, batch in batches(trial_path, trial_pf, trial_columns):
                check_trial_ranges(batch, trial_path, at)
                if batch.num_rows:
                    if held is not None:
                        encode(int(batch.column("decision")[0].as_py()))
                    held = (at, batch)
            if held is not None:
                encode(None)
        return group_trials(decisions, parts)

    # Two threads beside this one: the trial rows, and the meta_json checks batch after batch.
    with ThreadPoolExecutor(2, thread_name_prefix="archive-read") as pool:
        trial_json = pool.submit(trial_rows)
        metas = MetaChecks(pool)
        try:
            rows = ArchiveRows()
            last: str | None = None
            try:
                for at, batch in batches(path, pf, columns):
                    last = decode_decisions(path, batch, at, manifest["fingerprint"], last, rows, metas)
            except ArchiveError:
                metas.check()  # an earlier row's meta_json error is reported first, as in file order
                raise
            rows.runs = metas.runs()
        except BaseException:
            trial_json.cancel()
            metas.cancel()
            raise
        rows.trials = trial_json.result()
    return Archive(folder, manifest, rows)

