"""Stability of decisions: the host part of examples/catalog.toml tuned on the farm (a private redis-server, two
real `farm worker` processes on cpu:0 and cpu:1, one core each) and embedded (in this process, pinned to CPU 0
with every thread pool limited to one thread: the workers' regime, so the same fingerprint), winners compared.

Each problem whose winners differ is classified by the gap between winner and runner-up (the best other eligible
candidate, the reference counting at ratio 1.0) in each run: "near tie" when both runs saw a gap under 10 %,
"CLEAR" when either saw 10 % or more (the target: no clear difference), with the other run's verdict on each
winner in parentheses (noisy, too slow, beaten, unconfirmed: selected but not reproduced on the second device). For problems whose winners agree, the two
published ratios are compared against their noise band, 2 x (relative MAD of the farm ratio + that of the
embedded ratio), at least 5 %: "ratio off" marks a ratio that the other run does not reproduce.

    .venv/bin/python bench/stability.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]

from servers import farm_env, redis_server, start_worker, wait_worker_ready  # noqa: E402

from farm.environment import runtime_environment  # noqa: E402
from farm.runtimes.host import HostClient, host_regime, limit_threads  # noqa: E402
from farm_coordinator.catalog import Catalog, load_catalog  # noqa: E402
from farm_coordinator.run import RunOptions, RunSummary, tune  # noqa: E402
from farm_coordinator.runview import ConsoleObserver  # noqa: E402
from farm_fleet.settings import Settings  # noqa: E402

CLEAR_GAP = 0.10
QUICK_POSITIONS = (2, 5, 7)  # per operation: a mid-size, and (matmul) the two workloads of issue 10


def host_catalog(quick: bool) -> Catalog:
    catalog = load_catalog(ROOT / "examples" / "catalog.toml")
    workloads, seen = [], {}
    for w in catalog.workloads:
        if "cpu" not in w.devices:
            continue
        position = seen.get(w.operation, 0)
        seen[w.operation] = position + 1
        if not quick or position in QUICK_POSITIONS:
            workloads.append(w)
    return dataclasses.replace(catalog, workloads=tuple(workloads))


def outcomes(summary: RunSummary) -> dict[str, dict[str, Any]]:
    """problem label -> winner, ratio, its relative MAD, and the gap to the runner-up."""
    found = {}
    for a in summary.aggregates:
        label = f"{a.problem.workload.operation} {_spec(a.problem.workload.spec)}"
        if a.record is None:
            found[label] = {"winner": None, "error": a.error}
            continue
        reference = a.record.meta.get("reference")
        eligible = {reference: 1.0}  # the reference is not among the judged candidates
        mad = {reference: float(a.record.meta.get("relative_mad") or 0.0) if a.record.name == reference else 0.0}
        notes = {j.name: j.note for j in a.judged}
        rejected = a.record.meta.get("rejected_winner")
        if rejected:  # selected, then not reproduced on the second device
            notes[rejected] = "unconfirmed: " + notes.get(rejected, "")
        for j in a.judged:
            ratio = 1.0 if j.name == reference else j.ratio
            if ratio is not None and (j.verified or j.name == reference):
                eligible[j.name] = float(ratio)
                mad[j.name] = float(j.relative_mad or 0.0)
        winner = a.record.name
        ratio = eligible.get(winner, float(a.record.ratio))
        others = [r for name, r in eligible.items() if name != winner]
        gap = max(ratio, min(others)) / min(ratio, min(others)) - 1 if others else float("inf")
        found[label] = {"winner": winner, "ratio": ratio, "mad": mad.get(winner, 0.0), "gap": gap, "notes": notes,
                        "candidates": [(j.name, j.ratio, j.relative_mad, j.verified, j.note) for j in a.judged]}
    return found


def _spec(spec: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in spec.items() if k != "seed")


def compare(farm: dict[str, dict[str, Any]], embedded: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for label in sorted(set(farm) | set(embedded)):
        f, e = farm.get(label, {"winner": None}), embedded.get(label, {"winner": None})
        row = {"problem": label, "farm": f, "embedded": e}
        if f["winner"] is None or e["winner"] is None:
            row["class"] = "missing"
        elif f["winner"] != e["winner"]:
            if max(f["gap"], e["gap"]) < CLEAR_GAP:
                row["class"] = "near tie"
            else:
                # Why: the other run's verdict on each run's winner (a noise gate, min_speedup, ...).
                causes = {_cause(e["notes"].get(f["winner"], "")), _cause(f["notes"].get(e["winner"], ""))} - {""}
                row["class"] = "CLEAR" + (f" ({', '.join(sorted(causes))})" if causes else "")
        else:
            band = max(0.05, 2 * (f["mad"] + e["mad"]))
            off = abs(f["ratio"] / e["ratio"] - 1) > band
            row["class"] = "same, ratio off" if off else "same"
        rows.append(row)
    return rows


def _cause(note: str) -> str:
    """The verdict word of an engine note ("noisy: relative MAD ..." -> "noisy"), "" for a winner or none."""
    word = note.split(":")[0].strip()
    return "" if word in ("", "selected") else word


def _cell(o: dict[str, Any]) -> str:
    if o["winner"] is None:
        return f"(none: {o.get('error')})"[:44]
    gap = "-" if o["gap"] == float("inf") else f"{o['gap'] * 100:.0f}%"
    return f"{o['winner'][:24]} {o['ratio']:.3f} gap {gap}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"workloads {QUICK_POSITIONS} of each operation only")
    parser.add_argument("--details", action="store_true", help="every candidate's verdict where winners differ")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("stability.py needs two CPUs (two workers of one core each)")
    catalog = host_catalog(args.quick)
    quiet = __import__("rich.console").console.Console(file=open(os.devnull, "w"))  # noqa: SIM115
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp) / "redis") as redis:
        directory = Path(tmp)
        env = farm_env({"FARM_PREFIX": "stability"})
        settings = Settings.from_env(env, broker_url=redis.url(0), redis_url=redis.url(1))
        workers = [start_worker(d, redis.url(0), redis.url(1), directory, env, kernels=()) for d in ("cpu:0", "cpu:1")]
        try:
            for w in workers:
                wait_worker_ready(w, redis.client(1), settings.prefix)
            from farm_cli import celery_parts, embedded_parts

            farm_fingerprints = sorted(redis.client(1).hgetall(settings.fingerprints_key))
            on_farm = tune(catalog, dataclasses.replace(celery_parts(settings), observer=ConsoleObserver(quiet)), settings,
                           RunOptions(force=True))
        finally:
            for w in workers:
                w.stop()
        # In-process, in the workers' regime: one core, one thread per pool.
        os.sched_setaffinity(0, {0})
        regime = limit_threads(1)
        digest = runtime_environment(HostClient(0)).digest
        local = Settings.from_env(env)
        parts = embedded_parts(local, ("cpu:0",), directory / "cache", ())
        embedded = tune(catalog, dataclasses.replace(parts, observer=ConsoleObserver(quiet)), local, RunOptions(force=True))

    rows = compare(outcomes(on_farm), outcomes(embedded))
    print(f"stability: {len(rows)} host problems of examples/catalog.toml{' (--quick)' if args.quick else ''}, "
          f"farm (2 workers, 1 core each) vs embedded (pinned to CPU 0, {regime.text()})")
    print(f"fingerprints: farm {', '.join(farm_fingerprints)}; embedded {digest}; "
          f"{'same' if farm_fingerprints == [digest] else 'DIFFERENT'}")
    print(f"wall seconds: farm {on_farm.wall_seconds:.1f}, embedded {embedded.wall_seconds:.1f}")
    print(f"{'problem':<52}{'farm: winner ratio gap':<46}{'embedded: winner ratio gap':<46}class")
    for r in rows:
        print(f"{r['problem'][:51]:<52}{_cell(r['farm']):<46}{_cell(r['embedded']):<46}{r['class']}")
    if args.details:
        for r in rows:
            if r["class"] == "missing" or r["class"].startswith("same"):
                continue
            print(f"\n{r['problem']} ({r['class']})")
            for side in ("farm", "embedded"):
                for name, ratio, mad, verified, note in r[side].get("candidates", []):
                    shown = "-" if ratio is None else f"{ratio:.3f}"
                    print(f"  {side:<9}{name[:28]:<29}{shown:>8} mad {mad or 0:.3f} {'v' if verified else ' '} {note}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["class"]] = counts.get(r["class"], 0) + 1
    print("summary: " + ", ".join(f"{n} {c}" for c, n in sorted(counts.items())))
    print(f"targets: 0 CLEAR (winners differ with a gap >= {CLEAR_GAP:.0%}), 0 'ratio off'; "
          f"machine shared with other jobs: expect noise; host_regime now {host_regime().text()}")


if __name__ == "__main__":
    main()
