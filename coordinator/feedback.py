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

Weights: the runtimes also count their calls per workload (``kind="calls"`` reports, farm.feedback). A run folds
them into the hash ``<prefix>:fleet:calls`` (one field per (fingerprint, operation, device kind, normalized spec):
the calls counted since the hash's ``since``; schema-versioned) and deletes them from the stream, in one
transaction; each reported problem's weight is then its calls per hour (``Entry.calls_per_hour``; 1 when no
runtime counted it), so a run budget goes to the workloads the fleet runs most.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from farm.decisions import canonical_json
from farm.errors import ConfigError, FarmError
from farm.feedback import stream_key
from farm.jsontypes import JSONObject
from farm.policy import StackPolicy
from farm.stores.redis import RedisDecisions
from farm_coordinator.bans import RedisBans, new_ban, regressed_there_too
from farm_coordinator.catalog import Catalog, Workload
from farm_coordinator.ports import RunSummary
from farm_fleet.settings import Settings

log = logging.getLogger(__name__)

READ_LIMIT = 100_000  # the most reports one run reads (the stream is capped by the reporters near this)
CALLS_KEY = "fleet:calls"  # "<prefix>:fleet:calls": the calls the fleet counted per workload (a hash)
CALLS_META = "~meta"  # its schema field: {"v": CALLS_SCHEMA, "since": first counted}
CALLS_SCHEMA = 1


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


@dataclass(frozen=True)
class Count:
    """One workload's calls in a calls report."""

    operation: str
    device_kind: str
    spec: JSONObject
    fingerprint: str
    calls: int


@dataclass(frozen=True)
class CallsReport:
    """A ``kind="calls"`` report: one runtime's calls per workload over [since, time]."""

    id: str
    host: str
    time: float
    since: float
    counts: tuple[Count, ...]


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
    calls_per_hour: float | None = None  # what the fleet's runtimes counted (None: no runtime counted it)

    @property
    def weight(self) -> float:
        """The problem's weight for the run budget: its calls per hour, 1 when no runtime counted it."""
        return self.calls_per_hour if self.calls_per_hour else 1.0

    @property
    def reason(self) -> str:
        if self.regression:
            worst = max(self.ratios, default=0.0)
            text = f"regression reported by {len(self.hosts)} host(s) (selected/reference {worst:.2f})"
            if self.banned:
                text += f"; {self.old_winner} banned for this key: {self.banned}"
            return text
        calls = f", {self.calls_per_hour:.4g} calls/h" if self.calls_per_hour else ""
        return f"missed by {len(self.hosts)} host(s), {self.reports} report(s){calls}"


@dataclass
class FleetRun:
    """What ``tune_from_fleet`` did: tuned entries, the ids it acknowledged, what it left and why."""

    entries: list[Entry] = field(default_factory=list)
    decided: list[Entry] = field(default_factory=list)
    acknowledged: int = 0
    left: dict[str, int] = field(default_factory=dict)  # reason -> reports left in the stream
    summaries: list[RunSummary] = field(default_factory=list)


def read_reports(client: Any, settings: Settings, limit: int = READ_LIMIT) -> tuple[list[FleetReport], list[str]]:
    """The miss and regression reports waiting in the stream, oldest first, and the ids of malformed entries."""
    reports, _, malformed = read_stream(client, settings, limit)
    return reports, malformed


def read_stream(client: Any, settings: Settings,
                limit: int = READ_LIMIT) -> tuple[list[FleetReport], list[CallsReport], list[str]]:
    """The stream's miss and regression reports, its calls reports, and the ids of malformed entries."""
    reports: list[FleetReport] = []
    calls: list[CallsReport] = []
    malformed: list[str] = []
    for entry_id, fields in client.xrange(stream_key(settings.prefix), count=limit):
        try:
            raw = json.loads(fields["report"])
            if raw.get("kind") == "calls":
                calls.append(_calls_report(entry_id, raw))
                continue
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
    return reports, calls, malformed


def _calls_report(entry_id: str, raw: dict[str, Any]) -> CallsReport:
    if raw.get("v") != 1:
        raise ValueError(f"calls report version {raw.get('v')!r} (this farm reads 1)")
    counts = tuple(Count(str(c["operation"]), str(c.get("device_kind") or ""), c["spec"], str(c["fingerprint"]),
                         int(c["calls"])) for c in raw["counts"] if isinstance(c, dict) and isinstance(c.get("spec"), dict))
    return CallsReport(entry_id, str(raw.get("host", "?")), float(raw["time"]), float(raw["since"]), counts)


def entry_spec(operation: str, spec: JSONObject, device_kind: str, where: str) -> JSONObject:
    """A reported spec as the farm identifies it: normalized, without the seed (applications' inputs have none:
    the default one builds the same workload). ConfigError: not a valid spec; LookupError: unknown operation."""
    from farm_kernels import registry

    if operation not in registry.names():
        raise LookupError(operation)
    normalized = registry.get(operation).normalize(spec, where, devices=device_kind or None)
    normalized.pop("seed", None)
    return normalized


def fold_calls(client: Any, settings: Settings, calls: list[CallsReport]) -> int:
    """Add the calls reports' counts to ``<prefix>:fleet:calls`` and delete them from the stream, in one
    transaction; the calls folded. Counts of a workload the farm cannot identify (unknown operation, invalid
    spec) are dropped with the report. A hash of another schema version is a FarmError, never overwritten."""
    key = f"{settings.prefix}:{CALLS_KEY}"
    meta = client.hget(key, CALLS_META)
    if meta is not None and json.loads(meta).get("v") != CALLS_SCHEMA:
        raise FarmError(f"{key} holds call counts of schema {json.loads(meta).get('v')!r}; this farm reads "
                        f"{CALLS_SCHEMA}: delete the key to start counting again")
    merged: dict[str, int] = {}
    for report in calls:
        for c in report.counts:
            try:
                spec = entry_spec(c.operation, c.spec, c.device_kind, f"calls report {report.id}")
            except (ConfigError, LookupError):
                continue
            field_name = canonical_json([c.fingerprint, c.operation, c.device_kind, spec])
            merged[field_name] = merged.get(field_name, 0) + max(0, c.calls)
    since = min((r.since for r in calls), default=0.0)
    pipe = client.pipeline(transaction=True)
    for field_name, n in merged.items():
        pipe.hincrby(key, field_name, n)
    pipe.hsetnx(key, CALLS_META, json.dumps({"v": CALLS_SCHEMA, "since": since}))
    for start in range(0, len(calls), 1000):
        pipe.xdel(stream_key(settings.prefix), *[r.id for r in calls[start:start + 1000]])
    pipe.execute()
    return sum(merged.values())


def calls_per_hour(client: Any, settings: Settings, now: float) -> dict[tuple[str, str, str, str], float]:
    """The fleet's calls per hour of each workload it counted, by (fingerprint, operation, device kind, canonical
    spec): the calls folded so far over the hours since the first report's ``since``."""
    key = f"{settings.prefix}:{CALLS_KEY}"
    fields = client.hgetall(key)
    meta = fields.pop(CALLS_META, None)
    if meta is None:
        return {}
    hours = max((now - float(json.loads(meta).get("since") or now)) / 3600.0, 1 / 3600.0)
    out: dict[tuple[str, str, str, str], float] = {}
    for field_name, value in fields.items():
        try:
            fingerprint, operation, device_kind, spec = json.loads(field_name)
            out[(fingerprint, operation, device_kind, canonical_json(spec))] = int(value) / hours
        except (TypeError, ValueError) as e:
            log.warning("%s: field %r is malformed (%s): ignored", key, field_name[:80], e)
    return out


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
        try:
            spec = entry_spec(r.operation, r.spec, r.device_kind, f"fleet report {r.id}")
        except LookupError:
            untunable.setdefault(f"{r.operation}: not a registered operation (--kernels?)", []).append(r.id)
            continue
        except ConfigError as e:
            untunable.setdefault(f"{r.operation}: invalid spec ({e})", []).append(r.id)
            continue
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
        Workload(e.operation, (e.device_kind,) if e.device_kind else (), dict(e.spec), f"fleet:{i}", weight=e.weight)
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
    reports, calls, malformed = read_stream(client, settings)
    entries, untunable = plan(reports, kernels)
    if calls:
        fold_calls(client, settings, calls)
    rates = calls_per_hour(client, settings, time.time())
    for e in entries:
        e.calls_per_hour = rates.get((e.fingerprint, e.operation, e.device_kind, canonical_json(e.spec)))
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
    """For ``farm status`` and the metrics: reports waiting, by operation, fingerprint and kind (calls reports,
    which no run decides, are counted apart: ``calls_reports``)."""
    key = stream_key(settings.prefix)
    total = int(client.xlen(key))
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    reports, calls, malformed = read_stream(client, settings, limit)
    for r in reports:
        kind = r.kind if r.spec is not None else f"{r.kind} (signature only)"
        row = rows.setdefault((r.operation, r.fingerprint, kind), {
            "operation": r.operation, "fingerprint": r.fingerprint, "kind": kind, "reports": 0, "hosts": set()})
        row["reports"] += 1
        row["hosts"].add(r.host)
    listed = [{**row, "hosts": len(row["hosts"])} for row in rows.values()]
    listed.sort(key=lambda row: (-row["hosts"], -row["reports"], row["operation"]))
    return {"total": total - len(calls), "malformed": len(malformed), "by": listed, "calls_reports": len(calls)}
