"""The chaos soak: a catalog of >= 20,000 trivial problems on two real Celery workers for --minutes, while a seeded
fault injector kills a worker (SIGKILL; restarted), restarts the decisions Redis and the broker (SIGKILL; restarted
on their data) and freezes the coordinator (SIGSTOP, SIGCONT for a few seconds) at random intervals.

Each problem (`farmtest_paced`, tests/farm_testops.py) costs its worker about --pace-ms (by default chosen so the
catalog lasts about --minutes on two workers). The fleet and the injector are tests/chaos.py's, the private servers
tests/servers.py's and tests/faultkit.py's: nothing touches the machine's shared Redis or RabbitMQ.

Report (stdout; --json FILE too): decisions published exactly once (none lost, none duplicated: counted per problem
in the decisions Redis, and every publication in its events stream), the reason of every problem not published,
coordinator and worker RSS at the start, at minute 5 and at the end, throughput per --window seconds (5 minutes)
and every fault with its time. Targets, each printed pass/fail: 0 lost, 0 duplicated, RSS growth from minute 5 to
the end < 10 %, throughput in the last full window >= 0.9x the first.

    .venv/bin/python bench/soak.py                          # 30 minutes, 20,000 problems, Redis broker
    .venv/bin/python bench/soak.py --minutes 10 --json soak.json
    .venv/bin/python bench/soak.py --broker rabbitmq        # the broker is a private RabbitMQ node
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

OVERHEAD_MS = 6  # the farm's own cost per problem and worker (measured: 21 ms per problem at --pace-ms 15, two workers)


def windows(times: list[float], start: float, wall: float, width: float) -> list[tuple[float, float, int, bool]]:
    """(from s, to s, publications, full) per window of ``width`` seconds since ``start``; the last one is not
    full when the run ended inside it."""
    edges = [i * width for i in range(int(wall // width) + 1)]
    if edges[-1] < wall:
        edges.append(wall)
    counts = [0] * max(len(edges) - 1, 1)
    for t in times:
        counts[min(max(int((t - start) // width), 0), len(counts) - 1)] += 1
    return [(lo, hi, n, hi - lo >= width - 1e-6) for lo, hi, n in zip(edges, edges[1:], counts, strict=False)]


def rss_growth(samples: list[list[float]], column: int, at: float) -> tuple[float, float, float]:
    """(kB at ``at`` seconds, kB at the end, growth) of one RSS column of the samples."""
    later = [s for s in samples if s[0] >= at] or samples[-1:]
    base, end = later[0][column], samples[-1][column]
    return base, end, (end - base) / base if base else 0.0


def report(result: dict[str, Any], window: float) -> tuple[list[str], dict[str, bool]]:
    lines = [f"soak: {result['problems']:,} problems, broker {result['broker']}, seed {result['seed']}, pace "
             f"{result['pace_ms']} ms, {result['wall_seconds'] / 60:.1f} min, {len(result['faults'])} faults injected "
             f"({', '.join(f'{k} {n}' for k, n in sorted(count_kinds(result['faults']).items()))})"]
    if not result["finished"]:
        lines.append("  the coordinator had not finished at the deadline (killed)")
    if result["injector_error"]:
        lines.append(f"  the injector stopped: {result['injector_error']}")
    lines.append(f"  decided {result['decided']:,} of {result['problems']:,}; publications {result['publications']:,};"
                 f" lost {result['lost']}, duplicated {result['duplicated']} (coordinator exit "
                 f"{result['coordinator_exit']})")
    for workload, reason in sorted(result["lost_reasons"].items())[:20]:
        lines.append(f"    not published: {workload}: {reason}")
    every = result["rss_samples"]
    # The end of the run is the last sample before its last publication: after it the coordinator only reads the
    # decisions back for its JSON summary (every record once), which is the report's memory, not growth.
    last = max(result["publication_times"], default=result["started_utc"]) - result["started_utc"]
    samples = [s for s in every if s[0] <= last] or every
    at = min(300.0, result["wall_seconds"] / 2)
    growth = {}
    for name, column in (("coordinator", 1), ("workers", 2)):
        base, end, g = rss_growth(samples, column, at) if samples else (0, 0, 0.0)
        first, exit_ = (samples[0][column], every[-1][column]) if samples else (0, 0)
        growth[name] = g
        lines.append(f"  RSS {name:<11}: start {first / 1024:6.1f} MB, at {at / 60:.1f} min {base / 1024:6.1f} MB, end "
                     f"of tuning {end / 1024:6.1f} MB ({g:+.1%} since {at / 60:.1f} min), while writing the summary "
                     f"{exit_ / 1024:6.1f} MB")
    lines.append(f"  (workers: both current worker processes and their pool processes; a killed worker restarts "
                 f"small, so their figure is after {count_kinds(result['faults']).get('worker', 0)} restarts)")
    rates = windows(result["publication_times"], result["started_utc"], result["wall_seconds"], window)
    for lo, hi, n, full in rates:
        lines.append(f"  throughput {lo / 60:5.1f}-{hi / 60:5.1f} min: {n / max(hi - lo, 1e-9):7.2f} decisions/s "
                     f"({n:,}){'' if full else ' (partial window)'}")
    rates_full = [n / (hi - lo) for lo, hi, n, f in rates if f]
    ratio = rates_full[-1] / rates_full[0] if len(rates_full) >= 2 and rates_full[0] else None
    targets = {"0 lost": result["lost"] == 0 and result["finished"],
               "0 duplicated": result["duplicated"] == 0 and not result["unpublished_fields"],
               "RSS growth < 10 % (coordinator)": growth["coordinator"] < 0.10,
               "RSS growth < 10 % (workers)": growth["workers"] < 0.10,
               "last window >= 0.9x first": ratio is not None and ratio >= 0.9}
    lines.append(f"  last full window / first: {'n/a (fewer than 2 full windows)' if ratio is None else f'{ratio:.2f}x'}")
    lines += [f"  target {name}: {'pass' if ok else 'FAIL'}" for name, ok in targets.items()]
    return lines, targets


def count_kinds(faults: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in faults:
        counts[f["kind"]] = counts.get(f["kind"], 0) + 1
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="how long the catalog should last (default 30)")
    ap.add_argument("--problems", type=int, default=20000, help="catalog size (default 20,000)")
    ap.add_argument("--pace-ms", type=int, help="each problem's cost on its worker (default: the catalog lasts "
                    "--minutes on two workers)")
    ap.add_argument("--seed", type=int, default=0, help="the fault injector's seed (default 0)")
    ap.add_argument("--fault-every", type=float, default=60.0, help="mean seconds between faults (default 60)")
    ap.add_argument("--freeze", type=float, default=5.0, help="mean seconds a frozen coordinator stays frozen")
    ap.add_argument("--down", type=float, default=2.0, help="mean seconds a killed server stays down")
    ap.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    ap.add_argument("--window", type=float, default=300.0, help="throughput window in seconds (default 300)")
    ap.add_argument("--json", type=Path, help="write the whole report (faults, samples, tally) here")
    args = ap.parse_args()
    from chaos import run_soak

    pace = args.pace_ms if args.pace_ms is not None else max(0, round(2 * args.minutes * 60_000 / args.problems)
                                                            - OVERHEAD_MS)
    print(f"soak: starting {args.problems:,} problems at {pace} ms each, faults every ~{args.fault_every:g} s "
          f"(seed {args.seed}), broker {args.broker}, {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="farm-soak-") as tmp:
        result = run_soak(Path(tmp), args.problems, pace, args.seed, args.fault_every, args.broker,
                          freeze=args.freeze, down=args.down, timeout=args.minutes * 60 * 3 + 600,
                          log=lambda line: print(line, flush=True))
    lines, targets = report(result, args.window)
    print("\n".join(lines))
    if args.json is not None:
        slim = {k: v for k, v in result.items() if k != "publication_times"}
        partial = args.json.with_name(args.json.name + ".partial")
        partial.write_text(json.dumps({**slim, "targets": targets, "report": lines}, indent=1) + "\n")
        os.replace(partial, args.json)  # atomic: a reader never sees half a report
    sys.exit(0 if all(targets.values()) else 1)


if __name__ == "__main__":
    main()
