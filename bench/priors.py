"""Priors: a new GPU model tuned with the decisions of the other SKUs, against the same search without them.

On the vendored recordings (recordings/benchmark_hub: convolution and dedispersion on A100, A4000, A6000 (NVIDIA),
MI250X, W6600, W7800 (AMD)), each SKU's own decision is an exhaustive race on it (seed 0); its prior is what a
decision record keeps (its best ``farm.priors.RANKED`` configs with their ratios). Each target SKU is then tuned
through ``farm.replay`` with priors from:

- ``none``: no prior (today's search);
- ``all``: the other five SKUs;
- ``same``: the other SKUs of its vendor (a helpful prior);
- ``other``: every SKU of the other vendor (a misleading one).

Per search: pick / recorded optimum, device seconds, and (exhaustive) the anytime share: the device seconds spent
when the best config measured so far first came within 1 % of the optimum, over the search's device seconds.
Searches: exhaustive (racing), and ``local`` with 20 and 100 configs, over the seeds. A source -> target table
gives the pick / optimum on the target when only the source's top-10 configs are tried.

Targets (issue 36): same-vendor prior, 20 configs: median pick <= 1.02; misleading prior: exhaustive device
seconds <= 1.1x the search without priors, 100 configs: median pick within 5 % of it; helpful prior, exhaustive:
within 1 % of the optimum in <= 10 % of its device seconds.

    .venv/bin/python bench/priors.py [--seeds 10] [--exhaustive-seeds 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import farm
from farm.priors import RANKED, Source, source

HUB = Path(__file__).resolve().parent.parent / "recordings" / "benchmark_hub"
VENDOR = {"A100": "nvidia", "A4000": "nvidia", "A6000": "nvidia", "MI250X": "amd", "W6600": "amd", "W7800": "amd"}
MODES = ("none", "all", "same", "other")
SEARCHES = (("exhaustive", None), ("local", 20), ("local", 100))


@dataclass(frozen=True)
class Run:
    pick: float  # pick / recorded optimum
    seconds: float  # device seconds
    anytime: float  # share of the device seconds spent when the best measured came within 1 % of the optimum


def tuned(rec: farm.replay.Recording, strategy: str, configs: int | None, seed: int,
          priors: list[Source]) -> Run:
    client = rec.client(seed=seed)
    optimum = rec.best[1] / 1e3
    reached: list[float] = []
    run = client.run

    def traced(key: tuple[object, ...]) -> float:  # the device seconds when a config within 1 % first ran
        seconds = run(key)
        recorded = rec.configs.get(key)
        if not reached and recorded is not None and recorded.failure is None and recorded.mean <= optimum * 1.01:
            reached.append(client.device_seconds)
        return seconds

    client.run = traced  # type: ignore[method-assign]
    policy = farm.StackPolicy(timing=farm.Timing.DEVICE, strategy=strategy, max_configs=configs, seed=seed,
                              budget=1e9)
    result = farm.tune(rec.tunable, rec.inputs, device=client, policy=policy, priors=priors)
    total = client.device_seconds
    return Run(rec.mean_ms(result.name) / rec.best[1], total, (reached[0] / total) if reached else 1.0)


def line(runs: list[Run]) -> str:
    picks = [r.pick for r in runs]
    return (f"pick median {statistics.median(picks):6.3f} worst {max(picks):6.3f}  device s "
            f"{statistics.median(r.seconds for r in runs):9.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--exhaustive-seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="3 seeds (1 exhaustive), 2 targets per kernel")
    args = parser.parse_args(argv)
    started = time.monotonic()
    targets_per_kernel = 2 if args.quick else 6
    if args.quick:
        args.seeds, args.exhaustive_seeds = 3, 1
    # mode -> search -> runs, over every target and seed; and the exhaustive runs' (none, mode) pairs per seed
    results: dict[tuple[str, str], list[Run]] = {}
    paired: dict[str, list[tuple[Run, Run]]] = {}
    helpful: list[Run] = []  # exhaustive searches with a same-vendor prior whose top 10 hold a config within 1 %
    for kernel in ("convolution", "dedispersion"):
        recs = {sku: farm.replay.load(HUB / f"{kernel}_{sku}.json.gz") for sku in VENDOR}
        own = {sku: source(tuned_source(rec), limit=RANKED) for sku, rec in recs.items()}
        print(f"\n{kernel}: source -> target, pick / optimum with only the source's top-10 configs")
        print("  " + " " * 8 + "".join(f"{t:>9}" for t in VENDOR))
        useful: dict[tuple[str, str], float] = {}
        for sku in VENDOR:
            for target, rec in recs.items():
                known = names_of(rec)
                tried = [rec.mean_ms(n) for n, _ in own[sku].ranking[:10] if n in known]
                useful[sku, target] = min(tried) / rec.best[1] if tried else float("inf")
            print(f"  {sku:<8}" + "".join(f"{useful[sku, t]:9.3f}" for t in VENDOR))
        for target in list(VENDOR)[1:1 + targets_per_kernel] if args.quick else VENDOR:
            rec = recs[target]
            sources = {"none": [], "all": [own[s] for s in VENDOR if s != target],
                       "same": [own[s] for s in VENDOR if s != target and VENDOR[s] == VENDOR[target]],
                       "other": [own[s] for s in VENDOR if VENDOR[s] != VENDOR[target]]}
            print(f"\n{kernel} on {target} ({rec.device_name}), optimum {rec.best[1]:.4f} ms")
            for strategy, configs in SEARCHES:
                label = f"{strategy} {configs or ''}".strip()
                seeds = range(args.exhaustive_seeds if configs is None else args.seeds)
                base: list[Run] = []
                for mode in MODES:
                    runs = [tuned(rec, strategy, configs, seed, sources[mode]) for seed in seeds]
                    base = runs if mode == "none" else base
                    results.setdefault((mode, label), []).extend(runs)
                    if configs is None and mode != "none":
                        paired.setdefault(mode, []).extend(zip(base, runs, strict=True))
                    if configs is None and mode == "same" and min(useful[s, target] for s in VENDOR if s != target
                                                                  and VENDOR[s] == VENDOR[target]) <= 1.01:
                        helpful.extend(runs)
                    anytime = f"  anytime {statistics.median(r.anytime for r in runs):.3f}" if configs is None else ""
                    print(f"  {label:<14} {mode:<6} {line(runs)}{anytime}")

    print(f"\nsummary, every target and seed ({time.monotonic() - started:.0f} s)")
    for (mode, label), runs in sorted(results.items(), key=lambda kv: (kv[0][1], MODES.index(kv[0][0]))):
        print(f"  {label:<14} {mode:<6} {line(runs)}")
    same20 = statistics.median(r.pick for r in results[("same", "local 20")])
    none20 = statistics.median(r.pick for r in results[("none", "local 20")])
    print(f"  same-vendor prior, 20 configs: median pick {same20:.3f} (without {none20:.3f}; target <= 1.02)")
    cost = max(p.seconds / b.seconds for b, p in paired["other"])
    print(f"  misleading prior, exhaustive: device seconds at most {cost:.3f}x without priors (target <= 1.1), "
          f"worst pick {max(p.pick for _, p in paired['other']):.3f}")
    other100 = statistics.median(r.pick for r in results[("other", "local 100")])
    none100 = statistics.median(r.pick for r in results[("none", "local 100")])
    print(f"  misleading prior, 100 configs: median pick {other100:.3f} against {none100:.3f} without "
          f"(target within 5 %)")
    early = max((r.anytime for r in helpful), default=1.0)
    unhelped = statistics.median(r.anytime for r in results[("none", "exhaustive")])
    print(f"  helpful prior (a same-vendor source's top 10 within 1 %: {len(helpful)} searches), exhaustive: a "
          f"config within 1 % of the optimum measured after at most {early:.3f} of its device seconds "
          f"(target <= 0.10; without priors median {unhelped:.3f})")
    worst = max(p.pick for _, p in paired["same"])
    print(f"  exhaustive picks with a prior: worst {max(worst, max(p.pick for _, p in paired['all'])):.3f} "
          f"(without priors {max(b.pick for b, _ in paired['same']):.3f})")
    met = same20 <= 1.02 and cost <= 1.1 and other100 <= none100 * 1.05 and early <= 0.10
    print(f"  targets {'met' if met else 'NOT met'}")
    return 0


def tuned_source(rec: farm.replay.Recording) -> farm.Tuned:
    """A SKU's own decision: an exhaustive race on it, seed 0."""
    policy = farm.StackPolicy(timing=farm.Timing.DEVICE, strategy="exhaustive", seed=0, budget=1e9)
    return farm.tune(rec.tunable, rec.inputs, device=rec.client(seed=0), policy=policy)


def names_of(rec: farm.replay.Recording) -> set[str]:
    return set(rec.tunable.roster().names)


if __name__ == "__main__":
    raise SystemExit(main())
