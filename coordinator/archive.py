"""Archive operations behind ``farm archive``: export (from Redis or a local cache directory), import (into Redis or
a local cache directory), inspect, merge and diff. The format, the reader and the writer live in
``farm.stores.archive``; the schema is documented in docs/archives.md.

Imports are all-or-nothing: every archive is read and verified completely, and the fingerprint check applied,
before anything is written. Into Redis, every decision of every archive is then published in ONE MULTI/EXEC
transaction of ``farm_publish`` calls (the server-side replacement rule, problem index, fingerprint text and
update events, exactly as the coordinator publishes). Into a cache directory, a complete new directory is built
beside the old one (unchanged files hard-linked) and swapped in with one rename.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from farm.environment import fingerprint_digest
from farm.identity import CacheKey, key_environment
from farm.stores.archive import (
    Archive,
    ArchiveEntry,
    ArchiveError,
    WrittenArchive,
    archive_folders,
    decision_row,
    key_sha256,
    read_archive,
    record_text,
    rekey,
    swap_directory,
    write_archive,
)
from farm.stores.base import CorruptRecord, DecisionRecord, replaces
from farm.stores.disk import DiskStore
from farm.stores.redis import RedisDecisions

INDEX = "farm-index.json"  # farm_coordinator.sinks.DirectorySink's index and trials folder
TRIALS = "trials"
SINK_CAPACITY = 65536  # DirectorySink's DiskStore capacity: the runtime prunes a cache dir beyond its own


@dataclass
class ExportResult:
    """One archive written by an export; ``skipped`` says which stored decisions could not be archived, and why."""

    fingerprint: str
    written: WrittenArchive
    skipped: list[str] = field(default_factory=list)

    @property
    def digest(self) -> str:
        return fingerprint_digest(self.fingerprint)


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


def export_redis(decisions: RedisDecisions, out: Path | str, fingerprint: str | None = None) -> list[ExportResult]:
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
        raw_decisions, raw_trials, problems = pipe.execute()
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
        results.append(ExportResult(text, write_archive(out, text, entries, skipped=skipped), skipped))
    return results


def export_cache(directory: Path | str, out: Path | str, fingerprint: str | None = None) -> list[ExportResult]:
    """Write ``out/<digest>/`` for every fingerprint of a local cache directory (the embedded farm's
    DirectorySink or a runtime's ``cache_directory``), with the trial rows and problem index the sink kept."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ArchiveError(f"{directory}: no such cache directory")
    index = _load_index(directory)
    indexed: dict[str, list[str]] = {}
    for problems in index["problems"].values():
        for pid, field_name in problems.items():
            indexed.setdefault(field_name, []).append(pid)
    by_digest: dict[str, tuple[str, list[ArchiveEntry], list[str]]] = {}
    loose: list[str] = []
    for path in sorted(directory.glob("*.json")):
        if path.name == INDEX or path.name.startswith("."):
            continue
        try:
            raw = path.read_bytes()
            record = DecisionRecord.from_json(raw)
        except (OSError, CorruptRecord) as e:
            loose.append(f"{path.name}: unreadable record: {e}")
            continue
        sha = key_sha256(record.cache_key)
        if path.name != f"{sha}.json":
            loose.append(f"{path.name}: the record's key is not the one its file name names")
            continue
        try:
            text = key_environment(record.cache_key)
        except ValueError:
            loose.append(f"{path.name}: the record's key is not a cache key")
            continue
        digest = fingerprint_digest(text)
        _, entries, skipped = by_digest.setdefault(digest, (text, [], []))
        trials_path = directory / TRIALS / f"{sha}.json"
        trials = _trial_list(trials_path.read_bytes() if trials_path.is_file() else b"", sha, skipped)
        entries.append(ArchiveEntry(record, _problem_id(record, indexed, sha), tuple(trials), record_text(raw)))
    selected = select_fingerprints({d: t for d, (t, _, _) in by_digest.items()}, fingerprint, str(directory))
    results = []
    for digest, text in selected.items():
        _, entries, skipped = by_digest[digest]
        skipped += loose
        results.append(ExportResult(text, write_archive(out, text, entries, skipped=skipped), skipped))
        loose = []
    return results


# -- import -----------------------------------------------------------------------------------------------------


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
        return next(iter(select_fingerprints(known, wanted, "Redis").values()))

    return target


def import_redis(archives: Sequence[Archive], decisions: RedisDecisions, fingerprint: str | None = None,
                 force: bool = False) -> list[ImportResult]:
    """Publish every decision of ``archives`` (already verified) in one MULTI/EXEC of ``farm_publish`` calls."""
    plans = _plan(archives, _redis_target(decisions, fingerprint), force, "the target fingerprint")
    s = decisions.settings
    decisions.load_function()
    pipe = decisions.client.pipeline(transaction=True)
    for _, target, entries in plans:
        digest = fingerprint_digest(target)
        keys = [s.decisions_key(digest), s.problems_key(digest), s.fingerprints_key, s.events_key,
                s.trials_key(digest)]
        for e in entries:
            # The argument layout of RedisDecisions.publish (farm/stores/publish.lua).
            trials = json.dumps(list(e.trials), separators=(",", ":")) if e.trials else ""
            pipe.fcall("farm_publish", len(keys), *keys, key_sha256(e.record.cache_key), e.json,
                       e.problem_id or "", digest, target, str(s.events_maxlen), trials)
    replies = pipe.execute(raise_on_error=False) if len(pipe) else []
    errors = [r for r in replies if isinstance(r, Exception)]
    if errors:
        what = "nothing was imported" if len(errors) == len(replies) else (
            f"{len(replies) - len(errors)} of {len(replies)} publications were applied")
        raise ArchiveError(f"Redis refused the import ({what}): {errors[0]}")
    results = []
    at = 0
    for archive, target, entries in plans:
        result = ImportResult(archive.path, archive.digest, fingerprint_digest(target),
                              target != archive.fingerprint, len(entries))
        for replaced, reason in replies[at : at + len(entries)]:
            if not int(replaced):
                result.kept += 1
            elif str(reason) == "new":
                result.new += 1
            else:
                result.replaced += 1
        at += len(entries)
        results.append(result)
    return results


def _load_index(directory: Path) -> dict[str, Any]:
    """DirectorySink's index: {"schema": 1, "fingerprints": {digest: text}, "problems": {digest: {pid: field}}}."""
    try:
        data = json.loads((directory / INDEX).read_text())
        if isinstance(data, dict) and data.get("schema") == 1:
            data.setdefault("fingerprints", {})
            data.setdefault("problems", {})
            return data
    except (FileNotFoundError, ValueError):
        pass
    return {"schema": 1, "fingerprints": {}, "problems": {}}


def _link_tree(source: Path, target: Path) -> None:
    """Hard-link (or copy) every regular file of a cache directory into ``target``; hidden temp files skipped."""
    for path in source.rglob("*"):
        rel = path.relative_to(source)
        if any(part.startswith(".") for part in rel.parts):
            continue
        dest = target / rel
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, dest)
            except OSError:
                shutil.copy2(path, dest)


def _write_new(path: Path, data: bytes) -> None:
    """Write a file of the staging directory. The old name may be a hard link into the live directory: unlink
    first, never write through it."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with open(path, "xb") as f:
        f.write(data)


def import_cache(archives: Sequence[Archive], directory: Path | str, fingerprint: str,
                 force: bool = False) -> list[ImportResult]:
    """Publish ``archives`` (already verified) into a local cache directory with DirectorySink's semantics and
    format (record files the runtime's disk tier reads, trials/<sha256>.json, farm-index.json), replacing the
    directory atomically. ``fingerprint``: the local runtime's."""
    plans = _plan(archives, lambda _: fingerprint, force, "this machine's runtime fingerprint")
    directory = Path(directory)
    if directory.is_symlink():
        directory = directory.resolve()
    if directory.exists() and not directory.is_dir():
        raise ArchiveError(f"{directory}: not a directory; nothing imported")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.import-"))
    try:
        if directory.is_dir():
            _link_tree(directory, staging)
        (staging / TRIALS).mkdir(exist_ok=True)
        store = DiskStore(staging, capacity=SINK_CAPACITY)
        index = _load_index(staging)
        chosen: dict[str, ArchiveEntry] = {}  # what each touched key will hold, under the replacement rule
        results = []
        for archive, target, entries in plans:
            digest = fingerprint_digest(target)
            result = ImportResult(archive.path, archive.digest, digest, target != archive.fingerprint, len(entries))
            for e in entries:
                sha = key_sha256(e.record.cache_key)
                held = chosen.get(sha)
                if held is not None:
                    old: DecisionRecord | None = held.record
                else:
                    try:
                        old = store.get(e.record.cache_key)
                    except CorruptRecord:
                        old = None
                if not replaces(e.record, old):
                    result.kept += 1
                    continue
                chosen[sha] = e
                index["fingerprints"][digest] = target
                if e.problem_id:
                    index["problems"].setdefault(digest, {})[e.problem_id] = sha
                if old is None:
                    result.new += 1
                else:
                    result.replaced += 1
            results.append(result)
        writes = [(store.path(e.record.cache_key), e.json.encode()) for e in chosen.values()]
        writes += [(staging / TRIALS / f"{sha}.json", json.dumps(list(e.trials)).encode()) for sha, e in chosen.items()]
        writes.append((staging / INDEX, json.dumps(index, sort_keys=True, indent=1).encode()))
        for path, data in writes:  # (threads do not help: file creation is bound by the file system's journal)
            _write_new(path, data)
        count = sum(1 for p in staging.glob("*.json") if p.name != INDEX)
        if count > SINK_CAPACITY and results:
            results[-1].notes.append(
                f"the cache directory now holds {count} decisions: the runtime's disk tier prunes the oldest "
                f"beyond its policy capacity")
        os.sync()  # every file of the new directory is durable before it becomes visible
        swap_directory(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return results


# -- inspect, merge, diff ---------------------------------------------------------------------------------------


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def summary(archive: Archive, entry: ArchiveEntry) -> dict[str, Any]:
    """A decision as ``inspect --json`` shows it."""
    row = entry.row()
    return {
        "fingerprint": archive.digest, "key_sha256": row["key_sha256"], "operation": row["operation"],
        "device_kind": row["device_kind"], "spec": json.loads(row["spec_json"]) if row["spec_json"] else None,
        "workload": row["workload"], "winner": row["winner"], "winner_index": row["winner_index"],
        "reference": row["reference"], "ratio": row["ratio"], "relative_mad": row["relative_mad"],
        "verified": row["verified"], "samples": row["samples"], "confirmation": row["confirmation"],
        "created": row["created"], "run_id": row["run_id"], "problem_id": row["problem_id"],
        "trials": len(entry.trials),
    }


def inspect_rows(archives: Iterable[Archive], operation: str | None = None) -> list[dict[str, Any]]:
    rows = [summary(a, e) for a in archives for e in a.entries.values()]
    if operation is not None:
        rows = [r for r in rows if r["operation"] == operation]
    return sorted(rows, key=lambda r: (r["fingerprint"], r["operation"], json.dumps(r["spec"], sort_keys=True),
                                       r["workload"], r["created"]))


def inspect_table(archives: Sequence[Archive], rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    heads = "; ".join(f"{a.digest}: {len(a.entries)} decisions, {a.trial_rows} trial rows, schema "
                      f"{a.manifest['schema_version']}, farm {a.manifest.get('farm_version')}" for a in archives)
    table = Table(title=f"archive {heads}")
    for name in ("operation", "workload", "winner", "ratio", "verified", "samples", "confirmation", "created"):
        table.add_column(name, justify="right" if name in ("ratio", "samples") else "left")
    for r in rows:
        spec = ", ".join(f"{k}={v}" for k, v in r["spec"].items()) if isinstance(r["spec"], dict) else (
            r["workload"] if len(r["workload"]) <= 60 else r["workload"][:57] + "...")
        table.add_row(r["operation"], spec, r["winner"], f"{r['ratio']:.3f}", "yes" if r["verified"] else "no",
                      "" if r["samples"] is None else str(r["samples"]), r["confirmation"] or "", _iso(r["created"]))
    return table


def single_archive(path: Path | str) -> Archive:
    """The one archive at ``path`` (an archive folder, or a folder holding exactly one), verified."""
    folders = archive_folders(path)
    if len(folders) != 1:
        raise ArchiveError(f"{path}: holds {len(folders)} archives; name one fingerprint folder")
    return read_archive(folders[0])


@dataclass
class MergeResult:
    written: WrittenArchive
    inputs: int
    decisions_in: int
    replaced: int


def merge_archives(inputs: Sequence[Path | str], out: Path | str) -> MergeResult:
    """Merge archives of ONE fingerprint into ``out/<digest>/``: per key the replacement rule decides (a verified
    record beats an unverified one, otherwise the newer wins, ties to the later input); the kept record's trial
    rows and problem id follow it."""
    archives = [single_archive(p) for p in inputs]
    digests = sorted({a.digest for a in archives})
    if len(digests) > 1:
        raise ArchiveError(f"cannot merge archives of different fingerprints ({', '.join(digests)})")
    kept: dict[str, ArchiveEntry] = {}
    replaced = 0
    for archive in archives:
        for sha, entry in archive.entries.items():
            old = kept.get(sha)
            if old is None or replaces(entry.record, old.record):
                replaced += old is not None
                kept[sha] = entry
    written = write_archive(out, archives[0].fingerprint, kept.values())
    return MergeResult(written, len(archives), sum(len(a.entries) for a in archives), replaced)


@dataclass
class Diff:
    """What changed from archive ``a`` to archive ``b``. ``changed``: another winner; ``updated``: the same winner
    with another ratio, verification or creation time."""

    a: Archive
    b: Archive
    by_environment: bool
    new: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    changed: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    updated: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    unchanged: int = 0

    def to_json(self) -> dict[str, Any]:
        def pair(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
            return {"operation": new["operation"], "spec": new["spec"], "workload": new["workload"],
                    "winner_a": old["winner"], "winner_b": new["winner"], "ratio_a": old["ratio"],
                    "ratio_b": new["ratio"], "verified_a": old["verified"], "verified_b": new["verified"],
                    "created_a": old["created"], "created_b": new["created"]}

        return {
            "a": {"path": str(self.a.path), "fingerprint": self.a.digest, "decisions": len(self.a.entries)},
            "b": {"path": str(self.b.path), "fingerprint": self.b.digest, "decisions": len(self.b.entries)},
            "matched_by": "cache key without the environment" if self.by_environment else "cache key",
            "new": self.new, "dropped": self.dropped,
            "changed": [pair(o, n) for o, n in self.changed], "updated": [pair(o, n) for o, n in self.updated],
            "unchanged": self.unchanged,
        }


def _match_key(entry: ArchiveEntry, without_environment: bool) -> str:
    if not without_environment:
        return entry.key_sha256
    return key_sha256(CacheKey.decode(entry.record.cache_key).replace(environment="").encode())


def diff_archives(a_path: Path | str, b_path: Path | str) -> Diff:
    """Compare two archives by cache key (by the key without its environment when their fingerprints differ)."""
    a, b = single_archive(a_path), single_archive(b_path)
    other = a.digest != b.digest
    old = {_match_key(e, other): summary(a, e) for e in a.entries.values()}
    new = {_match_key(e, other): summary(b, e) for e in b.entries.values()}
    diff = Diff(a, b, other)
    for key in sorted(new.keys() - old.keys(), key=lambda k: (new[k]["operation"], new[k]["workload"])):
        diff.new.append(new[key])
    for key in sorted(old.keys() - new.keys(), key=lambda k: (old[k]["operation"], old[k]["workload"])):
        diff.dropped.append(old[key])
    for key in sorted(old.keys() & new.keys(), key=lambda k: (new[k]["operation"], new[k]["workload"])):
        o, n = old[key], new[key]
        if o["winner"] != n["winner"]:
            diff.changed.append((o, n))
        elif (o["ratio"], o["verified"], o["created"]) != (n["ratio"], n["verified"], n["created"]):
            diff.updated.append((o, n))
        else:
            diff.unchanged += 1
    return diff


def diff_table(diff: Diff) -> Any:
    from rich.table import Table

    how = " (different fingerprints: matched by the key without the environment)" if diff.by_environment else ""
    table = Table(title=f"{diff.a.digest} -> {diff.b.digest}: {len(diff.new)} new, {len(diff.dropped)} dropped, "
                        f"{len(diff.changed)} changed winners, {len(diff.updated)} updated, {diff.unchanged} "
                        f"unchanged{how}")
    for name in ("change", "operation", "workload", "winner", "ratio", "verified"):
        table.add_column(name)

    def spec(r: dict[str, Any]) -> str:
        if isinstance(r["spec"], dict):
            return ", ".join(f"{k}={v}" for k, v in r["spec"].items())
        return str(r["workload"])[:60]

    for r in diff.new:
        table.add_row("new", r["operation"], spec(r), r["winner"], f"{r['ratio']:.3f}", str(r["verified"]))
    for r in diff.dropped:
        table.add_row("dropped", r["operation"], spec(r), r["winner"], f"{r['ratio']:.3f}", str(r["verified"]))
    for kind, pairs in (("changed", diff.changed), ("updated", diff.updated)):
        for o, n in pairs:
            table.add_row(kind, n["operation"], spec(n), f"{o['winner']} -> {n['winner']}",
                          f"{o['ratio']:.3f} -> {n['ratio']:.3f}", f"{o['verified']} -> {n['verified']}")
    return table
