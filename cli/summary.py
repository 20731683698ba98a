"""What ``farm tune`` prints at the end: every decision of the catalog (tuned now or reused from an earlier run),
what the columns mean, and what to do about failures.

The run's summary lists its problems compactly (``farm_coordinator.ports.Settled``); the records are read back from
the sink (Redis, or the embedded farm's local cache) a chunk at a time, so the summary of 100,000 problems holds
one short row per problem, never every record at once. The table shows the first ``TABLE_ROWS`` rows; ``--json``
lists every decision with its record, streamed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from farm.policy import StackPolicy
from farm.stores.base import DecisionRecord
from farm.strategies import effort
from farm_coordinator.catalog import workload_label
from farm_coordinator.partial import describe, is_partial
from farm_coordinator.sinks import Sink

LEGEND = (
    "source: ran = tuned in this run, reused = already decided by an earlier run (not re-tuned).\n"
    "ratio: the winner's median time / the reference's (below 1 is faster). lost: candidates that did not win\n"
    "(slower, noisy, wrong output, or skipped). confirmation: confirmed = a second device of the fingerprint\n"
    "reproduced the win; failed = the second device did not confirm it, so the reference stays; unconfirmed = the\n"
    "win is published without a second device's confirmation, for the reason shown after it (no second device\n"
    "online, the confirmation did not decide a win, the confirming worker went away, the timeout).\n"
    "partial: the budget stopped the search before every candidate was tried; the winner is the best found so far\n"
    "(applications are served it) and the next `farm tune` continues the search instead of reusing it."
)
TABLE_ROWS = 1000  # rows the table shows at most (every failure is listed on stderr; --json lists every decision)
READ_CHUNK = 500  # records read back per sink call
SPACE_LINES = 20  # "evaluated N of M configs" lines under the table at most


def decided_records(sink: Sink, problems: Iterable[tuple[str, str]]) -> dict[str, DecisionRecord]:
    """The published records of ``problems`` ((fingerprint digest, problem id) pairs), problem id -> record, read
    back through the sink. Unreadable ones are left out."""
    by_digest: dict[str, list[str]] = {}
    for digest, pid in problems:
        by_digest.setdefault(digest, []).append(pid)
    found: dict[str, DecisionRecord] = {}
    for digest, pids in by_digest.items():
        found.update(sink.problem_records(digest, pids))
    return found


def rows(summary: Any, sink: Sink, policy: StackPolicy | None = None) -> list[dict[str, Any]]:
    """One compact row per problem of the run (tuned now, failed, or reused), sorted; the record's fields the
    table shows are read back from the sink a chunk at a time, the records themselves not kept. ``policy``: the
    run's (a farm record does not carry its strategy); ``partial`` says the space search did not cover the space
    (a sampling strategy, ``max_configs`` or the budget): only those searches get a line under the table."""
    out = [_row(s) for s in summary.problems]
    out.sort(key=lambda r: (r["fingerprint"], r["operation"], r["workload"]))
    for row, record in with_records(sink, out):
        if record is None:
            continue
        candidates = record.meta.get("candidates", [])
        row.update(winner=record.name, ratio=record.ratio, verified=record.verified,
                   confirmation=confirmation_text(str(record.meta.get("confirmation") or "-")),
                   lost=sum(1 for c in candidates if not str(c.get("note", "")).startswith("selected")),
                   effort=space_effort(record, policy), partial=partial_search(record, policy),
                   cut=describe(record.meta),
                   device_seconds=record.meta.get("device_seconds"), compile_seconds=record.meta.get("compile_seconds"))
    return out


def cost_line(summary: Any) -> str:
    """The run's cost, one line: ``cost: device 12.3 s, compile 4.5 s (recorded with each decision)``: seconds its
    searches ran on the devices (validation, warm-ups, timed runs, confirmations) and seconds its compile stage
    charged (off the devices); each published decision's meta holds its own share."""
    return (f"cost: device {summary.device_seconds:.1f} s, compile {summary.compile_seconds:.1f} s "
            "(recorded with each decision)")


def budget_lines(summary: Any) -> list[str]:
    """What the run's budget bought (``farm_coordinator.runbudget.Spent.lines``), none without a run budget."""
    from farm_coordinator.runbudget import Spent

    spent = getattr(summary, "budget", None)
    return spent.lines() if isinstance(spent, Spent) else []


def problem_cost(row: dict[str, Any]) -> str:
    """``; device 1.2 s, compile 0.3 s`` for a row whose record counts them, else empty."""
    device, compiled = row.get("device_seconds"), row.get("compile_seconds")
    if not isinstance(device, (int, float)):
        return ""
    return f"; device {device:.1f} s" + (f", compile {compiled:.1f} s" if isinstance(compiled, (int, float)) else "")


def space_effort(record: DecisionRecord, policy: StackPolicy | None = None) -> str | None:
    """"evaluated 60 of 10,240 configs (bayes, seed 0)" for a problem tuned over a space, else None. A record
    without the strategy's own counts (a farm decision) counts the configs it judged, under ``policy``'s strategy
    (the run's; exhaustive without one)."""
    meta = record.meta
    if isinstance(meta.get("evaluated"), int) and isinstance(meta.get("space_size"), int):
        return effort(meta["evaluated"], meta["space_size"], str(meta.get("strategy")), meta.get("seed"),
                      meta.get("incremental") is True) + ("" if is_partial(meta) else budget_cut(record, policy))
    try:
        from farm_kernels import recorded

        spaces = recorded.tunable(str(meta.get("operation")), str(meta.get("device_kind"))).spaces
    except Exception:  # an operation this process cannot load: no line rather than a failed summary
        return None
    if not spaces:
        return None
    names = [str(c.get("name", "")) for c in meta.get("candidates", [])
             if not str(c.get("note", "")).startswith("not tried")]  # the budget's cut: not evaluated
    judged = sum(1 for n in names if any(s.parse(n) is not None for s in spaces))
    strategy, seed = (policy.strategy, policy.seed) if policy is not None else ("exhaustive", None)
    return effort(judged, sum(s.size for s in spaces), strategy, seed) + ("" if is_partial(meta) else budget_cut(record, policy))


def budget_cut(record: DecisionRecord, policy: StackPolicy | None = None) -> str:
    """Why a search evaluated fewer configs than it planned, when the budget stopped it: ``: the budget of 10 s
    ran out with 3 candidates not tried (raise budget in the catalog's [policy] table)``; else empty."""
    cut = sum(1 for c in record.meta.get("candidates", []) if str(c.get("note", "")).startswith("not tried"))
    if not cut:
        return ""
    budget = f"the budget of {policy.budget:g} s" if policy is not None else "the budget"
    return (f": {budget} ran out with {cut} candidate{'s' if cut != 1 else ''} not tried (raise budget in the "
            f"catalog's [policy] table)")


def partial_search(record: DecisionRecord, policy: StackPolicy | None = None) -> bool:
    """Whether a space search left configs out on purpose or by force: a sampling strategy, a ``max_configs``, a
    grown space searched incrementally, or a candidate the budget left not tried (an exhaustive search of every feasible config is no news)."""
    meta = record.meta
    strategy = meta.get("strategy") or (policy.strategy if policy is not None else "exhaustive")
    max_configs = meta.get("max_configs") if "strategy" in meta else (policy.max_configs if policy else None)
    cut = any(str(c.get("note", "")).startswith("not tried") for c in meta.get("candidates", []))
    return strategy != "exhaustive" or max_configs is not None or cut or meta.get("incremental") is True


def confirmation_text(note: str) -> str:
    """The table's confirmation cell: ``confirmed``, or the outcome with its reason when the win was not confirmed
    (``unconfirmed: confirmation did not decide a win: undecided: noisy ...``), so the reason is on screen, not
    only in the archive."""
    word, _, reason = note.partition(":")
    return word if word == "confirmed" or not reason.strip() else f"{word}: {reason.strip()}"


def with_records(sink: Sink, all_rows: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], DecisionRecord | None]]:
    """Each row with its published record (None for a failure), in order, reading ``READ_CHUNK`` at a time."""
    for at in range(0, len(all_rows), READ_CHUNK):
        chunk = all_rows[at : at + READ_CHUNK]
        found = decided_records(sink, [(r["fingerprint"], r["problem_id"]) for r in chunk if r["error"] is None])
        for row in chunk:
            yield row, found.get(row["problem_id"]) if row["error"] is None else None


def _row(settled: Any) -> dict[str, Any]:
    w = settled.workload
    return {"fingerprint": settled.target.digest, "operation": w.operation, "problem_id": settled.problem_id,
            "workload": workload_label(w.operation, w.spec), "spec": w.spec, "source": settled.source,
            "error": settled.error}


def table(summary: Any, all_rows: list[dict[str, Any]]) -> Any:
    from rich.markup import escape  # a space config's name, tiled[block=32], is not markup
    from rich.table import Table

    failed = len(failures(all_rows))
    reused = sum(1 for r in all_rows if r["source"] == "reused")
    cut = sum(1 for r in all_rows if r.get("cut"))
    t = Table(title=escape(f"run {summary.run}: {len(all_rows)} problems: {summary.published} tuned and published"
                           f"{f' ({cut} partial)' if cut else ''}, {reused} reused, {failed} failed"))
    for column in ("fingerprint", "operation", "workload", "source", "winner", "ratio", "verified", "confirmation",
                   "lost"):
        t.add_column(column, no_wrap=column not in ("workload", "confirmation"), justify="right" if column in ("ratio", "lost") else "left")
    for r in all_rows[:TABLE_ROWS]:
        source = f"{r['source']}, partial" if r.get("cut") else r["source"]
        head = [escape(str(v)) for v in (r["fingerprint"][:8], r["operation"], r["workload"], source)]
        if r["error"] is not None:
            t.add_row(*head, "[red]failed[/red]", "-", "-", "-", "-")
            continue
        if "winner" not in r:  # published, but its record cannot be read back now
            t.add_row(*head, "[yellow]unreadable[/yellow]", "-", "-", "-", "-")
            continue
        t.add_row(*head, escape(r["winner"]), f"{r['ratio']:.3f}", "yes" if r["verified"] else "no", escape(r["confirmation"]),
                  str(r["lost"]))
    spaced = [f"{r['operation']} {r['workload']}: {_said(r)}{problem_cost(r)}" for r in all_rows[:TABLE_ROWS]
              if r.get("cut") or (r.get("effort") and r.get("partial"))]
    if len(spaced) > SPACE_LINES:
        spaced = [*spaced[:SPACE_LINES], f"... and {len(spaced) - SPACE_LINES:,} more problems tuned over spaces"]
    if len(all_rows) > TABLE_ROWS:
        spaced.append(f"the first {TABLE_ROWS:,} of {len(all_rows):,} problems; `farm tune --json` lists them all, "
                      f"`farm report` explains them")
    if spaced:
        t.caption = escape("\n".join(spaced))
    return t


def _said(row: dict[str, Any]) -> str:
    """A row's line under the table: the search's effort, and for a partial decision what the budget left out, why
    and what changes it (``farm_coordinator.partial.describe``)."""
    return "; ".join(part for part in (row.get("effort"), row.get("cut")) if part)


def failures(all_rows: list[dict[str, Any]]) -> list[str]:
    """One line per failed problem: where, and why."""
    return [f"{r['fingerprint'][:8]} {r['operation']} {r['workload']}: {r['error'] or 'no decision'}"
            for r in all_rows if r["error"] is not None]


def as_json(summary: Any, all_rows: list[dict[str, Any]], sink: Sink) -> Iterator[str]:
    """The decisions as one JSON document, in pieces (records read back again, a chunk at a time)."""
    head = {"run": summary.run, "published": summary.published, "partial": getattr(summary, "partial", 0),
            "reused": sum(1 for r in all_rows if r["source"] == "reused"),
            "failed": len(failures(all_rows)), "wall_seconds": summary.wall_seconds,
            "device_seconds": summary.device_seconds, "compile_seconds": summary.compile_seconds,
            "budget": summary.budget.to_dict() if hasattr(getattr(summary, "budget", None), "to_dict") else None}
    yield json.dumps(head, indent=1)[:-2] + ',\n "decisions": ['
    for i, (r, record) in enumerate(with_records(sink, all_rows)):
        decision = {k: r[k] for k in ("operation", "spec", "workload", "fingerprint", "source")}
        decision.update(record=record.to_dict() if record is not None else None, error=r["error"])
        yield ("\n" if i == 0 else ",\n") + json.dumps(decision, indent=1)
    yield "\n]\n}"


def not_tuned(catalog: Any, kinds_online: set[str], digests_online: set[str] | None = None) -> list[str]:
    """One line per device kind that catalog workloads need and no device online has: how many were left out,
    why, and what to do (a CPU-only fleet skips the example catalog's CUDA workloads; it must say so). With
    ``digests_online``, one line per recorded problem whose recording no worker serves."""
    missing: dict[str, int] = {}
    recorded: list[str] = []
    for w in catalog.workloads:
        fingerprint = getattr(w, "fingerprint", "")
        if fingerprint and digests_online is not None:
            if fingerprint not in digests_online:
                recorded.append(f"{w.where} of {catalog.path} not tuned: no worker serves its recording "
                                f"{w.spec.get('recording')!r} (fingerprint {fingerprint}); start `farm worker "
                                f"--device replay:PATH` with that file, then rerun")
            continue
        if not set(w.devices) & kinds_online:
            need = " or ".join(w.devices)
            missing[need] = missing.get(need, 0) + 1
    online = ", ".join(sorted(kinds_online)) or "none"
    return [f"{n} workload{'s' * (n != 1)} of {catalog.path} not tuned: {'they need' if n != 1 else 'it needs'} a "
            f"{need} device and none is online (online: {online}); start `farm worker --device {need.split()[0]}:N` "
            f"on a host that has one (the embedded farm: `farm tune --device {need.split()[0]}:0`), then rerun"
            for need, n in sorted(missing.items())] + recorded
