"""The runtime's read-only fleet tier over archive directories (``StackTuner(policy, fleet=[path])``)."""

from __future__ import annotations

import bisect
import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from farm.encoding import fields
from farm.environment import fingerprint_digest
from farm.errors import ArchiveError, CorruptRecord, TuneFailure
from farm.identity import key_environment
from farm.nearest import FamilyIndex, NearestHit, NearestQuery, family_of, hit, nearest_first
from farm.stores.archive.files import parquet_file, verified_bytes
from farm.stores.archive.manifest import archive_folders, read_manifest
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

NEAR_ROWS = 4  # rows a nearest lookup decodes: a nearer one may be stale, unverified or banned
FLEET_FAMILY = "fleet_family"  # the meta member naming a decision's problem family across fingerprints
_FLEET_FAMILY = r'"fleet_family":"(?P<family>[0-9a-f]{1,64})"'  # as canonical JSON spells it in meta_json
# The key's columns, in the order _Loaded.key takes them; then all that a hit decodes to rebuild a record.
_KEY_COLUMNS = ("key_version", "scope", "operation_key", "workload", "execution_context", "reference_index",
                "manifest", "accuracy_key")
_RECORD_COLUMNS = (*_KEY_COLUMNS, "created", "winner_index", "meta_json", "winner", "ratio", "verified",
                   "checksum")


class _Loaded:
    """One archive's decisions for lookups: the verified file, its ``key_hash`` -> row index, an LRU of decoded
    row groups, and nearest (docs/nearest.md) and priors (docs/spaces.md) indexes built on first use."""

    def __init__(self, folder: Path, manifest: dict[str, Any], row_groups: int, lock: threading.Lock) -> None:
        import pyarrow as pa

        self.path = path = folder / DECISIONS_FILE
        data = verified_bytes(folder, DECISIONS_FILE, manifest)
        self.fingerprint = manifest["fingerprint"]
        self.pf = parquet_file(path, data, DECISION_COLUMNS, manifest["digest"],
                               manifest["rows"]["decisions"], manifest["schema_version"])
        self.starts: list[int] = []
        self.rows: dict[Any, int] = {}
        for g in range(self.pf.num_row_groups):
            at = len(self.rows)  # every row before this group has its own hash
            self.starts.append(at)
            try:
                keys = self.pf.read_row_group(g, columns=["key_hash"]).column(0)
            except (pa.ArrowException, OSError, ValueError) as e:
                raise ArchiveError(f"{path}: not a readable Parquet file: {e}") from None
            if keys.null_count:
                raise ArchiveError(f"{path}: column 'key_hash' holds nulls")
            for i, value in enumerate(keys.to_pylist(), at):
                if self.rows.setdefault(value, i) != i:
                    raise ArchiveError(f"{path}: row {i} (key hash {value & (2**64 - 1):016x}): duplicate "
                                       f"key: refused")
        self.groups: OrderedDict[int, Any] = OrderedDict()
        self.max_groups, self.lock = row_groups, lock  # the store's lock guards the groups and both indexes

    def row(self, cache_key: str) -> int | None:
        return self.rows.get(key_hash64(key_digest(cache_key)))

    def text(self, row: int) -> tuple[str, str]:
        """(cache key, record text) of ``row``, rebuilt from its columns."""
        with self.lock:
            g = bisect.bisect_right(self.starts, row) - 1
            group = self.groups.pop(g, None)
            if group is None:
                group = self.pf.read_row_group(g, columns=list(_RECORD_COLUMNS))
            self.groups[g] = group  # the most recently used, last
            if len(self.groups) > self.max_groups:
                self.groups.popitem(last=False)
            v = [column[row - self.starts[g]].as_py() for column in group.columns]
        key = self.key(v)
        return key, with_checksum(record_body(key, v[8], v[9], v[10], v[11], v[12], v[5], v[13]), v[14])

    def key(self, v: Sequence[Any]) -> str:
        """The cache key of a row from its ``_KEY_COLUMNS`` values (docs/archives.md, "decisions.parquet")."""
        return fields([*v[0:3], self.fingerprint, *v[3:5], str(v[5]), *v[6:8]])

    @functools.cached_property
    def families(self) -> FamilyIndex:
        """Family digest -> rows: one pass over the key's columns, a row group at a time."""
        index = FamilyIndex()
        for g, start in enumerate(self.starts):
            group = self.pf.read_row_group(g, columns=list(_KEY_COLUMNS))
            for row, values in enumerate(zip(*(c.to_pylist() for c in group.columns), strict=True), start):
                found = family_of(self.key(values))
                if found is not None:
                    index.add(found.digest, found.dims, row)
        return index

    @functools.cached_property
    def priors(self) -> dict[str, list[int]]:
        """Problem family id across fingerprints -> the rows whose meta names it, found a row group at a time
        by Arrow's regex kernel (the caller checks each record's meta)."""
        import pyarrow.compute as pc

        index: dict[str, list[int]] = {}
        for g, start in enumerate(self.starts):
            values = self.pf.read_row_group(g, columns=["meta_json"]).column(0)
            found = pc.struct_field(pc.extract_regex(values, _FLEET_FAMILY), [0]).to_pylist()
            for row, family in enumerate(found, start):
                if family:
                    index.setdefault(family, []).append(row)
        return index


class ArchiveStore:
    """A read-only fleet tier over archive directories, each one archive folder or a folder of them
    (docs/archives.md, "The runtime's archive tier"). ``trust``: whose signatures are accepted (default
    ``Trust.from_env()``); ``row_groups``: decoded row groups kept per archive."""

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
        if digest not in self._loaded:
            with self._lock:
                if digest not in self._loaded:
                    loaded = []
                    for folder, manifest in self._manifests.get(digest, []):
                        try:
                            loaded.append(_Loaded(folder, manifest, self.row_groups, self._lock))
                        except ArchiveError as e:
                            log.warning("archive %s is unusable: %s", folder, e)
                            self._broken[digest] = str(e)
                    self._loaded[digest] = loaded
        return self._loaded[digest]

    def get(self, cache_key: str) -> DecisionRecord | None:
        """As :meth:`get_in`, the environment read from ``cache_key`` (an unreadable key is a miss)."""
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
        archives = self._archives(digest)  # first: a failed load notes the problem
        best: DecisionRecord | None = None
        problem: str | None = self._broken.get(digest)
        for archive in archives:
            row = archive.row(cache_key)
            if row is None:
                continue
            try:
                key, text = archive.text(row)
                if key == cache_key:  # else another key whose sha256 begins with the same 64 bits
                    record = DecisionRecord.from_json(text, expected_key=cache_key)
                    best = record if replaces(record, best) else best
            except Exception as e:  # CorruptRecord, or an unreadable row group
                problem = f"{archive.path}: row {row}: {e}"
        if best is None and problem is not None:
            raise CorruptRecord(problem)
        return best

    def nearest(self, query: NearestQuery, max_distance: float) -> list[NearestHit]:
        """The archived decisions of the query's family within ``max_distance``, nearest first (farm.nearest);
        unreadable rows are left out."""
        digest = fingerprint_digest(query.environment)
        if digest not in self._manifests:
            return []
        hits = []
        for archive in self._archives(digest):
            with self._lock:
                near = archive.families.near(query, max_distance)[:NEAR_ROWS]
            for _, row in near:
                try:
                    hits.append(hit(DecisionRecord.from_json(archive.text(row)[1]), query, max_distance))
                except Exception as e:  # a corrupt record or an unreadable row group: not an answer
                    log.warning("%s: row %d: unreadable for a nearest lookup: %s", archive.path, row, e)
        return nearest_first(hits)

    def priors(self, family: str, exclude: str, limit: int) -> list[tuple[str, DecisionRecord]]:
        """(digest, record) of up to ``limit`` fingerprints but ``exclude`` with a decision of ``family``
        (meta ``fleet_family``), in digest order, the replacement rule picking; unreadable rows left out."""
        found: list[tuple[str, DecisionRecord]] = []
        for digest in [d for d in self.digests if d != exclude]:
            if len(found) >= limit:
                break
            best: DecisionRecord | None = None
            for archive in self._archives(digest):
                try:
                    with self._lock:
                        rows = archive.priors.get(family, [])
                    records = [DecisionRecord.from_json(archive.text(row)[1]) for row in rows]
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

