"""Decision quality: the farm's rule against models of peer rules, on candidates of known cost, under interference.

Every candidate burns a set multiple of the reference's CPU time (a busy-wait on the thread's CPU clock, so a
co-tenant on the same core stretches its wall time as it would a real kernel's). Two scenarios are decided:

- ``win``:  half (0.5x, the correct pick), near (0.8x), slow (1.5x), wrong (0.25x, wrong output), nan (0.2x, NaN
  output), first_fast (0.3x for its first 8 calls, 3x after);
- ``none``: slower (1.3x), double (2x), wrong, nan, first_fast: the reference is the correct pick.

under three conditions: ``quiet``; ``hog`` (a CPU-bound process, not pinned); ``cotenant`` (the tuner pinned to one
core and a CPU-bound process pinned to the same core). Rules: the farm (``farm.tune`` with the default policy), and
models of peer rules: ``do_bench`` (triton-style: 25 ms warmup, 100 ms of repetitions, median; no answer check),
``min_of_10`` (minimum of 10 calls; no check), ``mean_of_7`` (one answer check, then the mean of 7 calls).

Per condition and rule it prints: correct picks, wrong-output picks, picks slower than the reference, stability (the
same pick in two runs of the same decision) and tuning time per decision.

    .venv/bin/python bench/decision_quality.py [--repeats 3] [--dobench-repeats 1] [--unit-ms 0.5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import farm

HOG = "import os, sys\nif len(sys.argv) > 1: os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def burn(seconds: float) -> None:
    """Busy-wait ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@dataclass(frozen=True)
class Spec:
    """A candidate of known cost: ``cost`` in reference units, ``output`` "ok", "wrong" or "nan"; ``first`` calls
    cost ``first_cost`` instead (a candidate fast only on its first calls)."""

    name: str
    cost: float
    output: str = "ok"
    first: int = 0
    first_cost: float = 0.0

    @property
    def correct(self) -> bool:
        return self.output == "ok"


SCENARIOS: dict[str, list[Spec]] = {
    "win": [Spec("reference", 1.0), Spec("near", 0.8), Spec("wrong", 0.25, "wrong"), Spec("nan", 0.2, "nan"),
            Spec("first_fast", 3.0, first=8, first_cost=0.3), Spec("slow", 1.5), Spec("half", 0.5)],
    "none": [Spec("reference", 1.0), Spec("slower", 1.3), Spec("wrong", 0.3, "wrong"), Spec("nan", 0.2, "nan"),
             Spec("first_fast", 3.0, first=8, first_cost=0.3), Spec("double", 2.0)],
}


def implementation(spec: Spec, unit: float) -> Callable[[np.ndarray], np.ndarray]:
    calls = [0]

    def fn(x: np.ndarray) -> np.ndarray:
        calls[0] += 1
        burn(unit * (spec.first_cost if calls[0] <= spec.first else spec.cost))
        if spec.output == "wrong":
            return x * 3.0
        if spec.output == "nan":
            return x * np.nan
        return x * 2.0

    fn.__name__ = spec.name
    return fn


def correct_pick(specs: list[Spec]) -> set[str]:
    """The correct-output implementations of least steady cost (ties all count)."""
    best = min(s.cost for s in specs if s.correct)
    return {s.name for s in specs if s.correct and s.cost == best}


# -- the rules -------------------------------------------------------------------------------------------------


def farm_rule(specs: list[Spec], unit: float, x: np.ndarray) -> str:
    tunable = farm.TunableSet(f"quality_{time.monotonic_ns()}", signature=farm.array_signature)
    tunable.reference(implementation(specs[0], unit))
    for spec in specs[1:]:
        tunable.candidate(implementation(spec, unit), group=0)
    return farm.tune(tunable, x).name


def timed(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> float:
    start = time.perf_counter()
    fn(x)
    return time.perf_counter() - start


def do_bench(specs: list[Spec], unit: float, x: np.ndarray) -> str:
    scores = {}
    for spec in specs:
        fn = implementation(spec, unit)
        estimate = statistics.mean(timed(fn, x) for _ in range(5))
        for _ in range(max(1, int(0.025 / estimate))):
            fn(x)
        scores[spec.name] = statistics.median(timed(fn, x) for _ in range(max(1, int(0.100 / estimate))))
    return min(scores, key=scores.__getitem__)


def min_of_10(specs: list[Spec], unit: float, x: np.ndarray) -> str:
    scores = {}
    for spec in specs:
        fn = implementation(spec, unit)
        scores[spec.name] = min(timed(fn, x) for _ in range(10))
    return min(scores, key=scores.__getitem__)


def mean_of_7(specs: list[Spec], unit: float, x: np.ndarray) -> str:
    expected = x * 2.0
    scores = {}
    for spec in specs:
        fn = implementation(spec, unit)
        out = fn(x)
        if not (np.all(np.isfinite(out)) and np.allclose(out, expected)):
            continue
        scores[spec.name] = statistics.mean(timed(fn, x) for _ in range(7))
    return min(scores, key=scores.__getitem__)


RULES: dict[str, Callable[[list[Spec], float, np.ndarray], str]] = {
    "farm": farm_rule, "do_bench": do_bench, "min_of_10": min_of_10, "mean_of_7": mean_of_7,
}


# -- conditions ------------------------------------------------------------------------------------------------


class Condition:
    """Starts the interference of a condition on entry and ends it (the processes it started) on exit."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hog: subprocess.Popen[bytes] | None = None
        self.affinity: set[int] | None = None

    def __enter__(self) -> Condition:
        if self.name == "hog":
            self.hog = subprocess.Popen([sys.executable, "-c", HOG])
        elif self.name == "cotenant":
            self.affinity = os.sched_getaffinity(0)
            core = min(self.affinity)
            os.sched_setaffinity(0, {core})
            self.hog = subprocess.Popen([sys.executable, "-c", HOG, str(core)])
        time.sleep(0.2)  # let the hog get scheduled before the first decision
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.hog is not None:
            self.hog.kill()
            self.hog.wait()
        if self.affinity is not None:
            os.sched_setaffinity(0, self.affinity)


@dataclass
class Tally:
    decisions: int = 0
    correct: int = 0
    wrong_output: int = 0
    slower: int = 0
    stable: int = 0
    pairs: int = 0
    seconds: list[float] = field(default_factory=list)


def decide_all(condition: str, repeats: int, unit: float, rules: list[str], slow_repeats: int) -> dict[str, Tally]:
    """Decide every scenario ``repeats`` times per rule (``slow_repeats`` for the do_bench model), twice each."""
    x = np.ones(256)
    tallies = {rule: Tally() for rule in rules}
    with Condition(condition):
        for repeat in range(repeats):
            for specs in SCENARIOS.values():
                by_name = {s.name: s for s in specs}
                right = correct_pick(specs)
                for rule in rules:
                    if rule == "do_bench" and repeat >= slow_repeats:
                        continue
                    picks = []
                    for _run in range(2):
                        start = time.perf_counter()
                        picks.append(RULES[rule](specs, unit, x))
                        tallies[rule].seconds.append(time.perf_counter() - start)
                    t = tallies[rule]
                    for pick in picks:
                        t.decisions += 1
                        t.correct += pick in right
                        t.wrong_output += not by_name[pick].correct
                        t.slower += by_name[pick].cost > by_name["reference"].cost
                    t.pairs += 1
                    t.stable += picks[0] == picks[1]
    return tallies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="decisions of each scenario per condition and run")
    parser.add_argument("--dobench-repeats", type=int, default=1,
                        help="the same for the do_bench model, which spends 125 ms per candidate")
    parser.add_argument("--unit-ms", type=float, default=0.5, help="the reference's CPU time in milliseconds")
    parser.add_argument("--quick", action="store_true", help="1 repeat, no do_bench model")
    parser.add_argument("--conditions", default="quiet,hog,cotenant")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    rules = [r for r in RULES if not (args.quick and r == "do_bench")]
    unit = args.unit_ms / 1000.0
    print(f"decision quality: {repeats} x {len(SCENARIOS)} scenarios per condition ({args.dobench_repeats} x for do_bench), "
          f"each decided twice; reference = {args.unit_ms:g} ms CPU; {os.cpu_count()} CPUs, tuner affinity "
          f"{sorted(os.sched_getaffinity(0))}")
    header = f"{'condition':<10} {'rule':<10} {'correct':>9} {'wrong-out':>9} {'slower':>7} {'stable':>8} {'s/decision':>11}"
    print(header)
    print("-" * len(header))
    for condition in args.conditions.split(","):
        tallies = decide_all(condition, repeats, unit, rules, args.dobench_repeats)
        for rule, t in tallies.items():
            print(f"{condition:<10} {rule:<10} {t.correct:>4}/{t.decisions:<4} {t.wrong_output:>9} {t.slower:>7} "
                  f"{t.stable:>3}/{t.pairs:<4} {statistics.mean(t.seconds):>11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
