"""Fleet feedback, the farm's side: the reports applications sent (farm.feedback) become a catalog to tune.

``farm tune --from-fleet`` reads the reports stream, deduplicates the reports by (fingerprint, operation, device
kind, normalized spec), ranks the problems by distinct hosts, then reports, then the oldest report first, tunes
each fingerprint's problems on the workers of that fingerprint with the usual rules, and deletes the reports it
covered (XDEL by id). A regression report makes the farm re-measure its problem with ``force`` and publish the new
verdict, which replaces the old record; when the re-measure finds the old winner (the fleet's record for the
reported cache key) failing or slower than ``regression_ratio`` on the farm too, that candidate is banned for the
problem (``coordinator/bans.py``), so no later run publishes it again for that key. Reports the farm cannot tune (no workload spec, an unknown operation, an
invalid spec) stay in the stream, counted, for ``farm status`` to show; so do those of a fingerprint no live
worker has.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from farm.errors import ConfigError, FarmError
from farm.feedback import stream_key
from farm.jsontypes import JSONObject
from farm.policy import StackPolicy
from farm.stores.redis import RedisDecisions
from farm_coordinator.bans import RedisBans, new_ban, regressed_there_too
from farm_coordinator.catalog import Catalog, Workload
from farm_coordinator.ports import RunSummary
from farm_fleet.protocol import canonical_json
from farm_fleet.settings import Settings

log = logging.getLogger(__name__)

READ_LIMIT = 100_000  # the most reports one run reads (the stream is capped by the reporters near this)


@dataclass(frozen=True)
class FleetReport:
    """One report of the stream (see farm.feedback for the fields)."""

    id: str
    kind: str
    operation: str
    device_kind: str
    spec: JSONObject | None
    fingerprint: str
    host: str
    time: float
    ratios: tuple[float, ...]
    cache_key: str = ""


@dataclass
class Entry:
    """One problem asked for by the fleet: its reports merged."""

    operation: str
    device_kind: str
    spec: JSONObject
    fingerprint: str
    hosts: set[str] = field(default_factory=set)
    reports: int = 0
    first: float = float("inf")
    ids: list[str] = field(default_factory=list)
    regression: bool = False
    ratios: list[float] = field(default_factory=list)
    cache_keys: set[str] = field(default_factory=set)
    old_winner: str | None = None  # a regression's: the fleet's winner when the farm re-measured it
    banned: str | None = None  # why the old winner was banned, when the re-measure confirmed the regression

    @property
    def reason(self) -> str:
        if self.regression:
            worst = max(self.ratios, default=0.0)
            text = f"regression reported by {len(self.hosts)} host(s) (selected/reference {worst:.2f})"
            if self.banned:
                text += f"; {self.old_winner} banned for this key: {self.banned}"
            return text
        return f"missed by {len(self.hosts)} host(s), {self.reports} report(s)"


@dataclass
class FleetRun:
    """What ``tune_from_fleet`` did: tuned entries, the ids it acknowledged, what it left and why."""

    entries: list[Entry] = field(default_factory=list)
    decided: list[Entry] = field(default_factory=list)
    acknowledged: int = 0
    left: dict[str, int] = field(default_factory=dict)  # reason -> reports left in the stream
    summaries: list[RunSummary] = field(default_factory=list)


def read_reports(client: Any, settings: Settings, limit: int = READ_LIMIT) -> tuple[list[FleetReport], list[str]]:
    """The reports waiting in the stream, oldest first, and the ids of malformed entries."""
    reports: list[FleetReport] = []
    malformed: list[str] = []
    for entry_id, fields in client.xrange(stream_key(settings.prefix), count=limit):
        try:
            raw = json.loads(fields["report"])
            spec = raw.get("spec")
            reports.append(FleetReport(
                id=entry_id, kind=str(raw["kind"]), operation=str(raw["operation"]),
                device_kind=str(raw.get("device_kind") or ""), spec=spec if isinstance(spec, dict) else None,
                fingerprint=str(raw["fingerprint"]), host=str(raw.get("host", "?")), time=float(raw.get("time", 0.0)),
                ratios=tuple(float(r) for r in raw.get("ratios", ())), cache_key=str(raw.get("cache_key") or ""),
            ))
        except (KeyError, TypeError, ValueError) as e:
            log.warning("fleet report %s is malformed (%s): skipped", entry_id, e)
            malformed.append(entry_id)
    return reports, malformed


def plan(reports: list[FleetReport], kernels: tuple[str, ...] = ()) -> tuple[list[Entry], dict[str, list[str]]]:
    """Deduplicate and rank the reports; also the ids of reports that cannot be tuned, by reason. ``kernels``:
    modules of operations to load (as ``--kernels``)."""
    from farm_kernels import registry

    registry.ensure_loaded(kernels)
    entries: dict[tuple[str, str, str, str], Entry] = {}
    untunable: dict[str, list[str]] = {}
    for r in reports:
        if r.spec is None:
            untunable.setdefault(f"{r.operation}: no workload spec (signature only)", []).append(r.id)
            continue
        if r.operation not in registry.names():
            untunable.setdefault(f"{r.operation}: not a registered operation (--kernels?)", []).append(r.id)
            continue
        try:
            spec = registry.get(r.operation).normalize(r.spec, f"fleet report {r.id}", devices=r.device_kind or None)
        except ConfigError as e:
            untunable.setdefault(f"{r.operation}: invalid spec ({e})", []).append(r.id)
            continue
        spec.pop("seed", None)  # applications' inputs have no seed: the default one builds the same workload
        key = (r.fingerprint, r.operation, r.device_kind, canonical_json(spec))
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = Entry(r.operation, r.device_kind, spec, r.fingerprint)
        entry.hosts.add(r.host)
        entry.reports += 1
        entry.first = min(entry.first, r.time)
        entry.ids.append(r.id)
        if r.kind == "regression":
            entry.regression = True
            entry.ratios.extend(r.ratios[:1])
            if r.cache_key:
                entry.cache_keys.add(r.cache_key)
    ranked = sorted(entries.values(), key=lambda e: (-len(e.hosts), -e.reports, e.first))
    return ranked, untunable


def catalog_for(entries: list[Entry], policy: StackPolicy, kernels: tuple[str, ...] = ()) -> Catalog:
    """A catalog of ranked entries; each workload's ``where`` is its index in ``entries``."""
    workloads = tuple(
        Workload(e.operation, (e.device_kind,) if e.device_kind else (), dict(e.spec), f"fleet:{i}")
        for i, e in enumerate(entries)
    )
    what = "re-tune after a regression" if any(e.regression for e in entries) else "misses"
    return Catalog(f"fleet reports ({what})", policy, workloads, kernels)


def tune_from_fleet(
    client: Any, settings: Settings, policy: StackPolicy, run: Callable[..., RunSummary],
    kernels: tuple[str, ...] = ()
) -> FleetRun:
    """Tune what the reports ask for. ``run(catalog, fingerprint=..., force=...)`` runs one catalog with the
    usual rules (``farm_coordinator.run.tune`` with the CLI's parts) and returns its RunSummary."""
    reports, malformed = read_reports(client, settings)
    entries, untunable = plan(reports, kernels)
    out = FleetRun(entries=entries)
    for reason, ids in untunable.items():
        out.left[reason] = len(ids)
    acknowledge = list(malformed)
    groups: dict[tuple[str, bool], list[Entry]] = {}
    for e in entries:
        groups.setdefault((e.fingerprint, e.regression), []).append(e)
    decisions = RedisDecisions(client=client, settings=settings)
    bans = RedisBans(client, settings)
    for (fingerprint, force), group in groups.items():
        if force:
            for e in group:
                e.old_winner = old_winner(decisions, e)
        try:
            summary = run(catalog_for(group, policy, kernels), fingerprint=fingerprint, force=force)
        except FarmError as error:
            if "no live workers" not in str(error) and "no workload matches" not in str(error):
                raise
            out.left[f"fingerprint {fingerprint}: no live worker can tune it"] = sum(len(x.ids) for x in group)
            continue
        out.summaries.append(summary)
        done = {s.workload.where for s in summary.problems
                if s.error is None and (s.source == "ran" or not force)}
        if force:
            ban_regressed(decisions, bans, group, summary, policy)
        for i, e in enumerate(group):
            if f"fleet:{i}" in done:
                out.decided.append(e)
                acknowledge.extend(e.ids)
            else:
                out.left[f"{e.operation}: not decided in this run"] = out.left.get(
                    f"{e.operation}: not decided in this run", 0) + len(e.ids)
    for start in range(0, len(acknowledge), 1000):
        out.acknowledged += int(client.xdel(stream_key(settings.prefix), *acknowledge[start:start + 1000]))
    return out


def old_winner(decisions: RedisDecisions, entry: Entry) -> str | None:
    """The candidate the fleet serves for a regression entry's reported cache keys (None: the reference, or no
    readable record): the suspect its re-measure may ban."""
    for cache_key in sorted(entry.cache_keys):
        try:
            record = decisions.get(cache_key)
        except FarmError as e:
            log.warning("fleet report for %s: the published record is unreadable (%s)", cache_key[:80], e)
            continue
        if record is not None and record.index != record.reference_index:
            return record.name
    return None


def ban_regressed(decisions: RedisDecisions, bans: RedisBans, group: list[Entry], summary: RunSummary,
                  policy: StackPolicy) -> None:
    """After a forced re-measure: ban each old winner whose re-measure (read back from the record the run
    published) confirms the reported regression."""
    settled = {s.workload.where: s for s in summary.problems if s.error is None and s.source == "ran"}
    for i, e in enumerate(group):
        done = settled.get(f"fleet:{i}")
        if done is None or e.old_winner is None:
            continue
        record = decisions.problem_records(done.target.digest, [done.problem_id]).get(done.problem_id)
        if record is None:
            continue
        measured = next((c for c in record.meta.get("candidates", ()) if c.get("name") == e.old_winner), None)
        reason = regressed_there_too(measured, policy) if measured is not None else None
        if measured is None or reason is None:
            continue
        bans.ban(done.target.digest, done.problem_id,
                 new_ban(e.old_winner, reason, str(record.meta.get("run", "")), measured.get("ratio")))
        e.banned = reason
        log.warning("fleet regression confirmed: %s banned for %s %s (%s)", e.old_winner, e.operation,
                    done.problem_id, reason)


RUN_TAGS = {"fleet-regression": "re-tuned: an application's regression window invalidated the decision",
            "fleet-miss": "tuned: applications missed it (fleet feedback)"}


def run_id_for(run: str, force: bool, n: int) -> str:
    """The run id of the ``n``-th catalog of a ``--from-fleet`` run: it says why, for the report (``run_origin``)."""
    return f"{run}-{'fleet-regression' if force else 'fleet-miss'}-{n}"


def run_origin(run: str) -> str:
    """Why a decision published by run ``run`` was tuned, when fleet feedback asked for it; else ""."""
    for tag, reason in RUN_TAGS.items():
        if f"-{tag}-" in run:
            return reason
    return ""


def waiting(client: Any, settings: Settings, limit: int = 10_000) -> dict[str, Any]:
    """For ``farm status`` and the metrics: reports waiting, by operation, fingerprint and kind."""
    key = stream_key(settings.prefix)
    total = int(client.xlen(key))
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    reports, malformed = read_reports(client, settings, limit)
    for r in reports:
        kind = r.kind if r.spec is not None else f"{r.kind} (signature only)"
        row = rows.setdefault((r.operation, r.fingerprint, kind), {
            "operation": r.operation, "fingerprint": r.fingerprint, "kind": kind, "reports": 0, "hosts": set()})
        row["reports"] += 1
        row["hosts"].add(r.host)
    listed = [{**row, "hosts": len(row["hosts"])} for row in rows.values()]
    listed.sort(key=lambda row: (-row["hosts"], -row["reports"], row["operation"]))
    return {"total": total, "malformed": len(malformed), "by": listed}
