"""``farm archive import``: verified archives into Redis or a local cache, under the replacement rule.

Every archive is read and verified completely (``farm.stores.archive.read_archive``) and the fingerprint rule
applied before anything is written: a bad archive imports nothing. Writing goes through the stores' one
publication function with the same arguments the coordinator's sinks use: into Redis, ``farm_publish`` calls
pipelined ``BATCH`` at a time, one MULTI/EXEC transaction per batch (each call is idempotent under the replacement
rule: a server failure mid-import leaves whole batches applied, and re-running the import completes it); into a
local cache, ONE SQLite transaction for everything (all or nothing).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from farm.environment import fingerprint_digest
from farm.stores.archive import (
    Archive,
    ArchiveEntry,
    ArchiveError,
    archive_folders,
    decision_row,
    read_archive,
    rekey,
)
from farm.stores.base import Publication
from farm.stores.local import FARM, LocalStore
from farm.stores.redis import RedisDecisions
from farm_coordinator.archive_export import select_fingerprints

BATCH = 2000


@dataclass
class ImportResult:
    """What one archive's import did. ``forced``: its fingerprint differed from the target's and ``--force``
    re-keyed its decisions to the target."""

    source: Path
    digest: str
    target_digest: str
    forced: bool
    decisions: int
    new: int = 0
    replaced: int = 0
    kept: int = 0
    notes: list[str] = field(default_factory=list)


def load_archives(path: Path | str) -> list[Archive]:
    """Every archive at ``path`` (one archive folder, or a folder of them), each read and verified completely."""
    return [read_archive(folder) for folder in archive_folders(path)]


def _plan(archives: Sequence[Archive], target: Callable[[Archive], str], force: bool,
          target_name: str) -> list[tuple[Archive, str, list[ArchiveEntry]]]:
    plans = []
    for archive in archives:
        fingerprint = target(archive)
        entries = list(archive.entries.values())
        if fingerprint != archive.fingerprint:
            if not force:
                raise ArchiveError(
                    f"{archive.path}: fingerprint mismatch: the archive's fingerprint is {archive.digest}, "
                    f"{target_name} is {fingerprint_digest(fingerprint)}; nothing imported "
                    f"(--force re-keys the decisions to the target's fingerprint)")
            entries = [rekey(e, fingerprint) for e in entries]
            for e in entries:
                decision_row(e.record, e.problem_id)  # the re-keyed records stay valid archive rows
        plans.append((archive, fingerprint, entries))
    return plans


def _redis_target(decisions: RedisDecisions, wanted: str | None) -> Callable[[Archive], str]:
    """The target fingerprint for each archive: its own without ``wanted``; else the text ``wanted`` gives, or
    names (a digest or prefix of a fingerprint known to Redis, or the archive's own digest)."""
    known: dict[str, str] | None = None

    def target(archive: Archive) -> str:
        nonlocal known
        if wanted is None or wanted in (archive.fingerprint, archive.digest):
            return archive.fingerprint
        if not (len(wanted) <= 16 and all(c in "0123456789abcdef" for c in wanted)):
            return wanted  # the full fingerprint text
        if archive.digest.startswith(wanted):
            return archive.fingerprint
        if known is None:
            known = decisions.fingerprints()
        selected: dict[str, str] = select_fingerprints(known, wanted, "Redis")
        return next(iter(selected.values()))

    return target


def _publications(target: str, entries: list[ArchiveEntry]) -> Iterator[Publication]:
    for e in entries:
        yield Publication(e.record, target, e.problem_id or "", e.trials, e.text)


def _count(result: ImportResult, replies: list[tuple[bool, str]]) -> ImportResult:
    for replaced, reason in replies:
        if not replaced:
            result.kept += 1
        elif reason == "new":
            result.new += 1
        else:
            result.replaced += 1
    return result


def import_redis(archives: Sequence[Archive], decisions: RedisDecisions, fingerprint: str | None = None,
                 force: bool = False) -> list[ImportResult]:
    """Publish every decision of ``archives`` (already verified) through ``farm_publish``, in batches."""
    import redis

    plans = _plan(archives, _redis_target(decisions, fingerprint), force, "the target fingerprint")
    total = sum(len(entries) for _, _, entries in plans)
    applied = 0
    results = []
    for archive, target, entries in plans:
        result = ImportResult(archive.path, archive.digest, fingerprint_digest(target),
                              target != archive.fingerprint, len(entries))
        pending = _publications(target, entries)
        while chunk := list(itertools.islice(pending, BATCH)):
            try:
                replies = decisions.publish_many(chunk, batch=BATCH)
            except redis.ResponseError as e:
                what = "nothing was imported" if not applied else f"{applied} of {total} publications were applied"
                raise ArchiveError(f"Redis refused the import ({what}): {e}") from None
            applied += len(chunk)
            _count(result, replies)
        results.append(result)
    return results


def import_cache(archives: Sequence[Archive], directory: Path | str, fingerprint: str,
                 force: bool = False) -> list[ImportResult]:
    """Publish ``archives`` (already verified) into the local cache of ``directory`` as the farm (the embedded
    farm's sink does the same), in one transaction. ``fingerprint``: the local runtime's. An existing directory
    keeps its mode; a new one follows the umask."""
    plans = _plan(archives, lambda _: fingerprint, force, "this machine's runtime fingerprint")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ArchiveError(f"{directory}: not a directory; nothing imported")
    store = LocalStore(directory, owner=FARM)
    try:
        replies = store.publish_many(pub for _, target, entries in plans for pub in _publications(target, entries))
    finally:
        store.close()
    results = []
    at = 0
    for archive, target, entries in plans:
        result = ImportResult(archive.path, archive.digest, fingerprint_digest(target),
                              target != archive.fingerprint, len(entries))
        results.append(_count(result, replies[at : at + len(entries)]))
        at += len(entries)
    return results
