"""The farm_triton hit path: per-launch cost of a farm-decided ``@farm_triton.autotune`` kernel over a plain
``@triton.jit`` launch with the same fixed config (target: <= 5 us), and the one-off cost of the first launch of
a key (the farm lookup: cache key, tier read).

Runs in the Triton tier's environment, under Triton's interpreter on the CPU (``TRITON_INTERPRET=1``, set here)
or compiled on a GPU (``--device cuda``). After the first launch of a key the adapter does nothing per launch:
Triton's autotuner caches the config it was given, so the overhead is Triton's own autotuner dispatch (shown
against an ``@triton.autotune`` with a single config). The kernel is one program over 16 elements, so the launch machinery
dominates; launches alternate between the two kernels in batches (load drifts hit both), per-launch figures are
p50 over batches.

    TRITON_INTERPRET=1 .venv-triton/bin/python bench/triton_hit.py [--batches 200] [--batch 20] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def measure(calls: tuple[tuple[str, Any], ...], batches: int, batch: int, sync: Any) -> dict[str, float]:
    """p50 microseconds per call of each named call, over ``batches`` batches of ``batch`` calls; each call runs
    in every position equally often (no order bias)."""
    for _, call in calls:
        for _ in range(5):
            call()
    samples: dict[str, list[float]] = {name: [] for name, _ in calls}
    for k in range(batches):
        shift = k % len(calls)
        for name, call in calls[shift:] + calls[:shift]:
            start = time.perf_counter_ns()
            for _ in range(batch):
                call()
            if sync is not None:
                sync()
            samples[name].append((time.perf_counter_ns() - start) / batch / 1000)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError:
        print("bench/triton_hit.py: skipped: needs torch and triton (python3 tools/dev.py test --triton builds "
              ".venv-triton; run it with .venv-triton/bin/python)")
        return 0

    import farm_triton
    from farm.stores.base import DecisionRecord
    from farm.stores.local import LocalStore
    from farm_triton import identity
    from farm_triton.registry import Kernel

    @triton.jit
    def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)

    configs = [triton.Config({"BLOCK": 32}, num_warps=1), triton.Config({"BLOCK": 16}, num_warps=1)]
    n = 16
    x = torch.rand(n, device=args.device)
    out = torch.empty_like(x)
    with tempfile.TemporaryDirectory() as cache:
        # The farm's decision for this key, as a farm publishes it: config1 (BLOCK 16).
        decisions = farm_triton.configure(cache_directory=Path(cache))
        kernel = Kernel("bench_copy", copy_kernel, tuple(configs), ("n",), tuple(copy_kernel.arg_names))
        problem = decisions.problem(kernel, {"x_ptr": x, "out_ptr": out, "n": n})
        key = decisions.key_of(problem, kernel)
        LocalStore(Path(cache)).put(DecisionRecord(key, 1, 0, identity.candidates(configs)[1].name, True, 0.5, time.time()))

        def no_benchmark(kernel_call, quantiles):
            raise AssertionError("Triton ran a benchmark")

        decided = farm_triton.autotune(configs=configs, key=["n"], name="bench_copy", do_bench=no_benchmark)(copy_kernel)
        first = time.perf_counter_ns()
        decided[(1,)](x, out, n)
        first = time.perf_counter_ns() - first
        assert decided.best_config is configs[1] and decisions.counts["hits"] == 1, "the farm's config was not served"

        single = triton.autotune(configs=[configs[1]], key=["n"])(copy_kernel)  # Triton's own cheapest autotune
        # Triton's own path for a key it settled among several configs (its own pruning chose one, no farm).
        pruned = triton.autotune(configs=configs, key=["n"],
                                 prune_configs_by={"early_config_prune": lambda c, named, **k: [c[1]]})(copy_kernel)
        options = configs[1].all_kwargs()

        def plain() -> None:
            copy_kernel[(1,)](x, out, n, **options)

        def one_config() -> None:
            single[(1,)](x, out, n)

        def settled() -> None:
            pruned[(1,)](x, out, n)

        def hit() -> None:
            decided[(1,)](x, out, n)

        calls = (("plain", plain), ("single", one_config), ("settled", settled), ("hit", hit))
        launched = measure(calls, args.batches, args.batch, torch.cuda.synchronize if args.device == "cuda" else None)
        # The same three paths with the kernel's launch replaced by a no-op: what each adds on the host before
        # the launch, free of the launch's own noise (an interpreted launch is about a millisecond).
        copy_kernel.run = lambda *a, **k: None
        dispatched = measure(calls, args.batches, args.batch * 50, None)
    mode = "interpreter, CPU" if args.device == "cpu" else "compiled, GPU"
    print(f"farm_triton hit path ({mode}; {args.batches} batches of {args.batch} launches, order rotated)")
    for title, p50 in (("with the kernel launched", launched), ("dispatch only (launch stubbed)", dispatched)):
        print(f"  {title}:")
        print(f"    plain @triton.jit launch, fixed config : {p50['plain']:9.2f} us p50")
        print(f"    @triton.autotune with one config      : {p50['single']:9.2f} us p50 (Triton's own autotuner path)")
        print(f"    @triton.autotune, a settled key       : {p50['settled']:9.2f} us p50 (Triton's, several configs)")
        print(f"    farm-decided autotune launch          : {p50['hit']:9.2f} us p50")
        print(f"    added per launch over plain           : {p50['hit'] - p50['plain']:9.2f} us (target <= 5 us)")
        print(f"    of which over Triton's one-config path: {p50['hit'] - p50['single']:9.2f} us")
    print(f"  first launch of the key (farm lookup)   : {first / 1000:9.1f} us, once per key and process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
