"""Kernel Tuner as a peer: its own simulation mode replaying the recorded GPU tuning spaces
(recordings/benchmark_hub/*.json.gz, Kernel Tuner cache files), so its strategies can be set beside the farm's on
the same recordings.

Kernel Tuner replays a cache file with ``tune_kernel(..., simulation_mode=True, cache=path)``: a config is served
from the file, never run. The file must be a plain ``.json`` (Kernel Tuner appends ``.json`` to any other name and
rewrites a cache it finds unclosed): each replay decompresses the recording into its own temporary folder, never
beside the vendored file. Its search space is the recorded one, failures included: a config whose recording failed
(``RuntimeFailedConfig``, ``CompilationFailedConfig``) is served as the failure and counts as an evaluation, as it
would on the GPU. ``kernel_tuner.tune_cache`` differs there: it restricts the space to the configs that did not
fail, so a strategy never meets a failure (``known_failures=True`` replays that way).

Kernel Tuner's strategies draw from Python's ``random``, from NumPy's global state (``np.random``) and from SciPy's
Latin hypercube sampler (initial samples: unseeded in Kernel Tuner): a replay seeds the three with its seed (and
passes it as ``seed``, which the pymoo strategies read), and restores the global states after. A seed then replays
the same run in any process, but for bayes_opt: its default acquisition (``multi-ultrafast``) refits its model on
a wall-clock rule (when a round of evaluations took 5x the last prediction, else every 6th round), so a busy
machine can change a run now and then; and as a replayed evaluation takes no time, it refits less often than it
would on a GPU, where an evaluation outlasts a prediction.

Costs are the recording's, per unique config evaluated: benchmark seconds are the 32 recorded runs' sum (0 for a
failure), compile seconds the recorded ``compile_time``. A config served twice is charged once, as Kernel Tuner
charges it (its runner serves a revisited config without timings; ``max_fevals`` counts unique configs).

    .venv/bin/python bench/kt_peer.py [FILE ...] [--strategies random_sample,bayes_opt] [--seeds 3] [--fevals 100]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import io
import json
import math
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HUB = Path(__file__).resolve().parent.parent / "recordings" / "benchmark_hub"

# Kernel Tuner's strategies worth comparing at a budget of evaluations (its full list: kernel_tuner.interface
# .strategy_map). brute_force takes no budget; random_sample is the baseline every other one must beat. Left out:
# minimize (a local optimizer from one start: stops after under 10 configs), skopt and pyatf_strategies (packages
# Kernel Tuner does not require), nsga3 (nsga2's many-objective variant).
STRATEGIES = ("brute_force", "random_sample", "bayes_opt", "genetic_algorithm", "simulated_annealing", "diff_evo",
              "greedy_ils", "greedy_mls", "ordered_greedy_mls", "mls", "dual_annealing", "basinhopping",
              "firefly_algorithm", "pso", "hybrid_vndx", "adaptive_tabu_greywolf", "nsga2")

@dataclass(frozen=True)
class PeerRun:
    """One Kernel Tuner replay of a recording: its pick and what the GPU spent, as recorded, to find it."""

    strategy: str  # Kernel Tuner's strategy name
    seed: int
    pick: dict[str, Any]  # the config Kernel Tuner chose (its best valid result): tunable parameters only
    pick_ms: float  # that config's recorded mean time ("time" in the cache), ms; inf when nothing valid was found
    evaluations: int  # unique configs it evaluated, failures included
    benchmark_seconds: float  # sum over evaluated configs of sum(times)/1000 (the 32 runs each), failures 0
    compile_seconds: float  # sum of recorded compile_time/1000 over evaluated configs


@functools.lru_cache(maxsize=2)
def _read(path: str) -> dict[str, Any]:
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        data: dict[str, Any] = json.load(f)
    return data


def load(path: str | Path) -> dict[str, Any]:
    """A recording (a Kernel Tuner cache file, gzipped or not) as its JSON document; the last two read are kept."""
    return _read(str(Path(path).resolve()))


def failed(entry: dict[str, Any]) -> bool:
    """Whether a recorded config failed (its ``time`` is a failure's name, not a number)."""
    return not isinstance(entry.get("time"), int | float) or isinstance(entry["time"], bool)


def config_of(data: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """A recorded entry's tunable parameters, in the recording's order."""
    return {k: entry[k] for k in data["tune_params_keys"]}


def key_of(data: dict[str, Any], config: dict[str, Any]) -> str:
    """The cache key of a config ("16,1,1,..."), as Kernel Tuner writes it."""
    return ",".join(str(config[k]) for k in data["tune_params_keys"])


def cost_of(entry: dict[str, Any]) -> tuple[float, float]:
    """(benchmark seconds, compile seconds) one recorded config cost: its runs' sum (0 for a failure), its compile."""
    bench = 0.0 if failed(entry) else sum(entry.get("times") or ()) / 1000.0
    compile_ms = entry.get("compile_time")
    return bench, (compile_ms if isinstance(compile_ms, int | float) else 0.0) / 1000.0


def brute_force_cost(path: str | Path) -> tuple[float, float]:
    """(benchmark seconds, compile seconds) of every recorded config: what the recording cost the GPU."""
    costs = [cost_of(entry) for entry in load(path)["cache"].values()]
    return sum(b for b, _ in costs), sum(c for _, c in costs)


def recorded_optimum(path: str | Path) -> tuple[dict[str, Any], float]:
    """The best valid recorded config and its recorded mean time (ms)."""
    data = load(path)
    best = min((e for e in data["cache"].values() if not failed(e)), key=lambda e: float(e["time"]))
    return config_of(data, best), float(best["time"])


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Kernel Tuner's randomness seeded with ``seed`` for the block: Python's and NumPy's global state (restored
    after it), and SciPy's Latin hypercube sampler (its own generator, unseeded in Kernel Tuner: the initial
    samples of diff_evo, bayes_opt and other constraint-aware strategies), which every module that took it
    (``kernel_tuner.*``, ``scipy.stats.qmc``) gets seeded for the block."""
    from scipy.stats import qmc

    unseeded = qmc.LatinHypercube
    rng = np.random.default_rng(seed)

    def latin_hypercube(d: int, **options: Any) -> Any:
        options.setdefault("rng", rng)
        return unseeded(d, **options)

    holders = [qmc, *(m for name, m in list(sys.modules.items())
                      if name.startswith("kernel_tuner") and getattr(m, "LatinHypercube", None) is unseeded)]
    py_state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    for module in holders:
        module.LatinHypercube = latin_hypercube
    try:
        yield
    finally:
        for module in holders:
            module.LatinHypercube = unseeded
        random.setstate(py_state)
        np.random.set_state(np_state)


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """Kernel Tuner's prints and its libraries' warnings (scikit-learn's convergence warnings) kept out of sight."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def kerneltuner_replay(path: str | Path, strategy: str, seed: int, max_fevals: int | None, *,
                       options: dict[str, Any] | None = None, known_failures: bool = False) -> PeerRun:
    """Replay a recording with Kernel Tuner's ``strategy`` (simulation mode) and what it chose.

    ``max_fevals``: unique configs at most (failures count), None for no limit (then a strategy stops where it
    stops by itself: brute_force takes every config, random_sample its default 10 % of the space). ``options``:
    more of the strategy's ``strategy_options``. ``known_failures``: the space holds the configs that did not fail
    only, as ``kernel_tuner.tune_cache`` replays.
    """
    import kernel_tuner
    from constraint import FunctionConstraint  # python-constraint2, which Kernel Tuner requires
    from kernel_tuner import util
    from kernel_tuner.interface import strategy_map

    if strategy not in strategy_map:
        raise ValueError(f"unknown Kernel Tuner strategy {strategy!r} (known: {', '.join(strategy_map)})")
    _ = strategy_map[strategy].tune  # imports the strategy now, so _seeded reaches what it imported

    if strategy == "brute_force" and max_fevals is not None:
        raise ValueError("brute_force takes every config: max_fevals must be None")
    source = Path(path)
    data = load(source)
    allowed = {tuple(config_of(data, e).values()) for e in data["cache"].values()
               if not (known_failures and failed(e))}

    def recorded(*values: Any) -> bool:
        return values in allowed

    strategy_options = dict(options or {})
    if max_fevals is not None:
        strategy_options["max_fevals"] = max_fevals
    name = source.name.removesuffix(".gz").removesuffix(".json") + ".json"
    with tempfile.TemporaryDirectory(prefix="kt_peer-") as folder:
        cache = Path(folder) / name
        with gzip.open(source, "rb") if source.name.endswith(".gz") else open(source, "rb") as src, \
                open(cache, "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
        with _seeded(seed), _silenced():
            results, _env = kernel_tuner.tune_kernel(
                **util.infer_args_from_cache(data), restrictions=[FunctionConstraint(recorded)], cache=str(cache),
                simulation_mode=True, strategy=strategy, strategy_options=strategy_options or None, quiet=True,
                seed=seed)

    entries = data["cache"]
    evaluated = {key_of(data, r) for r in results if r and key_of(data, r) in entries}
    valid = [entries[k] for k in evaluated if not failed(entries[k])]
    best = min(valid, key=lambda e: float(e["time"])) if valid else None
    costs = [cost_of(entries[k]) for k in evaluated]
    return PeerRun(strategy=strategy, seed=seed,
                   pick=config_of(data, best) if best else {}, pick_ms=float(best["time"]) if best else math.inf,
                   evaluations=len(evaluated), benchmark_seconds=sum(b for b, _ in costs),
                   compile_seconds=sum(c for _, c in costs))


def recordings(names: Iterable[str] = ()) -> list[Path]:
    """The recordings named (paths, or names in recordings/benchmark_hub with or without .json.gz); all 12 if none."""
    paths = []
    for name in names:
        path = Path(name)
        if not path.exists():
            path = HUB / (name if name.endswith(".json.gz") else name + ".json.gz")
        paths.append(path)
    return paths or sorted(HUB.glob("*.json.gz"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="recordings (default: all 12 in recordings/benchmark_hub)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="Kernel Tuner strategies (comma-separated)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per strategy (brute_force: one; default 3)")
    parser.add_argument("--fevals", type=int, default=100, help="max_fevals of every strategy but brute_force")
    parser.add_argument("--known-failures", action="store_true",
                        help="the space without the failed configs, as kernel_tuner.tune_cache replays")
    args = parser.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    ratios: dict[str, dict[str, list[float]]] = {s: {} for s in strategies}  # strategy -> kernel -> pick/optimum
    print(f"{'recording':<22} {'strategy':<22} {'median':>7} {'worst':>7} {'evals':>6} {'bench s':>8} "
          f"{'compile s':>9} {'s/run':>6}")
    for path in recordings(args.files):
        optimum_ms = recorded_optimum(path)[1]
        bench_all, compile_all = brute_force_cost(path)
        kernel = load(path)["kernel_name"]
        label = path.name.removesuffix(".json.gz")
        print(f"{label:<22} {'(recorded)':<22} {'':>7} {'':>7} {len(load(path)['cache']):>6} {bench_all:>8.1f} "
              f"{compile_all:>9.1f}")
        for strategy in strategies:
            brute = strategy == "brute_force"
            runs, started = [], time.perf_counter()
            for seed in range(1 if brute else args.seeds):
                runs.append(kerneltuner_replay(path, strategy, seed, None if brute else args.fevals,
                                               known_failures=args.known_failures))
            per_run = (time.perf_counter() - started) / len(runs)
            picks = [r.pick_ms / optimum_ms for r in runs]
            ratios[strategy].setdefault(kernel, []).extend(picks)
            print(f"{'':<22} {strategy:<22} {statistics.median(picks):>7.3f} {max(picks):>7.3f} "
                  f"{statistics.median(r.evaluations for r in runs):>6.0f} "
                  f"{statistics.median(r.benchmark_seconds for r in runs):>8.1f} "
                  f"{statistics.median(r.compile_seconds for r in runs):>9.1f} {per_run:>6.2f}")
    kernels = sorted({k for by_kernel in ratios.values() for k in by_kernel})
    print(f"\npick/optimum over every recording and seed, {args.fevals} evaluations (brute_force: every config); "
          "per kernel: median")
    print(f"  {'strategy':<22} {'median':>7} {'geomean':>7} {'worst':>7} {'n':>4} "
          + " ".join(f"{k.removesuffix('_kernel'):>12}" for k in kernels))
    rows = [(s, [v for vs in by_kernel.values() for v in vs], by_kernel) for s, by_kernel in ratios.items()]
    for strategy, values, by_kernel in sorted((r for r in rows if r[1]), key=lambda r: statistics.median(r[1])):
        per_kernel = " ".join(f"{statistics.median(by_kernel[k]):>12.3f}" if k in by_kernel else f"{'':>12}"
                              for k in kernels)
        print(f"  {strategy:<22} {statistics.median(values):>7.3f} {statistics.geometric_mean(values):>7.3f} "
              f"{max(values):>7.3f} {len(values):>4} {per_kernel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
