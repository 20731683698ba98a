"""Per-call overhead of ``try_execute_stack`` on a memory hit versus calling the chosen candidate directly.

The kernel is trivial (it returns its input), so the difference is the controller's own cost: the workload
signature, the prepared-request lookup, the memory record check and the dispatch. Calls are timed in batches
(the clock's own cost is amortized) and per-call figures are reported as p50/p99 over batches.

    .venv/bin/python bench/hit_path.py [--batches 3000] [--batch 200]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

import farm


def build() -> farm.TunableSet:
    tunable = farm.TunableSet("identity", signature=farm.array_signature)

    @tunable.reference
    def reference(x):
        return x

    @tunable.candidate
    def chosen(x):
        return x

    return tunable


def per_call_ns(call, batches: int, batch: int) -> list[float]:
    samples = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for _ in range(batch):
            call()
        samples.append((time.perf_counter_ns() - start) / batch)
    return samples


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()

    tuner = farm.enable_stack_autotune(farm.StackPolicy(warmups=1, samples=3, budget=5.0))
    client = farm.HostClient(0)
    tunable = build()
    x = np.ones(16, dtype=np.float32)
    farm.try_execute_stack("identity", "cpu", client, tunable, (x,))  # tunes once
    fn = tunable[0].fn
    before = tuner.stats().memory_hits

    def direct():
        return fn(x)

    def stack():
        return farm.try_execute_stack("identity", "cpu", client, tunable, (x,))

    gc.disable()
    per_call_ns(stack, 200, args.batch)  # warm caches
    direct_ns = per_call_ns(direct, args.batches, args.batch)
    stack_ns = per_call_ns(stack, args.batches, args.batch)
    dict_ns = per_call_ns(lambda d={"k": 1}: d.get("k"), args.batches, args.batch)
    gc.enable()
    hits = tuner.stats().memory_hits - before
    assert hits >= args.batches * args.batch, "every timed stack call must be a memory hit"

    rows = [
        ("direct call of the chosen candidate", direct_ns),
        ("try_execute_stack (memory hit)", stack_ns),
        ("dict.get via lambda (reference point)", dict_ns),
    ]
    print(f"hit path, {args.batches} batches x {args.batch} calls, numpy {np.__version__}")
    print(f"{'path':<42}{'p50 ns':>10}{'p99 ns':>10}")
    for name, values in rows:
        print(f"{name:<42}{percentile(values, 0.5):>10.0f}{percentile(values, 0.99):>10.0f}")
    overhead = [s - d for s, d in zip(sorted(stack_ns), sorted(direct_ns), strict=True)]
    p50 = statistics.median(overhead) / 1000
    p99 = percentile(overhead, 0.99) / 1000
    print(f"{'overhead of the controller':<42}{p50 * 1000:>10.0f}{p99 * 1000:>10.0f}")
    print(f"target: overhead p50 <= 5 us -> {'met' if p50 <= 5 else 'MISSED'} ({p50:.2f} us)")


if __name__ == "__main__":
    main()
