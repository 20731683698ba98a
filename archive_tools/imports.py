"""``farm archive import``: verified archives into Redis or a local cache, under the replacement rule.

Every archive's signature is checked against the trusted keys (``farm.stores.archive.Trust``), then every archive
is read and verified completely (``farm_archives.reader.read_archive``) and the fingerprint rule
applied before anything is written: a bad archive imports nothing. The verified decisions are published column by
column (``PublicationBatch``, no record objects), one batch per archive, through each store's one publication, as
the farm publishes: into Redis by ``RedisDecisions.publish_batch`` (``farm_publish``, a thousand decisions per
MULTI/EXEC; a server failure mid-import leaves whole transactions applied, and re-running the import completes it,
every publication being idempotent under the replacement rule); into a local cache by
``LocalStore.publish_batches``, ONE SQLite transaction for everything (all or nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from farm.environment import FINGERPRINT_PARTS, fingerprint_differences, fingerprint_digest
from farm.stores.archive.manifest import archive_folders
from farm.stores.archive.schema import ArchiveError, rekey
from farm.stores.archive.signing import Trust
from farm.stores.base import PublicationBatch
from farm.stores.local import FARM, LocalStore
from farm.stores.redis import RedisDecisions
from farm_archives.derived import decision_row
from farm_archives.export import record_checksum, select_fingerprints, signers_key
from farm_archives.reader import Archive, read_archive
from farm_archives.rows import ArchiveRows


@dataclass
class ImportResult:
    """What one archive's import did. ``forced``: its fingerprint differed from the target's and ``--force``
    re-keyed its decisions to the target; ``differences``: then, the fields that differ, as the archive and as the
    target have them (``named_differences``)."""

    source: Path
    digest: str
    target_digest: str
    forced: bool
    decisions: int
    new: int = 0
    replaced: int = 0
    kept: int = 0
    notes: list[str] = field(default_factory=list)
    differences: tuple[str, str] | None = None


def load_archives(path: Path | str, trust: Trust | None = None) -> list[Archive]:
    """Every archive at ``path`` (one archive folder, or a folder of them), each read and verified completely, its
    signature first: only archives ``trust`` accepts (default ``Trust.from_env()``: signed by a key of
    ``FARM_TRUSTED_KEYS``) are loaded, and any other refuses them all."""
    trust = Trust.from_env() if trust is None else trust
    return [read_archive(folder, trust=trust) for folder in archive_folders(path)]


REGIME_FIELDS = ("cpus", "blas", "openmp")  # a host fingerprint's execution regime (farm.runtimes.host.HostRegime)


def mismatch_message(archive: Archive, target: str, into: Path | None) -> str:
    """Why ``archive`` is not imported under ``target`` (a fingerprint): the fields that differ, each as the archive
    has it and as the target has it (``cpus=1`` there, ``cpus=2`` here), and the fix: into a cache (``into``: this
    machine's fingerprint) run the import in the archive's regime, or tune in this one; into Redis (a ``--fingerprint``
    target) import under the archive's own fingerprint. ``--force`` is named last, with what it does."""
    differs = fingerprint_differences(archive.fingerprint, target)
    mine = "this machine's runtime fingerprint" if into is not None else "the target fingerprint"
    named = named_differences(archive.fingerprint, target)
    if named is not None:
        said = (f"the archive's decisions were measured with {named[0]} (fingerprint {archive.digest}), {mine} has "
                f"{named[1]} ({fingerprint_digest(target)})")
    else:
        said = f"the archive's fingerprint is {archive.digest}, {mine} is {fingerprint_digest(target)}"
    regime = bool(differs) and all(name in REGIME_FIELDS for name, _, _ in differs)
    cpus = next((int(a) for name, a, _ in differs if name == "cpus" and a.isdigit() and int(a) > 0), None)
    taskset = "" if cpus is None else "taskset -c 0 " if cpus == 1 else f"taskset -c 0-{cpus - 1} "
    if into is not None and regime:
        fix = (f"a decision holds only in the regime it was measured in: run the import in the archive's regime "
               f"(`{taskset}farm archive import {archive.path} --into-cache {into}`), as the application that reads "
               f"the cache must run, or tune in this regime (`farm tune CATALOG --cache-dir {into}`)")
    elif into is not None:
        fix = ("its decisions were measured on another device class, driver or build: tune on this machine "
               f"(`farm tune CATALOG --cache-dir {into}`)")
    else:
        fix = ("import it under its own fingerprint (leave out --fingerprint)"
               + (f" and run the applications in its regime (`{taskset}python app.py`)" if regime else "")
               + ", or tune for the target (`farm tune` with workers of that fingerprint)")
    return (f"{archive.path}: fingerprint mismatch: {said}; nothing imported. Fix: {fix}. --force (for the rare "
            f"case where the measurements are known to hold under both) files them under {mine} anyway, re-keying "
            f"every decision to it")


def named_differences(archived: str, target: str) -> tuple[str, str] | None:
    """The fields in which fingerprint ``archived`` differs from ``target``, as each has them (``cpus=1, blas=1
    (openblas Haswell), openmp=1``); None when they are the same or either is not a fingerprint."""
    differs = fingerprint_differences(archived, target)
    if not differs or differs[0][0] == "fingerprint":
        return None
    return (", ".join(_field(name, a) for name, a, _ in differs), ", ".join(_field(name, b) for name, _, b in differs))


def _field(name: str, value: str) -> str:
    """One differing field as the message shows it: a runtime option ``cpus=1``, another part ``build 0.1.0+ab``."""
    if name == "fingerprint":
        return name
    shown = value if len(value) <= 80 else value[:77] + "..."
    return f"{name}={shown}" if name not in FINGERPRINT_PARTS else f"{name} {shown!r}" if shown else f"no {name}"


def _plan(archives: Sequence[Archive], target: Callable[[Archive], str], force: bool,
          into: Path | None) -> list[tuple[Archive, str, PublicationBatch]]:
    plans = []
    for archive in archives:
        fingerprint = target(archive)
        rows = archive.rows
        if fingerprint != archive.fingerprint:
            if not force:
                raise ArchiveError(mismatch_message(archive, fingerprint, into))
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

    plans = _plan(archives, _redis_target(decisions, fingerprint), force, None)
    total = sum(len(batch) for _, _, batch in plans)
    applied = 0
    results = []
    for archive, target, batch in plans:
        result = ImportResult(archive.path, archive.digest, fingerprint_digest(target),
                              target != archive.fingerprint, len(batch),
                              differences=named_differences(archive.fingerprint, target))
        try:
            replies = decisions.publish_batch(batch)
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
    directory = Path(directory)
    plans = _plan(archives, lambda _: fingerprint, force, directory)
    if directory.exists() and not directory.is_dir():
        raise ArchiveError(f"{directory}: not a directory; nothing imported")
    store = LocalStore(directory, owner=FARM)
    try:
        replies = store.publish_batches(batch for _, _, batch in plans)
    finally:
        store.close()
    return [_count(ImportResult(archive.path, archive.digest, fingerprint_digest(target),
                                target != archive.fingerprint, len(batch),
                                differences=named_differences(archive.fingerprint, target)), found)
            for (archive, target, batch), found in zip(plans, replies, strict=True)]
