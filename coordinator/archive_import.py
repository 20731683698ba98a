"""``farm archive import``: verified archives into Redis or a local cache, under the replacement rule.

Every archive's signature is checked against the trusted keys (``farm.stores.archive.Trust``), then every archive
is read and verified completely (``farm.stores.archive.read_archive``) and the fingerprint rule
applied before anything is written: a bad archive imports nothing. The verified decisions are published column by
column (``PublicationBatch``, no record objects), one batch per archive, under the stores' replacement rule: into
Redis by ``farm.stores.redis_batch.publish_batch`` (a thousand decisions per MULTI/EXEC, judged
by publish.lua's rule; a server failure mid-import leaves whole transactions applied, and re-running the import
completes it, every publication being idempotent under the rule); into a local cache by
``LocalStore.publish_batches``, ONE SQLite transaction for everything (all or nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from farm.environment import fingerprint_digest
from farm.stores.archive import (
    Archive,
    ArchiveError,
    ArchiveRows,
    Trust,
    archive_folders,
    decision_row,
    read_archive,
    rekey,
)
from farm.stores.base import PublicationBatch
from farm.stores.local import FARM, LocalStore
from farm.stores.redis import RedisDecisions
from farm.stores.redis_batch import publish_batch
from farm_coordinator.archive_export import record_checksum, select_fingerprints, signers_key


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


def load_archives(path: Path | str, trust: Trust | None = None) -> list[Archive]:
    """Every archive at ``path`` (one archive folder, or a folder of them), each read and verified completely, its
    signature first: only archives ``trust`` accepts (default ``Trust.from_env()``: signed by a key of
    ``FARM_TRUSTED_KEYS``) are loaded, and any other refuses them all."""
    trust = Trust.from_env() if trust is None else trust
    return [read_archive(folder, trust=trust) for folder in archive_folders(path)]


def _plan(archives: Sequence[Archive], target: Callable[[Archive], str], force: bool,
          target_name: str) -> list[tuple[Archive, str, PublicationBatch]]:
    plans = []
    for archive in archives:
        fingerprint = target(archive)
        rows = archive.rows
        if fingerprint != archive.fingerprint:
            if not force:
                raise ArchiveError(
                    f"{archive.path}: fingerprint mismatch: the archive's fingerprint is {archive.digest}, "
                    f"{target_name} is {fingerprint_digest(fingerprint)}; nothing imported "
                    f"(--force re-keys the decisions to the target's fingerprint)")
            rows = ArchiveRows()
            for entry, trials in zip(archive.entries.values(), archive.rows.trials, strict=True):
                e = rekey(entry, fingerprint)
                decision_row(e.record, e.problem_id)  # the re-keyed records stay valid archive rows
                rows.add(e.record, e.record.to_json(), e.problem_id, trials)
        plans.append((archive, fingerprint, rows.batch(fingerprint)))
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
    """Publish every decision of ``archives`` (already verified) under the replacement rule, a thousand per
    transaction."""
    import redis

    plans = _plan(archives, _redis_target(decisions, fingerprint), force, "the target fingerprint")
    total = sum(len(batch) for _, _, batch in plans)
    applied = 0
    results = []
    for archive, target, batch in plans:
        result = ImportResult(archive.path, archive.digest, fingerprint_digest(target),
                              target != archive.fingerprint, len(batch))
        try:
            replies = publish_batch(decisions, batch)
        except redis.ResponseError as e:
            what = "the archives before it: nothing" if not applied else f"{applied} of {total} publications"
            raise ArchiveError(f"Redis refused the import of archive {archive.digest} (applied: {what}, and its "
                               f"transactions before the refused one): {e}") from None
        applied += len(batch)
        _record_signer(decisions, archive, target, batch, replies)
        results.append(_count(result, replies))
    return results


def _record_signer(decisions: RedisDecisions, archive: Archive, target: str, batch: PublicationBatch,
                   replies: list[tuple[bool, str]]) -> None:
    """Note the archive's signer beside each decision it published (not those the stored record kept), with the
    published record's checksum, so that an export from Redis names where its decisions came from."""
    if archive.signer is None:
        return
    texts = batch.texts[0:len(batch)]  # one read of the column (a TextColumn reads a slice at once)
    signed = {digest.hex(): f"{archive.signer} {record_checksum(text)}"
              for digest, text, (replaced, _) in zip(batch.digests, texts, replies, strict=True) if replaced}
    key = signers_key(decisions, fingerprint_digest(target))
    items = list(signed.items())
    for at in range(0, len(items), 1000):
        decisions.client.hset(key, mapping=dict(items[at:at + 1000]))


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
        replies = store.publish_batches(batch for _, _, batch in plans)
    finally:
        store.close()
    return [_count(ImportResult(archive.path, archive.digest, fingerprint_digest(target),
                                target != archive.fingerprint, len(batch)), found)
            for (archive, target, batch), found in zip(plans, replies, strict=True)]
