"""The runtime's read-only fleet tier over archive directories (``StackTuner(policy, fleet=[path])``)."""

from __future__ import annotations

import bisect
import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from farm.encoding import fields
from farm.environment import fingerprint_digest
from farm.errors import ArchiveError, CorruptRecord, TuneFailure
from farm.identity import key_environment
from farm.nearest import FamilyIndex, NearestHit, NearestQuery, hit, nearest_first
from farm.stores.archive.families import NEAR_ROWS, family_index
from farm.stores.archive.files import parquet_file, verified_bytes
from farm.stores.archive.manifest import archive_folders, read_manifest
from farm.stores.archive.priors import FLEET_FAMILY, priors_index
from farm.stores.archive.schema import (
    DECISION_COLUMNS,
    DECISIONS_FILE,
    key_digest,
    key_hash64,
    record_body,
    with_checksum,
)
from farm.stores.archive.signing import UNSIGNED_WARNING, Trust
from farm.stores.base import DecisionRecord, replaces

log = logging.getLogger(__name__)

# The columns a hit decodes (one row group of them) to rebuild the record.
_RECORD_COLUMNS = ("key_version", "scope", "operation_key", "workload", "execution_context", "reference_index",
                   "manifest", "accuracy_key", "created", "winner_index", "meta_json", "winner", "ratio", "verified",
                   "checksum")


class _Loaded:
    """One archive's decisions for lookups: the verified file bytes, a key index -> row, a few decoded groups.

    The index is built one row group at a time from one column alone (``key_hash``, refusing a repeated one):
    memory stays proportional to the file and its index."""

    def __init__(self, folder: Path, manifest: dict[str, Any], row_groups: int) -> None:
        import pyarrow as pa

        path = folder / DECISIONS_FILE
        data = verified_bytes(folder, DECISIONS_FILE, manifest)
        self.version = version = manifest["schema_version"]
        self.fingerprint = manifest["fingerprint"]
        self.pf = parquet_file(path, data, DECISION_COLUMNS, manifest["digest"], manifest["rows"]["decisions"], version)
        self.path = path
        self.starts: list[int] = []
        self.rows: dict[Any, int] = {}
        at = 0
        for g in range(self.pf.num_row_groups):
            self.starts.append(at)
            name = "key_hash"
            try:
                keys = self.pf.read_row_group(g, columns=[name]).column(0)
            except (pa.ArrowException, OSError, ValueError) as e:
                raise ArchiveError(f"{path}: not a readable Parquet file: {e}") from None
            if keys.null_count:
                raise ArchiveError(f"{path}: column {name!r} holds nulls")
            for chunk in keys.chunks:
                for i, value in enumerate(chunk.to_pylist(), at):
                    if self.rows.setdefault(value, i) != i:
                        raise ArchiveError(f"{path}: row {i} (key hash {value & (2**64 - 1):016x}): duplicate "
                                           f"key: refused")
                at += len(chunk)
        self.groups: OrderedDict[int, Any] = OrderedDict()
        self.max_groups = row_groups
        self.families: FamilyIndex | None = None  # the nearest-decision index, built on the first nearest lookup
        self.priors: dict[str, list[int]] | None = None  # the fleet-priors index, built on the first priors lookup

    def row(self, cache_key: str) -> int | None:
        return self.rows.get(key_hash64(key_digest(cache_key)))

    def text(self, row: int, cache_key: str | None) -> str | None:
        """The record text of ``row``; None when its key is not ``cache_key`` (another key whose sha256 begins with
        the same 64 bits; None: any key, for a row found by the nearest-decision index)."""
        g = bisect.bisect_right(self.starts, row) - 1
        group = self.groups.get(g)
        if group is None:
            group = self.pf.read_row_group(g, columns=list(_RECORD_COLUMNS))
            self.groups[g] = group
            if len(self.groups) > self.max_groups:
                self.groups.popitem(last=False)
        else:
            self.groups.move_to_end(g)
        at = row - self.starts[g]
        v = [group.column(i)[at].as_py() for i in range(len(_RECORD_COLUMNS))]
        key = fields([*v[0:3], self.fingerprint, *v[3:5], str(v[5]), *v[6:8]])
        if cache_key is not None and key != cache_key:
            return None
        return with_checksum(record_body(key, v[8], v[9], v[10], v[11], v[12], v[5], v[13]), v[14])


class ArchiveStore:
    """A read-only fleet tier over archive directories (each one archive folder or a folder of them).

    Folders are discovered and their manifests checked at construction (ArchiveError for a missing directory; a
    folder whose manifest is unusable is logged as a warning and skipped: its lookups are misses). An archive is
    loaded on the first lookup of its fingerprint (or by :meth:`load`): its decisions.parquet is read once,
    checked against the manifest's byte count and sha256, and only its ``key_hash`` column is indexed; a hit decodes one row group (kept in a small LRU of ``row_groups`` groups per
    archive), rebuilds that one record from its columns and verifies it (its checksum, its key against the
    requested one). Memory is bounded by the
    compressed file, the index and the decoded groups. An archive that fails to load is logged once and every
    lookup that needed it raises CorruptRecord (the controller counts a cache warning and treats it as a miss).
    When several archives hold the key, the replacement rule picks the record (``farm.stores.base.replaces``).

    Only archives ``trust`` accepts are served (default ``Trust.from_env()``: ``FARM_TRUSTED_KEYS``): an
    unsigned archive (unless unsigned ones are allowed, for development), a bad signature or a key not trusted is
    checked on the manifest's bytes at construction, logged as a warning and skipped (its lookups are misses).

    ``put`` raises TuneFailure UNAVAILABLE (archives are written by ``farm archive``, never by the runtime);
    ``delete`` is a no-op (the controller never deletes from the fleet tier; it forgets in memory).
    """

    def __init__(self, *directories: Path | str, row_groups: int = 4, trust: Trust | None = None) -> None:
        self.directories = tuple(Path(d) for d in directories)
        self.row_groups = row_groups
        self.trust = Trust.from_env() if trust is None else trust
        self._manifests: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
        for directory in self.directories:
            for folder in archive_folders(directory):
                try:
                    manifest = read_manifest(folder, self.trust)
                except ArchiveError as e:
                    log.warning("archive %s is unusable and skipped: %s", folder, e)
                    continue
                if manifest.signer is None:
                    log.warning(UNSIGNED_WARNING.format(folder=folder))
                self._manifests.setdefault(manifest["digest"], []).append((folder, manifest))
        self._loaded: dict[str, list[_Loaded]] = {}
        self._broken: dict[str, str] = {}
        self._lock = threading.Lock()
        self.lookups = 0

    @property
    def digests(self) -> tuple[str, ...]:
        return tuple(sorted(self._manifests))

    def load(self) -> int:
        """Load every archive now (instead of on first lookup); return the number of decisions indexed."""
        for digest in self._manifests:
            self._archives(digest)
        return len(self)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(a.rows) for loaded in self._loaded.values() for a in loaded)

    def _archives(self, digest: str) -> list[_Loaded]:
        loaded = self._loaded.get(digest)
        if loaded is not None:
            return loaded
        with self._lock:
            loaded = self._loaded.get(digest)
            if loaded is None:
                loaded = []
                for folder, manifest in self._manifests.get(digest, []):
                    try:
                        loaded.append(_Loaded(folder, manifest, self.row_groups))
                    except ArchiveError as e:
                        log.warning("archive %s is unusable: %s", folder, e)
                        self._broken[digest] = str(e)
                self._loaded[digest] = loaded
            return loaded

    def get(self, cache_key: str) -> DecisionRecord | None:
        """The record for ``cache_key`` (its environment read from the key; an unreadable key is a miss), as
        :meth:`get_in`."""
        try:
            environment = key_environment(cache_key)
        except ValueError:  # UnicodeDecodeError included
            return None
        return self.get_in(environment, cache_key)

    def get_in(self, environment: str, cache_key: str) -> DecisionRecord | None:
        """The record for ``cache_key``, whose environment (fingerprint) is ``environment``; None on a miss;
        CorruptRecord for a bad record or unusable archive."""
        self.lookups += 1
        digest = fingerprint_digest(environment)
        if digest not in self._manifests:
            return None
        archives = self._archives(digest)
        best: DecisionRecord | None = None
        problem: str | None = self._broken.get(digest)
        for archive in archives:
            row = archive.row(cache_key)
            if row is None:
                continue
            try:
                with self._lock:
                    text = archive.text(row, cache_key)
                if text is None:
                    continue
                record = DecisionRecord.from_json(text, expected_key=cache_key)
            except CorruptRecord as e:
                problem = f"{archive.path}: row {row}: {e}"
                continue
            except Exception as e:  # an unreadable row group
                problem = f"{archive.path}: row {row}: {e}"
                continue
            if replaces(record, best):
                best = record
        if best is None and problem is not None:
            raise CorruptRecord(problem)
        return best

    def nearest(self, query: NearestQuery, max_distance: float) -> list[NearestHit]:
        """The archived decisions of the query's family within ``max_distance``, nearest first (farm.nearest). Each
        archive's family index is built on its first nearest lookup (farm.stores.archive.families: one pass over its
        key columns); unreadable rows are left out."""
        digest = fingerprint_digest(query.environment)
        if digest not in self._manifests:
            return []
        hits = []
        for archive in self._archives(digest):
            with self._lock:
                if archive.families is None:
                    archive.families = family_index(archive.pf, archive.fingerprint)
                near = archive.families.near(query, max_distance)[:NEAR_ROWS]
            for _, row in near:
                try:
                    with self._lock:
                        text = archive.text(row, None)
                    if text is not None:
                        hits.append(hit(DecisionRecord.from_json(text), query, max_distance))
                except Exception as e:  # a corrupt record or an unreadable row group: not an answer
                    log.warning("%s: row %d: unreadable for a nearest lookup: %s", archive.path, row, e)
        return nearest_first(hits)

    def priors(self, family: str, exclude: str, limit: int) -> list[tuple[str, DecisionRecord]]:
        """(fingerprint digest, record) of up to ``limit`` archived fingerprints other than ``exclude`` holding a
        decision of ``family`` (a problem family's id across fingerprints, its meta's ``fleet_family``), in digest
        order; where one fingerprint's archives hold several, the replacement rule picks. Each archive's priors
        index is built on its first priors lookup (farm.stores.archive.priors: one pass over its meta column);
        unreadable rows are left out."""
        found: list[tuple[str, DecisionRecord]] = []
        for digest in self.digests:
            if len(found) >= limit:
                break
            if digest == exclude:
                continue
            best: DecisionRecord | None = None
            for archive in self._archives(digest):
                try:
                    with self._lock:
                        if archive.priors is None:
                            archive.priors = priors_index(archive.pf)
                        texts = [archive.text(row, None) for row in archive.priors.get(family, ())]
                    records = [DecisionRecord.from_json(text) for text in texts if text is not None]
                except Exception as e:  # a corrupt record or an unreadable row group: not an answer
                    log.warning("%s: unreadable for a priors lookup: %s", archive.path, e)
                    continue
                for record in records:
                    if record.meta.get(FLEET_FAMILY) == family and replaces(record, best):
                        best = record
            if best is not None:
                found.append((digest, best))
        return found

    def put(self, record: DecisionRecord) -> None:
        raise TuneFailure.unavailable("an ArchiveStore is read-only: write archives with `farm archive`")

    def delete(self, cache_key: str) -> None:
        return None

