"""Fleet budget: pre-tune a catalog of recorded GPU problems within a budget of device seconds, spending it with
the coordinator's allocator (``farm_coordinator.budget``), against a uniform allocation and catalog order.

The catalog: the vendored recordings (recordings/benchmark_hub: convolution and dedispersion on six GPUs) x
``--workloads`` workloads each (default 4: 48 problems), each workload its own search seed and its own calls per
hour, drawn from a seeded log-normal (median 1,000, sigma 2: a long tail). A problem's weight is the fleet time it
is worth (``farm_coordinator.weights``): calls per hour x the reference's recorded mean seconds per call; its
saving ``weight x (1 - ratio)``; the achievable saving uses the recording's true optimum.

**How the searches run.** Each problem's search is the farm's in-process race (``farm.racing.Race``, the default
``screening = "race"``) over a ``random`` strategy of the whole space on the recording's replay device, driven
one evaluation at a time: the reference's round, then one config per step. A search's k-th step does not depend on
when it is taken (its own seed, its own replay device), so each search is driven once to its end and its trace
kept (per step: device seconds, the race's estimated ratio of its incumbent, the incumbent); the three ways of
spending a budget are then played over these traces, each problem advanced step by step:

- ``allocator``: ``farm_coordinator.budget.Allocator``, told every step's device seconds and estimated ratio (what
  the coordinator tells it from each group result), picks the problem of each next step;
- ``uniform``: every problem gets the same device seconds (the next step goes to the search that spent the
  least; one that ends early leaves its share to the others);
- ``catalog order``: each problem's whole search in catalog order, as a run stopped by its budget gets today.

Each problem touched then pays its race winner's final verdict against the reference (``farm.trials.
candidate_trials`` on its own replay device, measured), and its saving counts the winner's true recorded ratio
when that clears ``min_speedup`` (the reference is kept otherwise). Budgets are shares of what the exhaustive run
of the whole catalog costs (every search to its end plus its final verdict); each row reports the device seconds
each way really spent (a step in progress may pass the budget by one step).

Targets (issue 37): at 20 % of the exhaustive device seconds >= 90 % of the achievable weighted saving; at equal
device seconds >= 1.5x the weighted saving of a uniform allocation (checked at the issue's budgets below 100 %: 5-50 %).

    .venv/bin/python bench/fleet_budget.py [--workloads 4] [--seed 0] [--traces FILE] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import farm
from farm.adapter import RuntimeTrials, stack_request
from farm.racing import Race
from farm.strategies import make_sampler
from farm.trials import candidate_trials, reference_trials
from farm_coordinator.budget import Allocator

HUB = Path(__file__).resolve().parent.parent / "recordings" / "benchmark_hub"
BUDGETS = (0.005, 0.01, 0.02, 0.05, 0.10, 0.20, 0.50, 1.00)  # shares of the exhaustive run; the issue's: >= 5 %
ISSUE_RANGE = 0.05


@dataclass
class Trace:
    """One problem's search driven to its end: per step (device seconds, estimated ratio, true ratio of the
    incumbent); ``finals``: the final verdict's device seconds per incumbent (measured once each)."""

    name: str
    calls: float  # per hour
    reference_seconds: float  # the reference's recorded mean seconds per call
    best_gain: float  # 1 - optimum / reference (the achievable ratio gain)
    configs: int
    steps: list[tuple[float, float, float]] = field(default_factory=list)
    finals: dict[float, float] = field(default_factory=dict)  # true ratio of the winner -> its final's seconds

    @property
    def value(self) -> float:
        return self.calls * self.reference_seconds

    @property
    def cost(self) -> float:
        return sum(s for s, _, _ in self.steps) + self.final_cost(len(self.steps))

    def final_cost(self, taken: int) -> float:
        return self.finals.get(self.steps[taken - 1][2], 0.0) if taken else 0.0

    def saving(self, taken: int, min_speedup: float) -> float:
        """Fleet seconds per hour saved after ``taken`` steps: the incumbent's true ratio if it clears the line."""
        ratio = self.steps[taken - 1][2] if taken else 1.0
        return self.value * (1.0 - ratio) if ratio * min_speedup <= 1.0 else 0.0


def traced(path: Path, seed: int, calls: float, policy: farm.StackPolicy) -> Trace:
    """Drive the in-process race of one recording, one evaluation at a time, and keep its trace."""
    rec = farm.replay.load(path)
    client = rec.client(seed=seed)
    args = rec.inputs if isinstance(rec.inputs, tuple) else (rec.inputs,)
    _, roster, order = stack_request(rec.tunable.name, client.device_id, client, rec.tunable, args)
    runner = RuntimeTrials(client, rec.tunable, args, order, policy.timing)
    names = roster.names
    reference_ms = rec.mean_ms(names[0])
    trace = Trace(f"{path.name.split('.')[0]}#{seed}", calls, reference_ms / 1e3,
                  max(0.0, 1.0 - rec.best[1] / reference_ms), len(rec.configs))
    times = reference_trials(runner, policy, 0, names[0])
    trace.steps.append((client.device_seconds, 1.0, 1.0))
    race = Race(runner, policy, 0, names, times, math.inf, clock=lambda: 0.0)
    sampler = make_sampler(roster, policy)
    judge_client = rec.client(seed=seed + 1000, index=1)  # the final verdicts, on their own device
    judge_runner = RuntimeTrials(judge_client, rec.tunable, args, order, policy.timing)
    while asked := sampler.ask(1):
        before = client.device_seconds
        sampler.tell([(asked[0], race.enter(asked[0], roster[asked[0]].revision))])
        incumbent = race.incumbent
        true_ratio = rec.mean_ms(names[incumbent]) / reference_ms
        trace.steps.append((client.device_seconds - before, race.estimates.get(incumbent) or 1.0, true_ratio))
        if incumbent != 0 and true_ratio not in trace.finals:
            spent = judge_client.device_seconds
            candidate_trials(judge_runner, policy, 0, incumbent, names, math.inf)
            trace.finals[true_ratio] = judge_client.device_seconds - spent
    return trace


def allocated(traces: list[Trace], budget: float) -> list[int]:
    """Steps per problem when the coordinator's allocator spends ``budget``."""
    allocator = Allocator()
    taken = [0] * len(traces)
    for i, t in enumerate(traces):
        allocator.add(str(i), t.value)  # the fleet time it is worth per hour at the reference
    spent = 0.0
    open_ = {str(i) for i in range(len(traces))}
    while spent < budget and open_:
        key = allocator.next(open_)
        if key is None:
            break
        i = int(key)
        seconds, estimate, _ = traces[i].steps[taken[i]]
        taken[i] += 1
        spent += seconds
        done = taken[i] >= len(traces[i].steps)
        allocator.observe(key, seconds, reference_seconds=traces[i].reference_seconds if taken[i] == 1 else None,
                          ratio=estimate, left=1.0 - (taken[i] - 1) / traces[i].configs)
        if done:
            allocator.finish(key)
            open_.discard(key)
    return taken


def uniform(traces: list[Trace], budget: float) -> list[int]:
    """Steps per problem when every problem gets the same device seconds: the next step always goes to the open
    search that has spent the least (a search that ends early leaves its share to the others)."""
    taken = [0] * len(traces)
    spent = [0.0] * len(traces)
    heap = [(0.0, i) for i in range(len(traces))]
    total = 0.0
    while heap and total < budget:
        _, i = heapq.heappop(heap)
        seconds = traces[i].steps[taken[i]][0]
        taken[i] += 1
        spent[i] += seconds
        total += seconds
        if taken[i] < len(traces[i].steps):
            heapq.heappush(heap, (spent[i], i))
    return taken


def catalog_order(traces: list[Trace], budget: float) -> list[int]:
    """Steps per problem when each search runs to its end in catalog order until ``budget`` is spent."""
    taken = [0] * len(traces)
    spent = 0.0
    for i, t in enumerate(traces):
        while taken[i] < len(t.steps) and spent < budget:
            spent += t.steps[taken[i]][0]
            taken[i] += 1
    return taken


def outcome(traces: list[Trace], taken: list[int], min_speedup: float) -> tuple[float, float]:
    """(weighted saving, device seconds spent: the steps taken plus the touched problems' final verdicts)."""
    saved = sum(t.saving(k, min_speedup) for t, k in zip(traces, taken, strict=True))
    spent = sum(sum(s for s, _, _ in t.steps[:k]) + t.final_cost(k) for t, k in zip(traces, taken, strict=True))
    return saved, spent


WAYS: dict[str, Callable[[list[Trace], float], list[int]]] = {
    "allocator": allocated, "uniform": uniform, "catalog order": catalog_order}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=4, help="workloads (search seeds) per recording")
    parser.add_argument("--seed", type=int, default=0, help="the weights' seed")
    parser.add_argument("--quick", action="store_true", help="6 recordings, 2 workloads each")
    parser.add_argument("--traces", type=Path, help="a JSON file of the searches' traces: read when it exists (the "
                        "searches are deterministic), else written after they are driven")
    args = parser.parse_args(argv)
    files = sorted(HUB.glob("*.json.gz"))
    if args.quick:
        files, args.workloads = files[::2], 2
    policy = farm.StackPolicy(timing=farm.Timing.DEVICE, strategy="random", budget=1e9)
    rng = random.Random(args.seed)
    started = time.monotonic()
    traces: list[Trace] = []
    stored = json.loads(args.traces.read_text()) if args.traces is not None and args.traces.exists() else {}
    for path in files:
        for w in range(args.workloads):
            calls = round(1000.0 * math.exp(rng.gauss(0.0, 2.0)), 1)
            known = stored.get(f"{path.name}#{w}")
            traces.append(Trace(**{**known, "calls": calls, "steps": [tuple(x) for x in known["steps"]],
                                   "finals": {float(k): v for k, v in known["finals"].items()}}) if known else
                          traced(path, w, calls, dataclasses.replace(policy, seed=w)))
    if args.traces is not None and not stored:
        keys = [f"{path.name}#{w}" for path in files for w in range(args.workloads)]
        args.traces.write_text(json.dumps({k: dataclasses.asdict(t) for k, t in zip(keys, traces, strict=True)}))
    rng.shuffle(traces)  # catalog order is not the order of the files
    exhaustive = sum(t.cost for t in traces)
    achievable = sum(t.value * t.best_gain for t in traces)
    values = sorted((t.value for t in traces), reverse=True)
    top = sum(values[: max(1, len(values) // 10)]) / sum(values)
    print(f"fleet budget: {len(traces)} problems ({len(files)} recordings x {args.workloads} workloads), weights "
          f"log-normal (seed {args.seed}): the top tenth hold {top:.0%} of the fleet time; exhaustive run "
          f"{exhaustive:,.1f} device s; achievable saving {achievable:,.1f} fleet s per hour; traces "
          f"{time.monotonic() - started:.0f} s")
    # Every search run to its end: what no allocation can beat (each race's pick, not the recording's optimum).
    full = outcome(traces, [len(t.steps) for t in traces], policy.min_speedup)[0]
    print(f"{'budget':>7} {'device s':>9} | {'allocator':>9} {'uniform':>9} {'catalog':>9} | {'vs uniform':>10} "
          f"{'vs catalog':>10} {'ceiling':>8}   (share of the achievable weighted saving; ceiling: the most any "
          f"allocation can buy over uniform, every search run to its end; device s each way really spent)")
    at_20 = 0.0
    versus: list[float] = []
    ceilings: list[float] = []
    for share in BUDGETS:
        budget = share * exhaustive
        results = {name: outcome(traces, way(traces, budget), policy.min_speedup) for name, way in WAYS.items()}
        (a, a_s), (u, u_s), (c, c_s) = results["allocator"], results["uniform"], results["catalog order"]
        vs_uniform, vs_catalog = a / u if u > 0 else math.inf, a / c if c > 0 else math.inf
        if share >= ISSUE_RANGE and share < 1.0:
            versus.append(vs_uniform)
            ceilings.append(full / u if u > 0 else math.inf)
        if share == 0.20:
            at_20 = a / achievable
        print(f"{share:>7.1%} {budget:>9,.1f} | {a / achievable:>9.1%} {u / achievable:>9.1%} {c / achievable:>9.1%} | "
              f"{vs_uniform:>9.2f}x {vs_catalog:>9.2f}x {full / u if u > 0 else math.inf:>7.2f}x   (spent {a_s:,.1f} / {u_s:,.1f} / {c_s:,.1f})")
    met_share, met_uniform = at_20 >= 0.90, bool(versus) and min(versus) >= 1.5
    print(f"at 20 %: {at_20:.1%} of the achievable saving (target >= 90 %: {'met' if met_share else 'not met'}); "
          f"against uniform at 5-50 %: {min(versus):.2f}x to {max(versus):.2f}x (target >= 1.5x: "
          f"{'met' if met_uniform else 'not met'}; no allocation can buy more than {max(ceilings):.2f}x uniform there)")
    print(f"targets {'met' if met_share and met_uniform else 'not met'} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
