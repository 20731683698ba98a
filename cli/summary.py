"""What ``farm tune`` prints at the end: every decision of the catalog (tuned now or reused from an earlier run),
what the columns mean, and what to do about failures."""

from __future__ import annotations

import json
from typing import Any

from farm.stores.base import DecisionRecord
from farm_coordinator.catalog import workload_label
from farm_coordinator.plan import Problem
from farm_coordinator.sinks import Sink

LEGEND = (
    "source: ran = tuned in this run, reused = already decided by an earlier run (not re-tuned).\n"
    "ratio: the winner's median time / the reference's (below 1 is faster). lost: candidates that did not win\n"
    "(slower, noisy, wrong output, or skipped). confirmation: confirmed = a second device of the fingerprint\n"
    "reproduced the win; failed = the second device did not confirm it, so the reference stays; unconfirmed = no\n"
    "second device was online."
)


def decided_records(sink: Sink, problems: list[Problem]) -> dict[str, DecisionRecord]:
    """The published records of problems an earlier run decided (problem id -> record), read back through the sink
    (Redis, or the embedded farm's local cache). Unreadable ones are left out."""
    by_digest: dict[str, list[str]] = {}
    for p in problems:
        by_digest.setdefault(p.target.digest, []).append(p.problem_id)
    found: dict[str, DecisionRecord] = {}
    for digest, pids in by_digest.items():
        found.update(sink.problem_records(digest, pids))
    return found


def rows(summary: Any, reused: dict[str, DecisionRecord]) -> list[dict[str, Any]]:
    """One row per problem of the run: tuned now, failed, or reused."""
    out = []
    for agg in summary.aggregates:
        out.append(_row(agg.problem, agg.record, "ran", agg.error))
    for p in summary.already_decided:
        out.append(_row(p, reused.get(p.problem_id), "reused", None))
    return sorted(out, key=lambda r: (r["fingerprint"], r["operation"], r["workload"]))


def _row(problem: Any, record: DecisionRecord | None, source: str, error: str | None) -> dict[str, Any]:
    w = problem.workload
    row: dict[str, Any] = {"fingerprint": problem.target.digest, "operation": w.operation,
                           "workload": workload_label(w.operation, w.spec), "spec": w.spec, "source": source,
                           "record": record.to_dict() if record is not None else None, "error": error}
    if record is not None:
        candidates = record.meta.get("candidates", [])
        row["lost"] = sum(1 for c in candidates if not str(c.get("note", "")).startswith("selected"))
        confirmation = str(record.meta.get("confirmation") or "-")
        row["confirmation"] = confirmation.split(":")[0]
    return row


def table(summary: Any, all_rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    failed = sum(1 for r in all_rows if r["record"] is None and r["source"] == "ran")
    reused = sum(1 for r in all_rows if r["source"] == "reused")
    t = Table(title=f"run {summary.run}: {len(all_rows)} problems: {summary.published} tuned and published, "
                    f"{reused} reused, {failed} failed")
    for column in ("fingerprint", "operation", "workload", "source", "winner", "ratio", "verified", "confirmation",
                   "lost"):
        t.add_column(column, no_wrap=column not in ("workload",), justify="right" if column in ("ratio", "lost") else "left")
    for r in all_rows:
        head = [r["fingerprint"][:8], r["operation"], r["workload"], r["source"]]
        rec = r["record"]
        if rec is None:
            t.add_row(*head, "[red]failed[/red]", "-", "-", "-", "-")
            continue
        t.add_row(*head, rec["name"], f"{rec['ratio']:.3f}", "yes" if rec["verified"] else "no", r["confirmation"],
                  str(r["lost"]))
    return t


def failures(all_rows: list[dict[str, Any]]) -> list[str]:
    """One line per failed problem: where, and why."""
    return [f"{r['fingerprint'][:8]} {r['operation']} {r['workload']}: {r['error'] or 'no decision'}"
            for r in all_rows if r["record"] is None and r["source"] == "ran"]


def as_json(summary: Any, all_rows: list[dict[str, Any]]) -> str:
    decisions = [{k: r[k] for k in ("operation", "spec", "workload", "fingerprint", "source", "record", "error")}
                 for r in all_rows]
    return json.dumps({"run": summary.run, "published": summary.published,
                       "reused": sum(1 for r in all_rows if r["source"] == "reused"),
                       "failed": len(failures(all_rows)), "wall_seconds": summary.wall_seconds,
                       "decisions": decisions}, indent=1)
