"""Tuning spaces: each strategy side by side on a known-cost space, on the project's real host spaces, and the
overhead of a space of a million configs, and the farm searching one space with 1 and with 2 workers.

- ``known``: a space of 320 configs (312 feasible) whose cost is a known function of its parameters: one optimum
  (block=128, unroll=4, vector=v4, order=row), a near-optimum far from it (order=col, block=1024, unroll=1), and
  traps that are the fastest of all but give a wrong output (vector=v8 with block=8). Trials are scripted (the
  cost with seeded 2 % noise), so the figures measure the strategies, not the machine. Per strategy: the
  winner's cost relative to the optimum (median and worst over the seeds), evaluations, wrong-output picks,
  tuning seconds.
- ``host``: the builtin host operations' spaces on one workload each, timed for real: exhaustive once (its
  ratios are the cost table), then random and bayes with a smaller budget per seed; the winner's ratio relative
  to exhaustive's best.
- ``million``: random and bayes with 40 evaluations over a 10^6-config space against the same search over a
  40-candidate list (scripted, zero-cost trials): added seconds and added peak memory.

- ``farm``: a private redis-server and real `farm worker` processes (cpu:0, then cpu:0 and cpu:1) searching the
  space ``bench_space`` (bench/bench_ops.py: configs of known cost, busy waits) in rounds with ``random`` and
  ``max_configs=48``: wall seconds of each run, configs evaluated, and the speedup of 2 workers over 1 (a config
  is sent whenever a device is free).
- ``grow``: a space grown by one parameter value. In-process, the known-cost space with block=2048 added: configs
  evaluated and seconds of the incremental search against a full search of the grown space (scripted trials).
  On the embedded farm (`farm tune --cache-dir`, one process), ``bench_space`` tuned exhaustively, then grown by
  tile=13 (bench/bench_grown.py) and tuned again: the incremental run against a full run of the grown space
  (``--force``), configs evaluated and wall seconds of each.

    .venv/bin/python bench/spaces.py [--seeds 10] [--budget 60] [--quick] [--only farm]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import farm
from farm.engine import StackTuner, Validation
from farm.identity import Problem, Scope
from farm.policy import Tolerance
from farm.roster import Roster

KNOWN_OPTIMUM = 0.30


def known_cost(block: int, unroll: int, vector: str, order: str) -> float:
    """The known cost (reference = 1.0): a bowl around the optimum in log2 space, plus a far near-optimum."""
    if order == "col" and block == 1024 and unroll == 1:
        return KNOWN_OPTIMUM * 1.04
    if vector == "v8" and block == 8:
        return 0.05  # a trap: the fastest config, with a wrong output
    lanes = {"scalar": 1.0, "v2": 0.35, "v4": 0.0, "v8": 0.15}[vector]
    bowl = 0.08 * (math.log2(block) - 7) ** 2 + 0.1 * (math.log2(unroll) - 2) ** 2
    return KNOWN_OPTIMUM * (1.0 + bowl + lanes + (0.12 if order == "col" else 0.0))


KNOWN_BLOCKS = (8, 16, 32, 64, 128, 256, 512, 1024)


def known_set(blocks: tuple[int, ...] = KNOWN_BLOCKS) -> farm.TunableSet:
    ts = farm.TunableSet("known", signature=farm.array_signature)
    ts.add(lambda x: x, name="reference", reference=True)
    ts.space(name="kernel", block=list(blocks), unroll=[1, 2, 4, 8, 16],
             vector=["scalar", "v2", "v4", "v8"], order=["row", "col"],
             restrict="block * unroll <= 8192")(lambda x, **config: x)
    return ts


class Scripted:
    """A TrialRunner whose config costs come from ``cost`` (noise: seeded, multiplicative); traps fail validation."""

    def __init__(self, roster: Roster, cost: Callable[..., float], seed: int, noise: float = 0.02,
                 wrong: Callable[[dict[str, Any]], bool] = lambda c: False) -> None:
        self.roster, self.cost, self.noise, self.wrong = roster, cost, noise, wrong
        self.rng = random.Random(seed)

    def validate(self, reference: int, candidate: int, tolerance: Tolerance) -> Validation:
        config = self.roster.config(candidate)
        if config is not None and self.wrong(config):
            raise farm.TuneFailure.rejected("wrong output")
        return Validation.PASSED

    def measure(self, candidate: int) -> float:
        config = self.roster.config(candidate)
        base = 1.0 if config is None else self.cost(**config)
        return base * 1e-3 * (1.0 + self.rng.gauss(0.0, self.noise))


def run_known(seeds: int, evaluations: int) -> None:
    ts = known_set()
    roster = ts.roster()
    base = farm.StackPolicy(warmups=1, samples=3, min_speedup=1.0, budget=600.0)
    print(f"known-cost space: {sum(s.size for s in roster.spaces())} configs, optimum {KNOWN_OPTIMUM}; "
          f"{evaluations} evaluations for random and bayes, {seeds} seeds")
    print(f"{'strategy':<11} {'median rel':>10} {'worst rel':>10} {'evaluated':>10} {'wrong picks':>11} {'seconds':>8}")
    for strategy in ("exhaustive", "random", "bayes"):
        rel, evaluated, wrong, seconds = [], [], 0, []
        for seed in range(1 if strategy == "exhaustive" else seeds):
            policy = base.replace(strategy=strategy, seed=seed,
                                  max_configs=None if strategy == "exhaustive" else evaluations)
            tuner = StackTuner(policy)
            runner = Scripted(roster, known_cost, seed, wrong=lambda c: c["vector"] == "v8" and c["block"] == 8)
            started = time.perf_counter()
            decision = tuner.select(Problem(Scope.OPERATOR, "known", "bench", "w"), roster, 0, runner)
            seconds.append(time.perf_counter() - started)
            report = tuner.reports()[-1]
            config = roster.config(decision.index)
            cost = 1.0 if config is None else known_cost(**config)  # type: ignore[arg-type]
            wrong += config is not None and config["vector"] == "v8" and config["block"] == 8
            rel.append(cost / KNOWN_OPTIMUM)
            evaluated.append(report.evaluated)
        print(f"{strategy:<11} {statistics.median(rel):>10.3f} {max(rel):>10.3f} {statistics.median(evaluated):>10.0f} "
              f"{wrong:>11} {statistics.median(seconds):>8.2f}")


HOST_SPECS: dict[str, dict[str, Any]] = {
    "matmul": dict(m=512, n=96, k=256, dtype="float32"),
    "transpose": dict(rows=1024, cols=768, dtype="float64"),
    "reduce_sum": dict(rows=4096, cols=64, axis=0, dtype="float32"),
    "softmax": dict(rows=512, cols=1024, dtype="float32"),
    "bias_gelu_fusion": dict(rows=256, cols=2048, dtype="float32"),
}


def run_host(seeds: int, evaluations: int, names: list[str]) -> None:
    from farm_kernels import registry

    registry.ensure_loaded()
    client = farm.HostClient(0)
    print(f"\nreal host spaces: exhaustive once, then random and bayes with {evaluations} configs, {seeds} seeds")
    print(f"{'operation':<17} {'strategy':<11} {'median rel':>10} {'evaluated':>10} {'of':>5} {'seconds':>8}")
    for name in names:
        op = registry.get(name)
        inputs = op.build(HOST_SPECS[name], client)
        base = farm.StackPolicy(warmups=1, samples=3, min_speedup=1.0, max_relative_mad=1.0, budget=300.0)
        started = time.perf_counter()
        full = farm.tune(op.host, inputs, device=client, policy=base)
        assert full.report is not None
        ratios = {c.name: c.ratio for c in full.report.candidates if c.ratio is not None}
        best = min(ratios.values())
        print(f"{name:<17} {'exhaustive':<11} {ratios.get(full.name, 1.0) / best:>10.3f} {full.report.evaluated:>10} "
              f"{full.report.space_size:>5} {time.perf_counter() - started:>8.2f}")
        for strategy in ("random", "bayes"):
            rel, seconds, evaluated = [], [], []
            for seed in range(seeds):
                started = time.perf_counter()
                tuned = farm.tune(op.host, inputs, device=client,
                                  policy=base.replace(strategy=strategy, seed=seed, max_configs=evaluations))
                seconds.append(time.perf_counter() - started)
                rel.append(ratios.get(tuned.name, 1.0) / best)  # the exhaustive run's ratio is the cost table
                evaluated.append(tuned.report.evaluated if tuned.report is not None else 0)
            print(f"{name:<17} {strategy:<11} {statistics.median(rel):>10.3f} {statistics.median(evaluated):>10.0f} "
                  f"{full.report.space_size:>5} {statistics.median(seconds):>8.2f}")


def run_million(evaluations: int) -> None:
    values = list(range(100))
    big = farm.TunableSet("million", signature=farm.array_signature)
    big.add(lambda x: x, name="reference", reference=True)
    big.space(name="cfg", a=values, b=values, c=values)(lambda x, **config: x)
    listed = farm.TunableSet("listed", signature=farm.array_signature)
    listed.add(lambda x: x, name="reference", reference=True)
    listed.space(name="cfg", a=list(range(evaluations)))(lambda x, **config: x)

    def cost(**config: Any) -> float:
        return 0.5 + (sum(config.values()) % 97) / 200

    print(f"\nspace overhead: {evaluations} evaluations over 10^6 configs vs a {evaluations}-config list")
    print(f"{'strategy':<9} {'list s':>8} {'space s':>8} {'added s':>8} {'list MB':>8} {'space MB':>9} {'added MB':>9}")
    for strategy in ("random", "bayes"):
        row = []
        for ts in (listed, big):
            policy = farm.StackPolicy(warmups=1, samples=3, min_speedup=1.0, budget=600.0, strategy=strategy,
                                      max_configs=evaluations, seed=0)
            roster = ts.roster()
            tracemalloc.start()
            started = time.perf_counter()
            StackTuner(policy).select(Problem(Scope.OPERATOR, ts.name, "bench", "w"), roster, 0,
                                      Scripted(roster, cost, 0, noise=0.0))
            row.append((time.perf_counter() - started, tracemalloc.get_traced_memory()[1] / 2**20))
            tracemalloc.stop()
        (ls, lm), (ss, sm) = row
        print(f"{strategy:<9} {ls:>8.2f} {ss:>8.2f} {ss - ls:>8.2f} {lm:>8.1f} {sm:>9.1f} {sm - lm:>9.1f}")


def run_farm(max_configs: int) -> None:
    import os
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(root / "tests"), str(root / "bench")]
    from servers import farm_env, redis_server, start_worker, wait_worker_ready

    from farm_coordinator.catalog import load_catalog
    from farm_coordinator.run import tune
    from farm_coordinator.runview import ConsoleObserver
    from farm_fleet.settings import Settings

    print(f"\nfarm: bench_space (96 configs, bench/bench_ops.py: 10-16 ms each against a 20 ms reference), random, "
          f"max_configs={max_configs}, one private redis-server")
    walls: dict[int, float] = {}
    for workers in (1, 2):
        with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp) / "redis") as redis:
            directory = Path(tmp)
            env = farm_env({"FARM_PREFIX": f"bench{workers}",
                            "PYTHONPATH": os.pathsep.join([str(root / "bench"), farm_env()["PYTHONPATH"]])})
            settings = Settings.from_env(env, broker_url=redis.url(0), redis_url=redis.url(1))
            catalog = directory / "space.toml"
            catalog.write_text(f'[policy]\nsamples = 5\nwarmups = 1\nbudget = 600.0\nmax_relative_mad = 1.0\n'
                               f'strategy = "random"\nmax_configs = {max_configs}\nseed = 0\n\n[[problems]]\n'
                               f'operation = "bench_space"\nworkloads = [{{ n = 64, dtype = "float64" }}]\n')
            started = [start_worker(f"cpu:{i}", redis.url(0), redis.url(1), directory, env, kernels=("bench_ops",))
                       for i in range(workers)]
            try:
                for worker in started:
                    wait_worker_ready(worker, redis.client(1), settings.prefix)
                from farm_cli import celery_parts

                quiet = __import__("rich.console").console.Console(file=open(os.devnull, "w"))  # noqa: SIM115
                parts = replace(celery_parts(settings), observer=ConsoleObserver(quiet))
                summary = tune(load_catalog(catalog, ("bench_ops",)), parts, settings)
            finally:
                for worker in started:
                    worker.stop()
        agg = summary.aggregates[0]
        spaced = sum(1 for g in agg.results if g.startswith("s"))
        walls[workers] = summary.wall_seconds
        print(f"  {workers} worker(s): {summary.wall_seconds:6.2f} s wall, {spaced} configs evaluated, "
              f"winner {agg.winner}")
    speedup = walls[1] / walls[2]
    print(f"  2 workers / 1 worker speedup: {speedup:.2f}x (target >= 1.8x: {'met' if speedup >= 1.8 else 'not met'})")


def run_grow() -> None:
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    policy = farm.StackPolicy(warmups=1, samples=3, min_speedup=1.0, budget=600.0)
    problem = Problem(Scope.OPERATOR, "known", "bench", "w")
    wrong = lambda c: c["vector"] == "v8" and c["block"] == 8  # noqa: E731
    print("\ngrow: the known-cost space grown by block=2048 (24 feasible configs more), scripted trials")
    rows = []
    for label, tuner_first in (("full search of the grown space", False), ("incremental", True)):
        tuner = StackTuner(policy)
        if tuner_first:
            old = known_set().roster()
            tuner.select(problem, old, 0, Scripted(old, known_cost, 0, wrong=wrong))
        roster = known_set((*KNOWN_BLOCKS, 2048)).roster()
        started = time.perf_counter()
        decision = tuner.select(problem, roster, 0, Scripted(roster, known_cost, 0, wrong=wrong))
        seconds = time.perf_counter() - started
        report = tuner.reports()[-1]
        rows.append((label, report.evaluated, seconds, roster[decision.index].name, report.incremental))
    for label, evaluated, seconds, winner, incremental in rows:
        print(f"  {label:<32} {evaluated:>4} configs evaluated {seconds:7.3f} s  incremental={incremental}  "
              f"winner {winner}")

    root = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(root / "tests")]
    from servers import farm_env

    from farm.stores.base import DecisionRecord
    from farm.stores.local import LocalStore

    env = farm_env({"PYTHONPATH": os.pathsep.join([str(root / "bench"), farm_env()["PYTHONPATH"]])})
    print("grow on the embedded farm: bench_space (96 configs, 10-16 ms each) tuned exhaustively (max_candidates 128), grown by tile=13 "
          "(8 configs more), tuned again")
    with tempfile.TemporaryDirectory() as tmp:
        catalog = Path(tmp) / "space.toml"
        catalog.write_text('[policy]\nsamples = 5\nwarmups = 1\nbudget = 600.0\nmax_relative_mad = 1.0\n'
                           'max_candidates = 128\n\n[[problems]]\noperation = "bench_space"\nworkloads = [{ n = 64, dtype = "float64" }]\n')
        cache = Path(tmp) / "cache"

        def tune(kernels: str, *extra: str) -> tuple[float, DecisionRecord]:
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(catalog), "--cache-dir", str(cache),
                                   "--kernels", kernels, *extra], capture_output=True, text=True, env=env, cwd=tmp)
            seconds = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(done.stdout + done.stderr)
            found = [DecisionRecord.from_json(t) for batch in LocalStore(cache).scan() for t, _, _ in batch]
            latest = max((r for r in found if "[*]" not in r.cache_key), key=lambda r: r.created)
            return seconds, latest

        first, _ = tune("bench_ops")
        incremental, grown = tune("bench_grown")
        full, forced = tune("bench_grown", "--force")
    print(f"  first search (96 configs):        {first:6.2f} s wall")
    print(f"  full search of the grown space:   {full:6.2f} s wall, {forced.meta['evaluated']} configs evaluated")
    print(f"  incremental search:               {incremental:6.2f} s wall, {grown.meta['evaluated']} configs evaluated "
          f"(incremental={grown.meta['incremental']}), winner {grown.name}")
    met = grown.meta["evaluated"] == 8 and rows[1][1] == 24
    print(f"  only the new configs re-evaluated: {'met' if met else 'not met'}; the incremental run takes "
          f"{incremental / full:.2f}x the full run's wall time")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds per sampling strategy (default 10)")
    parser.add_argument("--evaluations", type=int, default=60, help="max_configs of random and bayes (default 60)")
    parser.add_argument("--host", default=",".join(HOST_SPECS), help="host operations to search (comma-separated)")
    parser.add_argument("--quick", action="store_true", help="3 seeds, 20 evaluations, one host operation")
    parser.add_argument("--only", choices=("known", "host", "million", "farm", "grow"), help="run one part only")
    args = parser.parse_args(argv)
    seeds, evaluations = (3, 20) if args.quick else (args.seeds, args.evaluations)
    names = ["reduce_sum"] if args.quick else [n for n in args.host.split(",") if n]
    parts: dict[str, Callable[[], None]] = {
        "known": lambda: run_known(seeds, evaluations),
        "host": lambda: run_host(max(1, seeds // 3), max(3, evaluations // 6), names),
        "million": lambda: run_million(40),
        "farm": lambda: run_farm(8 if args.quick else 48),
        "grow": run_grow,
    }
    for name, part in parts.items():
        if args.only in (None, name):
            part()
    return 0


if __name__ == "__main__":
    sys.exit(main())
