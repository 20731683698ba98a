"""Nearest decisions (issue 27): how good a borrowed winner is on held-out workloads, and how fast lookups are.

1. Quality. The example catalog's host workloads are split per operation: every other one (in catalog order) is
   held out, the rest are tuned into a local cache by the in-process controller. Each held-out workload is then
   tuned exactly too (a memory-only controller), and served from the local cache in CACHE_ONLY mode: the nearest
   decision of its family (validated on the live inputs) or, without one, the reference. The three choices, the
   reference, the nearest winner and the exact winner, are measured side by side (interleaved rounds, fenced
   trials); the table gives each one's median time over the exact winner's. The summary: the mean and worst ratio
   of the reference and of the nearest choice to the exact winner, and how often nearest is slower than the
   reference beyond ``--noise`` (a workload served the reference itself never is).
2. Lookups. ``--decisions`` synthetic decisions (``--families`` families) are published into a fresh local cache
   (and, with ``--redis URL``, into Redis under a private prefix, deleted afterwards); the nearest lookup of random
   unseen workloads is timed (p50, p99) and, for Redis, its round trips counted.
3. The exact-hit path: ``try_execute_stack`` on a memory hit, with ``nearest`` on and off (within noise: nearest
   costs nothing on a hit).

    .venv/bin/python bench/nearest.py [--quick] [--operation matmul] [--redis redis://127.0.0.1:6379/15]
"""

from __future__ import annotations

import argparse
import random
import secrets
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

import farm
from farm.adapter import RuntimeTrials, prepare, stack_request
from farm.identity import CacheKey, Candidate
from farm.nearest import query_of
from farm.policy import AccuracyKey, Mode
from farm.stores.base import DecisionRecord, Publication, PublicationBatch
from farm.stores.local import FARM, LocalStore
from farm_kernels import registry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_host import DEFAULT_CATALOG, workloads  # noqa: E402


def measure_side_by_side(trials: RuntimeTrials, indices: dict[str, int], rounds: int) -> dict[str, float]:
    """Median seconds of each named candidate index, measured in interleaved rounds (order rotating)."""
    times: dict[str, list[float]] = {name: [] for name in indices}
    names = list(indices)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(trials.measure(indices[name]))
    return {name: statistics.median(values) for name, values in times.items()}


def quality(catalog: dict[str, Any], only: list[str], rounds: int, noise: float) -> list[dict[str, Any]]:
    policy = farm.StackPolicy.from_dict(catalog.get("policy", {}))
    client = farm.HostClient(0)
    by_op: dict[str, list[dict[str, Any]]] = {}
    for name, spec in workloads(catalog, "cpu", only):
        by_op.setdefault(name, []).append(spec)
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        trainer = farm.StackTuner(policy, cache_directory=cache)
        exact = farm.StackTuner(policy)
        server = farm.StackTuner(policy.replace(mode=Mode.CACHE_ONLY), cache_directory=cache)
        held: list[tuple[str, dict[str, Any]]] = []
        for name, specs in by_op.items():
            op = registry.get(name)
            for i, spec in enumerate(specs):
                if i % 2:
                    held.append((name, spec))
                    continue
                inputs = op.build(spec, client)
                p = prepare(trainer, name, "cpu", client, op.host, inputs)
                trainer.select_request(p.request, RuntimeTrials(client, op.host, inputs, p.indices, policy.timing))
        for name, spec in held:
            op = registry.get(name)
            inputs = op.build(spec, client)
            problem, cands, order = stack_request(name, "cpu", client, op.host, inputs)
            trials = RuntimeTrials(client, op.host, inputs, order, policy.timing)
            best = exact.select(problem, cands, 0, trials, device=client.device_id)
            served = server.select(problem, cands, 0, trials, device=client.device_id)
            times = measure_side_by_side(trials, {"reference": 0, "nearest": served.index, "exact": best.index},
                                         rounds)
            rows.append({
                "operation": name, "workload": op.label(spec), "source": served.source.value,
                "nearest": served.name, "exact": best.name, "distance": getattr(served, "distance", None),
                "reference/exact": times["reference"] / times["exact"], "nearest/exact": times["nearest"] / times["exact"],
                "slower": served.index != 0 and times["nearest"] > times["reference"] * (1 + noise),
            })
    return rows


def synthetic(n: int, families: int, seed: int = 0) -> tuple[list[Publication], list[str]]:
    """``n`` decisions over ``families`` families (2-d matmul-like shapes) and the fingerprint, plus query keys."""
    rng = random.Random(seed)
    env = "bench-nearest-fingerprint"
    accuracy = AccuracyKey.of(farm.StackPolicy())
    cands = (Candidate("ref"), Candidate("a"), Candidate("b"))
    pubs, queries = [], []
    seen: set[tuple[int, int, int]] = set()
    while len(pubs) < n:
        f, m, k = rng.randrange(families), rng.randrange(1, 1 << 14), rng.randrange(1, 1 << 14)
        if (f, m, k) in seen:
            continue
        seen.add((f, m, k))
        workload = f"numpy:<f4({m}, {k})s({k}, 1);int={f}"
        key = CacheKey("operator", "op", env, workload, "ctx", 0, cands, accuracy).encode()
        pubs.append(Publication(DecisionRecord(key, 1, 0, "a", True, 0.5, time.time()), env))
    for _ in range(1000):
        f, m, k = rng.randrange(families), rng.randrange(1, 1 << 14), rng.randrange(1, 1 << 14)
        queries.append(CacheKey("operator", "op", env, f"numpy:<f4({m}, {k})s({k}, 1);int={f}", "ctx", 0, cands,
                                accuracy).encode())
    return pubs, queries


def percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def lookups(n: int, families: int, redis_url: str | None) -> list[str]:
    pubs, queries = synthetic(n, families)
    out = []
    with tempfile.TemporaryDirectory() as directory:
        store = LocalStore(directory, owner=FARM)
        started = time.monotonic()
        store.publish_batches([PublicationBatch.of(pubs[0].fingerprint, pubs)])
        out.append(f"local: published {n} decisions in {time.monotonic() - started:.1f} s")
        reader = LocalStore(directory)
        found, seconds = 0, []
        for key in queries:
            query = query_of(key)
            assert query is not None
            t = time.perf_counter()
            found += bool(reader.nearest(query, 3.0))
            seconds.append(time.perf_counter() - t)
        p50, p99 = percentiles(seconds)
        out.append(f"local: nearest lookup p50 {p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms ({found}/{len(queries)} found)")
    if redis_url:
        from farm.stores.redis import KeyLayout, RedisDecisions, connect

        prefix = f"bench-nearest-{secrets.token_hex(4)}"
        client = connect(redis_url)
        writer = RedisDecisions(client=client, settings=KeyLayout(prefix=prefix))
        try:
            started = time.monotonic()
            writer.publish_batch(PublicationBatch.of(pubs[0].fingerprint, pubs))
            out.append(f"redis: published {n} decisions in {time.monotonic() - started:.1f} s")
            counted = _Counting(client)
            reader = RedisDecisions(client=counted, settings=KeyLayout(prefix=prefix))
            seconds, trips = [], []
            for key in queries:
                query = query_of(key)
                assert query is not None
                counted.calls = 0
                t = time.perf_counter()
                reader.nearest(query, 3.0)
                seconds.append(time.perf_counter() - t)
                trips.append(counted.calls)
            p50, p99 = percentiles(seconds)
            out.append(f"redis: nearest lookup p50 {p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms, round trips max "
                       f"{max(trips)}")
        finally:
            for key in client.scan_iter(f"{prefix}:*", count=1000):
                client.delete(key)
    return out


class _Counting:
    """A redis-py client counting its commands (one round trip each)."""

    def __init__(self, client: Any) -> None:
        self.client, self.calls = client, 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return attribute(*args, **kwargs)

        return call if callable(attribute) else attribute


def hit_path(calls: int) -> list[str]:
    """ns per memory hit of try_execute_stack with nearest on and off (same process, same set)."""
    out = []
    client = farm.HostClient(0)
    x = np.ones(16, dtype=np.float32)
    for nearest in (True, False):
        ts = farm.TunableSet(f"identity-{nearest}", signature=farm.array_signature)
        ts.add(lambda v: v, name="reference", reference=True, identity="ref")
        ts.add(lambda v: v, name="chosen", identity="chosen")
        tuner = farm.StackTuner(farm.StackPolicy(warmups=1, samples=3, nearest=nearest))
        p = prepare(tuner, ts.name, "cpu", client, ts, (x,))
        trials = RuntimeTrials(client, ts, (x,), p.indices, tuner.policy.timing)
        tuner.select_request(p.request, trials)
        batches = []
        for _ in range(max(1, calls // 100)):
            t = time.perf_counter_ns()
            for _ in range(100):
                tuner.select_request(p.request, trials)
            batches.append((time.perf_counter_ns() - t) / 100)
        p50, p99 = percentiles(batches)
        out.append(f"exact hit (select_request), nearest={nearest}: p50 {p50:.0f} ns, p99 {p99:.0f} ns")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", type=Path, default=DEFAULT_CATALOG)
    parser.add_argument("--operation", action="append", default=[], help="only this operation (repeatable)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one operation, tiny sizes")
    parser.add_argument("--rounds", type=int, default=21, help="interleaved measurement rounds per choice")
    parser.add_argument("--noise", type=float, default=0.05, help="'slower than the reference' beyond this share")
    parser.add_argument("--decisions", type=int, default=1_000_000)
    parser.add_argument("--families", type=int, default=1000)
    parser.add_argument("--redis", default=None, help="a Redis URL for the Redis lookup benchmark")
    args = parser.parse_args(argv)
    catalog = tomllib.loads(args.catalog.read_text(encoding="utf-8"))
    registry.ensure_loaded()
    only, rounds, decisions, families, calls = args.operation, args.rounds, args.decisions, args.families, 200_000
    if args.quick:
        only, rounds, decisions, families, calls = only or ["transpose"], 3, 10_000, 100, 10_000
        catalog = {**catalog, "policy": {**catalog.get("policy", {}), "samples": 3, "budget": 2.0}}
    rows = quality(catalog, only, rounds, args.noise)
    print(f"{'operation':10} {'workload':36} {'served':12} {'distance':>8} {'nearest':18} {'exact':18} "
          f"{'ref/exact':>9} {'near/exact':>10}")
    for r in rows:
        distance = "-" if r["distance"] is None else f"{r['distance']:.2f}"
        print(f"{r['operation']:10} {r['workload'][:36]:36} {r['source']:12} {distance:>8} {r['nearest'][:18]:18} "
              f"{r['exact'][:18]:18} {r['reference/exact']:9.3f} {r['nearest/exact']:10.3f}")
    if rows:
        for what in ("reference/exact", "nearest/exact"):
            values = [r[what] for r in rows]
            print(f"{what}: mean {statistics.fmean(values):.3f}, worst {max(values):.3f}")
        print(f"nearest slower than the reference (beyond {args.noise:.0%}): {sum(r['slower'] for r in rows)} of "
              f"{len(rows)}; served nearest: {sum(r['source'] == 'nearest' for r in rows)}")
    for line in lookups(decisions, families, args.redis):
        print(line)
    for line in hit_path(calls):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
