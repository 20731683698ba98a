"""An application of the Triton tier, run in its own process: an unmodified ``@triton.autotune`` kernel with the
adapter's ``early_config_prune``, and a Triton benchmark that fails the run if anything calls it.

    python app_add.py POLICY_TOML CACHE_DIR N [--on-miss first] [--report-to URL] [--fleet URL] [--cpu0]

Prints one JSON line: the config Triton ran, whether the output is right, the adapter's hit and miss counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if "--cpu0" in sys.argv:  # as a `farm worker --device cpu:0` runs: pinned first, so every pool is sized for it
    os.sched_setaffinity(0, {0})

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402
from triton_kernels import CONFIGS, NAME, add_kernel, grid  # noqa: E402

import farm_triton  # noqa: E402
from farm_coordinator.catalog import load_catalog  # noqa: E402


def no_benchmark(*args, **kwargs):
    raise AssertionError("Triton ran a benchmark")


Autotuner._bench = no_benchmark  # every config Triton would time goes through _bench, then do_bench
Autotuner.do_bench = property(no_benchmark)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("policy")
    parser.add_argument("cache")
    parser.add_argument("n", type=int)
    parser.add_argument("--on-miss", default=None)
    parser.add_argument("--report-to", default=None)
    parser.add_argument("--cpu0", action="store_true", help="pin to CPU 0, as a cpu:0 worker (its fingerprint)")
    parser.add_argument("--fleet", action="append", default=[], help="a fleet tier (a Redis URL)")
    parser.add_argument("--device", default="cpu", help="where the tensors are (cuda: compiled, not interpreted)")
    args = parser.parse_args()
    policy = load_catalog(args.policy, policy_only=True).policy
    decisions = farm_triton.configure(policy=policy, cache_directory=args.cache, fleet=args.fleet,
                                     report_to=args.report_to)

    kernel = triton.autotune(configs=CONFIGS, key=["n"],
                             prune_configs_by={"early_config_prune": farm_triton.decided(NAME, on_miss=args.on_miss)})(add_kernel)
    x = torch.rand(args.n, device=args.device)
    y = torch.rand(args.n, device=args.device)
    out = torch.empty_like(x)
    kernel[lambda meta: grid(meta, x, y, out, args.n)](x, y, out, args.n)
    if decisions.reporter is not None:
        decisions.reporter.flush(10.0)
    print(json.dumps({"config": str(kernel.best_config), "correct": bool(torch.allclose(out, x + y)),
                      **decisions.counts}))


if __name__ == "__main__":
    main()
