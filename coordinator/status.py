"""`farm status`: the fleet at a glance: workers per fingerprint with their state and regime (cores, BLAS and
OpenMP pool sizes), queue depths, decisions per fingerprint with the regime they were measured in (an application
is served only its own regime's), and tuning runs with their progress."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table

from farm_coordinator.bans import RedisBans
from farm_coordinator.runlog import RUNNING, RedisRunLog
from farm_fleet import presence
from farm_fleet.settings import Settings

STALE_RUN_SECONDS = 30.0


def collect(client: Any, settings: Settings, broker: Any | None = None) -> dict[str, Any]:
    """The status as JSON-able data. ``broker`` (a redis client of the broker) adds queue depths."""
    now = time.time()
    workers = presence.live_workers(client, settings)
    texts = client.hgetall(settings.fingerprints_key)
    digests = sorted(set(texts) | {w.fingerprint for w in workers})
    fingerprints = []
    for digest in digests:
        mine = [w for w in workers if w.fingerprint == digest]
        states: dict[str, int] = {}
        for w in mine:
            state = w.effective_state(settings, now)
            states[state] = states.get(state, 0) + 1
        queue = settings.fingerprint_queue(digest)
        fingerprints.append({
            "digest": digest,
            "fingerprint": texts.get(digest, ""),
            "regime": fingerprint_regime(texts.get(digest, "")),
            "models": sorted({w.model for w in mine}),
            "workers": states,
            "queue": queue,
            "queued": int(broker.llen(queue)) if broker is not None else None,
            "decisions": int(client.hlen(settings.decisions_key(digest))),
        })
    runs = []
    for run in RedisRunLog(client, settings).runs():
        state = run.get("state", "?")
        if state == RUNNING and now - float(run.get("updated", 0)) > STALE_RUN_SECONDS:  # interrupted, failed: kept
            state = "stale"
        runs.append({**run, "state": state})
    return {
        "workers": [
            {**w.to_fields(), "state": w.effective_state(settings, now), "heartbeat_age": round(now - w.updated, 1),
             "queued": int(broker.llen(w.queue)) if broker is not None else None, "regime": w.regime(),
             "blas_threads": w.blas_threads, "openmp_threads": w.openmp_threads}
            for w in workers
        ],
        "fingerprints": fingerprints,
        "runs": runs,
        "feedback": _feedback(client, settings),
        "bans": [{"fingerprint": digest, "problem_id": pid, "candidate": ban.candidate, "reason": ban.reason,
                  "run": ban.run, "time": ban.time} for digest, pid, ban in RedisBans(client, settings).all(digests)],
    }


def groups_done(run: dict[str, Any]) -> str:
    """``done/groups``; a finished run with groups left says why: the coordinator recorded them not tried (a
    problem's budget, or the run's --timeout, ended its search before their turn), so they never ran."""
    done, groups = int(float(run.get("done", 0) or 0)), int(float(run.get("groups", 0) or 0))
    text = f"{done}/{groups}"
    if run.get("state") == "finished" and done < groups:
        text += f" ({groups - done} not tried: the budget ran out first)"
    return text


def published(run: dict[str, Any]) -> str:
    """The run's published decisions; those the budget cut say so: ``5 (2 partial: the budget stopped their
    search; raise budget in [policy], the next farm tune continues them)``."""
    done, partial = int(float(run.get("published", 0) or 0)), int(float(run.get("partial", 0) or 0))
    if not partial:
        return str(done)
    return (f"{done} ({partial} partial: the budget stopped {'their' if partial != 1 else 'its'} search; raise budget "
            f"in [policy], the next farm tune continues {'them' if partial != 1 else 'it'})")


def fingerprint_regime(fingerprint: str) -> str:
    """The execution regime a fingerprint's decisions were measured in (``cpus=1; blas=1 (...); openmp=1``), ""
    for one without a host regime (CUDA): applications in another regime are served none of them."""
    from farm.stores.regimes import split_regime

    split = split_regime(fingerprint)
    return split[1] if split is not None else ""


def _feedback(client: Any, settings: Settings) -> dict[str, Any]:
    """Fleet reports waiting for `farm tune --from-fleet` (coordinator/feedback.py), by operation and fingerprint."""
    from farm_coordinator.feedback import waiting

    reports: dict[str, Any] = waiting(client, settings)
    return reports


def render(status: dict[str, Any]) -> Group:
    """Human tables for :func:`collect`'s data."""
    from rich.markup import escape  # every cell is a user string (a worker id, a reason), never markup

    fps = Table(title="fingerprints")
    for column in ("digest", "model", "regime decided", "workers", "queued", "decisions"):
        fps.add_column(column)
    for f in status["fingerprints"]:
        online = ", ".join(f"{n} {state}" for state, n in sorted(f["workers"].items())) or "none online"
        fps.add_row(escape(f["digest"]), escape(", ".join(f["models"]) or "-"), escape(f.get("regime") or "-"),
                    escape(online),
                    "-" if f["queued"] is None else str(f["queued"]), str(f["decisions"]))
    workers = Table(title="workers")
    for column in ("worker", "device", "model", "regime", "fingerprint", "state", "heartbeat", "version"):
        workers.add_column(column)
    for w in status["workers"]:
        workers.add_row(*(escape(str(v)) for v in (w["worker_id"], w["device"], w["model"], w["regime"],
                                                    w["fingerprint"][:8], w["state"])),
                        f"{w['heartbeat_age']}s ago", escape(str(w["farm_version"])))
    runs = Table(title="tuning runs")
    for column in ("run", "catalog", "host", "state", "groups done", "published"):
        runs.add_column(column)
    for r in status["runs"]:
        runs.add_row(*(escape(str(v)) for v in (r["run"], r.get("catalog", ""), r.get("host", ""), r["state"])),
                     groups_done(r),
                     escape(published(r)))
    reports = Table(title=f"fleet reports waiting ({status['feedback']['total']}; farm tune --from-fleet)")
    for column in ("operation", "fingerprint", "kind", "reports", "hosts"):
        reports.add_column(column)
    for row in status["feedback"]["by"]:
        reports.add_row(*(escape(str(row[k])) for k in ("operation", "fingerprint", "kind", "reports", "hosts")))
    bans = Table(title=f"banned candidates ({len(status['bans'])}; farm unban PROBLEM_ID lifts)")
    for column in ("fingerprint", "problem", "candidate", "reason"):
        bans.add_column(column)
    for row in status["bans"]:
        bans.add_row(*(escape(str(v)) for v in (row["fingerprint"][:8], row["problem_id"], row["candidate"],
                                                 row["reason"])))
    return Group(fps, workers, runs, reports, bans)
