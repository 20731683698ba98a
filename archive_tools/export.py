"""``farm archive export``: the decisions of Redis or a local cache, one archive per fingerprint.

Each fingerprint is read as one consistent snapshot (Redis: one MULTI/EXEC; the local cache: batches of its write
order) and written by ``farm_archives.writer.write_archive``, signed by the farm's key when one is given (``signer``);
unreadable stored decisions are skipped and reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.environment import fingerprint_digest
from farm.errors import CorruptRecord
from farm.identity import key_environment
from farm.stores.archive.schema import ArchiveEntry, ArchiveError, record_text
from farm.stores.base import DecisionRecord, key_sha256
from farm.stores.local import STORE_FILE, LocalStore
from farm.stores.redis import RedisDecisions
from farm_archives.signing import SigningKey
from farm_archives.writer import WrittenArchive, write_archive


def signers_key(decisions: RedisDecisions, fingerprint_digest: str) -> str:
    """Hash per fingerprint: sha256(cache key) -> "<key id> <record checksum>", the signer of the archive the
    decision was imported from, valid while the stored record still has that checksum (a later publication of the
    key, by the farm or an unsigned import, leaves it stale, and it is ignored)."""
    return decisions.settings.key("signers", fingerprint_digest)


def record_checksum(text: str) -> str:
    """The checksum of a record text (``DecisionRecord.to_json`` writes it last: ``..."checksum":"<hex>"}``)."""
    return text[-66:-2]


def select_fingerprints(available: dict[str, str], wanted: str | None, where: str) -> dict[str, str]:
    """The digest -> text entries matching ``wanted`` (a digest, a digest prefix or the full text; None: all)."""
    if wanted is None:
        return dict(sorted(available.items()))
    found = {d: t for d, t in available.items() if d == wanted or t == wanted}
    if not found:
        found = {d: t for d, t in available.items() if d.startswith(wanted)}
    if not found:
        raise ArchiveError(f"--fingerprint {wanted!r}: no such fingerprint in {where}")
    if len(found) > 1:
        raise ArchiveError(f"--fingerprint {wanted!r} is ambiguous in {where}: {', '.join(sorted(found))}")
    return found


@dataclass
class ExportResult:
    """One archive written by an export; ``skipped`` says which stored decisions could not be archived, and why."""

    fingerprint: str
    written: WrittenArchive
    skipped: list[str] = field(default_factory=list)
    provenance: dict[str, int] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return fingerprint_digest(self.fingerprint)


def _problem_id(record: DecisionRecord, indexed: dict[str, list[str]], field_name: str) -> str | None:
    """The problem id the store's problem index maps to this decision (None when it maps none)."""
    pids = indexed.get(field_name)
    if not pids:
        return None
    meta_pid = record.meta.get("problem_id")
    return meta_pid if meta_pid in pids else sorted(pids)[0]


def _trial_list(raw: Any, sha: str, skipped: list[str]) -> list[dict[str, Any]]:
    if not raw:
        return []
    try:
        rows = json.loads(raw)
    except ValueError:
        rows = None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        skipped.append(f"{sha[:12]}: its trial rows are unreadable (exported without them)")
        return []
    return rows


def export_redis(decisions: RedisDecisions, out: Path | str, fingerprint: str | None = None, *,
                 signer: SigningKey | None = None) -> list[ExportResult]:
    """Write ``out/<digest>/`` for every fingerprint in Redis (or the one ``fingerprint`` names).

    Each fingerprint's decisions, trial rows and problem index are read in one MULTI/EXEC (a consistent snapshot:
    a decision and its trial rows always belong together). Unreadable records are skipped and reported."""
    s = decisions.settings
    results = []
    for digest, text in select_fingerprints(decisions.fingerprints(), fingerprint, "Redis").items():
        pipe = decisions.client.pipeline(transaction=True)
        pipe.hgetall(s.decisions_key(digest))
        pipe.hgetall(s.trials_key(digest))
        pipe.hgetall(s.problems_key(digest))
        pipe.hgetall(signers_key(decisions, digest))
        raw_decisions, raw_trials, problems, signed = pipe.execute()
        provenance: dict[str, int] = {}
        indexed: dict[str, list[str]] = {}
        for pid, field_name in problems.items():
            indexed.setdefault(field_name, []).append(pid)
        skipped: list[str] = []
        entries = []
        for field_name, raw in raw_decisions.items():
            try:
                record = DecisionRecord.from_json(raw)
            except CorruptRecord as e:
                skipped.append(f"{field_name[:12]}: unreadable record: {e}")
                continue
            if key_sha256(record.cache_key) != field_name:
                skipped.append(f"{field_name[:12]}: the record's key is not the one its field names")
                continue
            trials = _trial_list(raw_trials.get(field_name), field_name, skipped)
            entries.append(ArchiveEntry(record, _problem_id(record, indexed, field_name), tuple(trials),
                                        record_text(raw)))
            key_id, _, checksum = str(signed.get(field_name, "")).partition(" ")
            if key_id and checksum == record_checksum(raw):
                provenance[key_id] = provenance.get(key_id, 0) + 1
        written = write_archive(out, text, entries, skipped=skipped, signer=signer, provenance=provenance)
        results.append(ExportResult(text, written, skipped, provenance))
    return results


def export_cache(directory: Path | str, out: Path | str, fingerprint: str | None = None, *,
                 signer: SigningKey | None = None) -> list[ExportResult]:
    """Write ``out/<digest>/`` for every fingerprint of a local cache (``farm.stores.local``: the embedded farm's
    ``--cache-dir`` or a runtime's ``cache_directory``), with the trial rows and problem ids stored beside them."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ArchiveError(f"{directory}: no such cache directory")
    store = LocalStore(directory)
    if not (directory / STORE_FILE).exists() and not any(directory.glob("*.json")):
        raise ArchiveError(f"{directory}: holds no local cache ({STORE_FILE})")
    by_digest: dict[str, tuple[str, list[ArchiveEntry], list[str]]] = {}
    loose: list[str] = []
    try:
        for batch in store.scan():
            for text, pid, trials_text in batch:
                try:
                    record = DecisionRecord.from_json(text)
                    environment = key_environment(record.cache_key)
                except (CorruptRecord, ValueError, IndexError) as e:
                    loose.append(f"unreadable record: {e}")
                    continue
                sha = key_sha256(record.cache_key)
                _, entries, skipped = by_digest.setdefault(fingerprint_digest(environment), (environment, [], []))
                trials = _trial_list(trials_text, sha, skipped)
                entries.append(ArchiveEntry(record, pid, tuple(trials), record_text(text)))
    except CorruptRecord as e:
        raise ArchiveError(str(e)) from None
    finally:
        store.close()
    selected = select_fingerprints({d: t for d, (t, _, _) in by_digest.items()}, fingerprint, str(directory))
    results = []
    for digest, text in selected.items():
        _, entries, skipped = by_digest[digest]
        skipped += loose
        results.append(ExportResult(text, write_archive(out, text, entries, skipped=skipped, signer=signer), skipped))
        loose = []
    return results
