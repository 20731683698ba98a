"""Replay: the farm's search on real GPU tuning spaces recorded by the auto-tuning community, beside the real
Kernel Tuner on the same files and seeds.

The recordings are brute-forced Kernel Tuner cache files (recordings/benchmark_hub: convolution and dedispersion on
A100, A4000, A6000, MI250X, W6600, W7800; any other given on the command line). The farm tunes each one through
``farm.replay`` (a run's time drawn from the config's recorded samples, seeded); Kernel Tuner replays the same file
in its own simulation mode (bench/kt_peer.py). Per file:

- ``exhaustive``: the farm's exhaustive search (racing, the default screening; ``full`` for one seed beside it):
  pick / recorded optimum, the device seconds it spent against what Kernel Tuner's brute force spent
  benchmarking (32 recorded runs a config), compile seconds (every config built once, recorded).
- ``N configs`` (default 100): the farm's strategies (local, bayes, random) and Kernel Tuner's (random_sample,
  bayes_opt, genetic_algorithm, adaptive_tabu_greywolf: its best at 100 evaluations on these files) over the same
  seeds: median and worst pick / optimum, device (farm) or benchmark (Kernel Tuner) seconds.

Targets (docs/benchmarks.md): exhaustive picks <= 1.01x the optimum on every file with device seconds <= 0.15x
Kernel Tuner's brute force; at 100 configs the farm's median pick no worse than Kernel Tuner's best strategy's and
its worst <= 1.5x; 0 picks slower than the reference or failed.

    .venv/bin/python bench/replay.py [FILE ...] [--seeds 10] [--configs 100] [--quick]

Needs ``pip install kernel-tuner`` (a bench-only dependency, ``tuning-farm[bench]``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kt_peer  # noqa: E402

import farm  # noqa: E402

FARM_STRATEGIES = ("local", "bayes", "random")
KT_STRATEGIES = ("random_sample", "bayes_opt", "genetic_algorithm", "adaptive_tabu_greywolf")


@dataclass(frozen=True)
class Run:
    pick: float  # pick / recorded optimum (inf: nothing valid)
    seconds: float  # device seconds (farm) or benchmark seconds (Kernel Tuner)
    compile_seconds: float
    slower_than_reference: bool = False


def farm_run(rec: farm.replay.Recording, strategy: str, seed: int, configs: int | None,
             screening: str = "race") -> Run:
    client = rec.client(seed=seed)
    policy = farm.StackPolicy(timing=farm.Timing.DEVICE, strategy=strategy, max_configs=configs, seed=seed,
                              screening=screening, budget=1e9)
    tuned = farm.tune(rec.tunable, rec.inputs, device=client, policy=policy)
    picked = rec.mean_ms(tuned.name)
    return Run(picked / rec.best[1], client.device_seconds, client.compile_seconds,
               picked > rec.mean_ms("reference"))


def kt_run(path: Path, strategy: str, seed: int, configs: int | None) -> Run:
    peer = kt_peer.kerneltuner_replay(path, strategy, seed, configs)
    return Run(peer.pick_ms / kt_peer.recorded_optimum(path)[1], peer.benchmark_seconds, peer.compile_seconds)


def summary(runs: list[Run]) -> str:
    picks = [r.pick for r in runs]
    return (f"median {statistics.median(picks):6.3f}  worst {max(picks):6.3f}  "
            f"seconds {statistics.median(r.seconds for r in runs):9.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="Kernel Tuner cache files (default: every vendored one)")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--exhaustive-seeds", type=int, default=3)
    parser.add_argument("--configs", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="3 files, 3 seeds")
    args = parser.parse_args(argv)
    files = args.files or kt_peer.recordings([])
    if args.quick:
        files, args.seeds, args.exhaustive_seeds = files[::4], 3, 1
    seeds = range(args.seeds)
    started = time.monotonic()
    exhaustive: list[tuple[str, float, float]] = []  # file, worst pick, worst device ratio
    by_strategy: dict[str, list[Run]] = {}
    slower = 0
    print(f"replay benchmark: {len(files)} recordings, {args.seeds} seeds, {args.configs} configs")
    for path in files:
        rec = farm.replay.load(path)
        kt_bench, kt_compile = kt_peer.brute_force_cost(path)
        print(f"\n{path.name}: {rec.kernel_name} on {rec.device_name}, {len(rec.configs)} configs, "
              f"optimum {rec.best[1]:.4f} ms, Kernel Tuner brute force {kt_bench:.1f} s benchmark, "
              f"{kt_compile:.0f} s compile")
        races = [farm_run(rec, "exhaustive", seed, None) for seed in range(args.exhaustive_seeds)]
        full = farm_run(rec, "exhaustive", 0, None, screening="full")
        slower += sum(r.slower_than_reference for r in races)
        worst_pick = max(r.pick for r in races)
        worst_ratio = max(r.seconds for r in races) / kt_bench
        exhaustive.append((path.name, worst_pick, worst_ratio))
        print(f"  farm exhaustive race   pick {worst_pick:6.3f} (worst of {len(races)})  device "
              f"{max(r.seconds for r in races):8.2f} s = {worst_ratio:.3f}x Kernel Tuner's  compile "
              f"{races[0].compile_seconds:.0f} s")
        print(f"  farm exhaustive full   pick {full.pick:6.3f}  device {full.seconds:8.2f} s = "
              f"{full.seconds / kt_bench:.3f}x")
        for strategy in FARM_STRATEGIES:
            runs = [farm_run(rec, strategy, seed, args.configs) for seed in seeds]
            slower += sum(r.slower_than_reference for r in runs)
            by_strategy.setdefault(f"farm {strategy}", []).extend(runs)
            print(f"  farm {strategy:<24} {summary(runs)}")
        for strategy in KT_STRATEGIES:
            runs = [kt_run(path, strategy, seed, args.configs) for seed in seeds]
            by_strategy.setdefault(f"kt {strategy}", []).extend(runs)
            print(f"  kt   {strategy:<24} {summary(runs)}")

    print(f"\nsummary over {len(files)} recordings ({time.monotonic() - started:.0f} s)")
    worst_pick = max(w for _, w, _ in exhaustive)
    worst_ratio = max(r for _, _, r in exhaustive)
    print(f"  exhaustive: worst pick {worst_pick:.3f}x the optimum (target <= 1.01), device seconds at most "
          f"{worst_ratio:.3f}x Kernel Tuner's brute force (target <= 0.15)")
    print(f"  {args.configs} configs, pick / optimum over every file and seed:")
    for name, runs in by_strategy.items():
        print(f"    {name:<28} {summary(runs)}")
    farm_best = min((n for n in by_strategy if n.startswith("farm")),
                    key=lambda n: statistics.median(r.pick for r in by_strategy[n]))
    kt_best = min((n for n in by_strategy if n.startswith("kt")),
                  key=lambda n: statistics.median(r.pick for r in by_strategy[n]))
    farm_median = statistics.median(r.pick for r in by_strategy[farm_best])
    kt_median = statistics.median(r.pick for r in by_strategy[kt_best])
    farm_worst = max(r.pick for r in by_strategy[farm_best])
    print(f"  best: {farm_best} median {farm_median:.3f} worst {farm_worst:.3f} against {kt_best} median "
          f"{kt_median:.3f} (targets: median <= Kernel Tuner's best, worst <= 1.5)")
    print(f"  picks slower than the reference: {slower}")
    met = worst_pick <= 1.01 and worst_ratio <= 0.15 and farm_median <= kt_median and farm_worst <= 1.5
    print(f"  targets {'met' if met and not slower else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
