"""Reading archives: every byte is checked before it is trusted, and hostile files are refused, never followed.

The files are opened and checked by ``farm.stores.archive.files`` (regular files only, size and sha256 against the
manifest, Parquet schema and row counts before decoding). Schema 2 decisions are verified by
``farm.stores.archive.rows`` (column-wise checks, then each record rebuilt from its columns against its stored
checksum), schema 1 by ``farm.stores.archive.v1``. Any failure is an :class:`ArchiveError` naming the file, the
row and the field.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.environment import fingerprint_digest
from farm.stores.archive.files import MAX_GROUP_BYTES as MAX_GROUP_BYTES
from farm.stores.archive.files import MAX_GROUP_ROWS as MAX_GROUP_ROWS
from farm.stores.archive.files import READ_BATCH_ROWS as READ_BATCH_ROWS
from farm.stores.archive.files import batches, parquet_file, verified_bytes
from farm.stores.archive.files import read_regular as read_regular
from farm.stores.archive.rows import ArchiveRows, MetaChecks, decode_decisions
from farm.stores.archive.schema import (
    DATA_FILES,
    DECISION_COLUMNS,
    DECISIONS_FILE,
    MANIFEST_FILE,
    READABLE_VERSIONS,
    TRIAL_COLUMNS,
    TRIALS_FILE,
    ArchiveEntry,
    ArchiveError,
    check_trial_ranges,
)
from farm.stores.archive.signing import Trust
from farm.stores.archive.trialjson import group_trials, trial_fragments
from farm.stores.base import DecisionRecord
from farm.stores.columns import TextColumn

MAX_MANIFEST_BYTES = 1 << 20
# Schema 2 columns decoded as dictionaries: each distinct value is checked and encoded once.
_READ_DICTIONARY = ("key_version", "scope", "operation_key", "execution_context", "manifest", "accuracy_key", "winner")
_READ_TRIAL_DICTIONARY = tuple(name for name, kind, _ in TRIAL_COLUMNS if kind == "string" and name != "extra_json")


class Manifest(dict[str, Any]):
    """A checked manifest.json; ``signer``: the key id whose signature of it was verified (None: not checked, or
    an unsigned archive accepted for development)."""

    signer: str | None = None


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


def is_archive(path: Path) -> bool:
    return os.path.lexists(path / MANIFEST_FILE)


def archive_folders(path: Path | str) -> list[Path]:
    """``path`` itself when it is one archive (holds manifest.json), else every archive folder directly inside it
    (hidden temp folders skipped), sorted. ArchiveError when the path is missing or holds no archive."""
    path = Path(path)
    if not path.is_dir():
        raise ArchiveError(f"{path}: no such archive directory")
    if is_archive(path):
        return [path]
    found = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".") and is_archive(p))
    if not found:
        raise ArchiveError(f"{path}: holds no archive (no {MANIFEST_FILE} in it or in its folders)")
    return found


def read_manifest(folder: Path, trust: Trust | None = None) -> Manifest:
    """Parse and check manifest.json: schema version, fingerprint and digest (= the folder name), row counts,
    checksums; given ``trust``, its signature first (``Trust.check``, on the very bytes parsed). ArchiveError
    naming the file and field otherwise."""
    path = folder / MANIFEST_FILE
    raw = read_regular(path, limit=MAX_MANIFEST_BYTES)
    signer = trust.check(folder, raw) if trust is not None else None
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ArchiveError(f"{path}: not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise ArchiveError(f"{path}: a {type(data).__name__}, not an object")
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise ArchiveError(f"{path}: field 'schema_version' = {version!r}: this farm reads archive schema versions "
                           f"{' and '.join(map(str, READABLE_VERSIONS))} only")
    fingerprint = data.get("fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise ArchiveError(f"{path}: field 'fingerprint' = {fingerprint!r}: must be the fingerprint text")
    digest = fingerprint_digest(fingerprint)
    if data.get("digest") != digest:
        raise ArchiveError(f"{path}: field 'digest' = {data.get('digest')!r} is not the digest of field "
                           f"'fingerprint' ({digest})")
    if folder.name != digest:
        raise ArchiveError(f"{path}: the folder is named {folder.name!r}, not after its fingerprint digest {digest}")
    rows = data.get("rows")
    if not isinstance(rows, dict):
        raise ArchiveError(f"{path}: field 'rows' = {rows!r}: must be an object")
    for name in ("decisions", "trials"):
        n = rows.get(name)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ArchiveError(f"{path}: field 'rows.{name}' = {n!r}: must be a count")
    sums = data.get("sha256")
    if not isinstance(sums, dict):
        raise ArchiveError(f"{path}: field 'sha256' = {sums!r}: must be an object")
    for name in DATA_FILES:
        value = sums.get(name)
        if not (isinstance(value, str) and len(value) == 64):
            raise ArchiveError(f"{path}: field 'sha256.{name}' = {value!r}: must be a sha256 hex digest")
    sizes = data.get("bytes")
    if not (isinstance(sizes, dict) and all(isinstance(sizes.get(n), int) and not isinstance(sizes.get(n), bool)
                                            and sizes[n] >= 0 for n in DATA_FILES)):
        raise ArchiveError(f"{path}: field 'bytes' = {sizes!r}: must hold the byte count of each file")
    manifest = Manifest(data)
    manifest.signer = signer
    return manifest


def read_archive(folder: Path | str, *, trials: bool = True, trust: Trust | None = None) -> Archive:
    """Read and verify one archive folder completely (schema 1 or 2); ArchiveError (naming file, row and field)
    on any problem. A key that appears twice is refused. ``trials=False`` leaves the trial rows out. Given
    ``trust``, the manifest's signature is checked first (imports and merges; inspect and diff only read)."""
    from farm.stores.archive import v1

    folder = Path(folder)
    manifest = read_manifest(folder, trust)
    version = manifest["schema_version"]
    digest = manifest["digest"]
    columns, trial_columns = (DECISION_COLUMNS, TRIAL_COLUMNS) if version == 2 else (v1.DECISION_COLUMNS,
                                                                                      v1.TRIAL_COLUMNS)
    path = folder / DECISIONS_FILE
    pf = parquet_file(path, verified_bytes(folder, DECISIONS_FILE, manifest), columns, digest,
                      manifest["rows"]["decisions"], version, _READ_DICTIONARY if version == 2 else ())
    trial_path = folder / TRIALS_FILE
    trial_pf = parquet_file(trial_path, verified_bytes(folder, TRIALS_FILE, manifest), trial_columns, digest,
                            manifest["rows"]["trials"], version,
                            _READ_TRIAL_DICTIONARY if version == 2 else ()) if trials else None
    if version == 1:
        return Archive(folder, manifest, v1.read_v1(folder, manifest, pf, trial_pf))
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

