"""Archive operations behind ``farm archive``: inspect, merge and diff here; export (``farm_archives.export``) and
import (``farm_archives.imports``) in their own modules, re-exported here. The reader and writer are this package's,
the format the core's (``farm.stores.archive``); the schema is documented in docs/archives.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from farm.identity import CacheKey
from farm.jsontypes import JSONObject
from farm.stores.archive.manifest import archive_folders
from farm.stores.archive.schema import ArchiveEntry, ArchiveError
from farm.stores.archive.signing import Trust
from farm.stores.base import key_sha256, replaces
from farm_archives.derived import decision_row
from farm_archives.export import ExportResult, export_cache, export_redis, select_fingerprints
from farm_archives.imports import ImportResult, import_cache, import_redis, load_archives
from farm_archives.reader import Archive, read_archive
from farm_archives.signing import SigningKey
from farm_archives.writer import WrittenArchive, write_archive

__all__ = [
    "Diff", "ExportResult", "ImportResult", "MergeResult", "diff_archives", "diff_table", "export_cache",
    "export_redis", "import_cache", "import_redis", "inspect_rows", "inspect_table", "load_archives", "read_archives",
    "merge_archives", "select_fingerprints", "single_archive", "summary",
]


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def summary(archive: Archive, entry: ArchiveEntry) -> dict[str, Any]:
    """A decision as ``inspect --json`` shows it."""
    row = decision_row(entry.record, entry.problem_id, entry.text)
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


Label = Callable[[str, Any], str]  # (operation, spec) -> how a command writes the workload (the CLI's catalog label)


def inspect_table(archives: Sequence[Archive], rows: list[dict[str, Any]], workload_label: Label) -> Any:
    from rich.markup import escape  # a config's name, row_blocks[height=64], is not markup
    from rich.table import Table

    heads = "; ".join(f"{a.digest}: {len(a.entries)} decisions, {a.trial_rows} trial rows, schema "
                      f"{a.manifest['schema_version']}, farm {a.manifest.get('farm_version')}" for a in archives)
    table = Table(title=escape(f"archive {heads}"))
    for name in ("operation", "workload", "winner", "ratio", "verified", "samples", "confirmation", "created"):
        table.add_column(name, justify="right" if name in ("ratio", "samples") else "left")
    for r in rows:
        spec = workload_label(r["operation"], r["spec"]) if isinstance(r["spec"], dict) else (
            r["workload"] if len(r["workload"]) <= 60 else r["workload"][:57] + "...")
        table.add_row(escape(str(r["operation"])), escape(spec), escape(str(r["winner"])), f"{r['ratio']:.3f}",
                      "yes" if r["verified"] else "no", "" if r["samples"] is None else str(r["samples"]),
                      escape(str(r["confirmation"] or "")), _iso(r["created"]))
    return table


def read_archives(path: Path | str) -> list[Archive]:
    """Every archive at ``path``, verified but not its signature: for reading (inspect), never for trusting."""
    return [read_archive(folder) for folder in archive_folders(path)]


def single_archive(path: Path | str, trust: Trust | None = None) -> Archive:
    """The one archive at ``path`` (an archive folder, or a folder holding exactly one), verified (its signature
    too, given ``trust``)."""
    folders = archive_folders(path)
    if len(folders) != 1:
        raise ArchiveError(f"{path}: holds {len(folders)} archives; name one fingerprint folder")
    return read_archive(folders[0], trust=trust)


@dataclass
class MergeResult:
    written: WrittenArchive
    inputs: int
    decisions_in: int
    replaced: int


def merge_archives(inputs: Sequence[Path | str], out: Path | str, *, signer: SigningKey | None = None,
                   trust: Trust | None = None) -> MergeResult:
    """Merge archives of ONE fingerprint into ``out/<digest>/``: per key the replacement rule decides (a verified
    record beats an unverified one, otherwise the newer wins, ties to the later input); the kept record's trial
    rows and problem id follow it. A merge signed by ``signer`` vouches for its inputs, so each must then pass
    ``trust`` (default ``Trust.from_env()``); an unsigned merge checks only what ``trust`` is given."""
    if signer is not None and trust is None:
        trust = Trust.from_env()
    archives = [single_archive(p, trust) for p in inputs]
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
    written = write_archive(out, archives[0].fingerprint, kept.values(), signer=signer)
    return MergeResult(written, len(archives), sum(len(a.entries) for a in archives), replaced)


@dataclass
class Diff:
    """What changed from archive ``a`` to archive ``b``. ``changed``: another winner; ``updated``: the same winner
    with another ratio, verification or confirmation (a record re-published with a new creation time alone is
    unchanged)."""

    a: Archive
    b: Archive
    by_environment: bool
    new: list[JSONObject] = field(default_factory=list)
    dropped: list[JSONObject] = field(default_factory=list)
    changed: list[tuple[JSONObject, JSONObject]] = field(default_factory=list)
    updated: list[tuple[JSONObject, JSONObject]] = field(default_factory=list)
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
        elif _compared(o) != _compared(n):
            diff.updated.append((o, n))
        else:
            diff.unchanged += 1
    return diff


def _compared(row: dict[str, Any]) -> tuple[Any, ...]:
    return round(float(row["ratio"]), 6), bool(row["verified"]), row["confirmation"] or ""


def diff_table(diff: Diff, workload_label: Label) -> Any:
    from rich.markup import escape  # a config's name, row_blocks[height=64], is not markup
    from rich.table import Table

    how = " (different fingerprints: matched by the key without the environment)" if diff.by_environment else ""
    table = Table(title=escape(f"{diff.a.digest} -> {diff.b.digest}: {len(diff.new)} new, {len(diff.dropped)} dropped, "
                        f"{len(diff.changed)} changed winners, {len(diff.updated)} updated, {diff.unchanged} "
                        f"unchanged{how}"))
    for name in ("change", "operation", "workload", "winner", "ratio", "verified", "confirmation"):
        table.add_column(name)
    def spec(r: dict[str, Any]) -> str:
        return workload_label(r["operation"], r["spec"]) if isinstance(r["spec"], dict) else str(r["workload"])[:60]

    def was(o: dict[str, Any], n: dict[str, Any], key: str, fmt: Any = str) -> str:
        return fmt(n[key]) if fmt(o[key]) == fmt(n[key]) else f"{fmt(o[key])} -> {fmt(n[key])}"

    def ratio(v: Any) -> str:
        return f"{v:.3f}"

    def yes(v: Any) -> str:
        return "yes" if v else "no"

    for kind, rows in (("new", diff.new), ("dropped", diff.dropped)):
        for r in rows:
            table.add_row(kind, escape(str(r["operation"])), escape(spec(r)), escape(str(r["winner"])),
                          ratio(r["ratio"]), yes(r["verified"]), escape(str(r["confirmation"] or "")))
    for kind, pairs in (("changed", diff.changed), ("updated", diff.updated)):
        for o, n in pairs:
            table.add_row(kind, escape(str(n["operation"])), escape(spec(n)), escape(was(o, n, "winner")),
                          was(o, n, "ratio", ratio), was(o, n, "verified", yes),
                          escape(was(o, n, "confirmation", lambda v: v or "")))
    return table
