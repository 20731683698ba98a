"""Racing: how a search evaluates a space's configs under ``screening = "race"`` (the default).

Each config is validated, then screened in pairs against the incumbent, the best so far (:func:`screen`); the
best contenders are settled head to head and the winner gets the full protocol against the reference, so the
race changes a decision's cost, never its meaning (docs/decisions.md, "Racing: how a space's configs are
evaluated", with the test and its error bound).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from farm.policy import StackPolicy
from farm.runner import TrialRunner
from farm.scoring import judge
from farm.search import budget_note
from farm.trials import Outcome, TrialVerdict, candidate_trials, failure_of, timed, validation_trial

SETTLED = 4  # the most contenders settled head to head (the best by their fastest run)
FINALISTS = 3  # the most configs given the full verdict when the race's winner does not win it
BETA = 0.01  # the most probability that a config truly at least as fast as the incumbent is dropped
NOISE_WINDOW = 255  # the latest runs of each incumbent whose excesses make the noise distribution


def look_beta(look: int) -> float:
    """The error the ``look``-th look (1-based) of one config may spend: ``BETA * 6 / (pi^2 look^2)``."""
    return BETA * 6.0 / (math.pi**2 * look**2)


def excesses(runs: Sequence[float]) -> list[float]:
    """The relative excesses of the latest ``NOISE_WINDOW`` runs over the fastest of them, that one left out
    (it is the floor's estimate, not a draw of the excess); empty for fewer than two runs."""
    if len(runs) < 2:
        return []
    recent = list(runs[-NOISE_WINDOW:])
    floor = min(recent)
    recent.remove(floor)
    return [t / floor - 1.0 for t in recent]


def excess_bound(noise: Sequence[float], runs: int, look: int) -> float:
    """``q``: the relative excess each of ``runs`` independent runs exceeds with probability at most
    ``look_beta(look) ** (1 / runs)``, read from the excesses ``noise`` (docs/decisions.md, "The test and its
    error bound"). Infinite without any excess: nothing is decided."""
    if not noise:
        return math.inf
    excess, n = sorted(noise), len(noise)
    level: float = look_beta(look) ** (1.0 / max(runs, 1))
    above = int(level * n) - 1  # how many observed excesses may lie above q, one fewer to be safe
    if above >= 0:
        return excess[n - 1 - above]
    mean = sum(excess) / n * (1.0 + 2.0 / math.sqrt(n))
    return max(excess[-1], mean * math.log(1.0 / level))


def screen(config_best: float, config_runs: int, incumbent_best: float, incumbent_runs: int,
           noise: Sequence[float], look: int) -> str | None:
    """The sequential test at a config's ``look``-th look (1-based): "slower" (drop it), "faster" (it becomes the
    incumbent) or None (undecided), from each side's fastest run and run count and the excesses ``noise``."""
    if config_best > incumbent_best * (1.0 + excess_bound(noise, config_runs, look)):
        return "slower"
    if incumbent_best > config_best * (1.0 + excess_bound(noise, incumbent_runs, look)):
        return "faster"
    return None


@dataclass
class Entrant:
    """One config in the race: its runs and the pairs it was timed in, as (incumbent seconds, its seconds)."""

    position: int
    name: str
    validated: Outcome
    runs: list[float] = field(default_factory=list)
    pairs: list[tuple[float, float]] = field(default_factory=list)
    looks: int = 0

    @property
    def best(self) -> float:
        return min(self.runs)


@dataclass(frozen=True)
class Raced:
    """A race: an Outcome per config given (dropped, failed, or the winner's full verdict against the reference),
    each config's estimated ratio to the reference (None: failed, not tried), whether the budget cut it short."""

    outcomes: tuple[Outcome, ...]
    estimates: dict[int, float | None]
    budget_exhausted: bool
    winner: int


class Race:
    """A race over configs a strategy proposes one at a time (:meth:`enter`), then :meth:`finish`; ``names``
    maps positions to candidate names, ``deadline`` (``clock``'s time) bounds the race."""

    def __init__(self, runner: TrialRunner, policy: StackPolicy, reference: int, names: Sequence[str],
                 reference_times: Sequence[float], deadline: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.runner, self.policy, self.reference, self.names = runner, policy, reference, names
        self.deadline, self.clock = deadline, clock
        self.reference_floor = self.incumbent_best = min(reference_times)
        self.incumbent = reference
        self.incumbent_runs: dict[int, list[float]] = {reference: list(reference_times)}  # an entrant's: its runs
        self.contenders: dict[int, Entrant] = {}
        self.entrants: dict[int, Entrant] = {}  # every config validated, whatever became of it
        self.outcomes: dict[int, Outcome] = {}
        self.estimates: dict[int, float | None] = {}
        self.exhausted = False
        self.seeded: set[int] = set()

    def seed(self, outcome: Outcome) -> None:
        """A candidate already judged with the full protocol (a listed one, a grown space's stored winner): the
        race starts from it when its runs were faster than the incumbent's. Its Outcome stays the caller's."""
        runs = [c for _, c in outcome.pairs]
        if outcome.failure is None and runs and min(runs) < self.incumbent_best:
            self.incumbent, self.incumbent_best = outcome.index, min(runs)
            self.incumbent_runs[outcome.index] = runs
            self.seeded.add(outcome.index)

    def _failed(self, position: int, outcome: Outcome) -> None:
        self.outcomes[position] = outcome
        self.estimates[position] = None
        self.contenders.pop(position, None)

    def enter(self, position: int, revision: str = "") -> float | None:
        """Validate and screen the config at ``position``; its estimated ratio to the reference (what a strategy
        is told), or None when it failed or the budget stopped the race before it ran."""
        name = self.names[position]
        if self.exhausted or self.clock() > self.deadline:
            self.exhausted = True
            self._failed(position, Outcome(position, name, verdict=TrialVerdict.NOT_TRIED, revision=revision,
                                           note=budget_note(self.policy.budget), budget_exhausted=True))
            return None
        validated = dataclasses.replace(validation_trial(self.runner, self.policy, self.reference, position, name),
                                        revision=revision)
        if validated.failure is not None:
            self._failed(position, validated)
            return None
        entrant = self.entrants[position] = Entrant(position, name, validated)
        self._screen(entrant, max(2, (self.policy.samples - 1) // 2))  # then a contender
        return self.estimates.get(position)

    def _screen(self, entrant: Entrant, limit: int) -> None:
        """Pairs against the incumbent until ``entrant`` is decided or has ``limit`` pairs (then a contender)."""
        while len(entrant.pairs) < limit:
            if self.clock() > self.deadline:
                self.exhausted = True
                break
            if not self._pair(entrant):
                return
            entrant.looks += 1
            verdict = screen(entrant.best, len(entrant.runs), self.incumbent_best,
                             len(self.incumbent_runs[self.incumbent]), self._noise(), entrant.looks)
            if verdict == "slower":
                self._drop(entrant, self.incumbent, self.incumbent_best)
                return
            if verdict == "faster":
                self._promote(entrant)
                return
        if entrant.runs:
            self.contenders[entrant.position] = entrant
            self.estimates[entrant.position] = entrant.best / self.reference_floor

    def _pair(self, entrant: Entrant) -> bool:
        """Time one pair (incumbent first on even pairs); False when the config failed (its Outcome set). A
        failure of the incumbent's run counts as the config's (the incumbent already ran clean)."""
        incumbent = self.incumbent
        try:
            if len(entrant.pairs) % 2 == 0:
                i = timed(self.runner, incumbent, self.names[incumbent])
                c = timed(self.runner, entrant.position, entrant.name)
            else:
                c = timed(self.runner, entrant.position, entrant.name)
                i = timed(self.runner, incumbent, self.names[incumbent])
        except Exception as e:
            verdict, note = failure_of(e)
            self._failed(entrant.position, dataclasses.replace(entrant.validated, verdict=verdict, note=note,
                                                               pairs=tuple(entrant.pairs)))
            return False
        entrant.runs.append(c)
        entrant.pairs.append((i, c))
        self.incumbent_runs[incumbent].append(i)
        self.incumbent_best = min(self.incumbent_best, i)
        return True

    def _noise(self) -> list[float]:
        """The excess distribution: the reference's runs and the incumbent's, each over its own fastest."""
        noise = excesses(self.incumbent_runs[self.reference])
        if self.incumbent != self.reference:
            noise += excesses(self.incumbent_runs[self.incumbent])
        return noise

    def _dropped(self, entrant: Entrant, stop: str, note: str) -> None:
        self.estimates[entrant.position] = entrant.best / self.reference_floor
        self.outcomes[entrant.position] = dataclasses.replace(
            entrant.validated, verdict=TrialVerdict.DROPPED, pairs=tuple(entrant.pairs), stop=stop, note=note)

    def _drop(self, entrant: Entrant, by: int, by_best: float) -> None:
        self.contenders.pop(entrant.position, None)
        self._dropped(entrant, "decided", f"slower than {self.names[by]!r}: best run {entrant.best * 1e3:.4g}"
                      f" ms against {by_best * 1e3:.4g} ms after {len(entrant.pairs)} pairs")

    def _promote(self, entrant: Entrant) -> None:
        """``entrant`` becomes the incumbent; the one it replaced stays a contender unless decided slower."""
        self.estimates[entrant.position] = entrant.best / self.reference_floor
        previous, self.incumbent, self.incumbent_best = self.incumbent, entrant.position, entrant.best
        self.incumbent_runs[entrant.position] = entrant.runs  # its runs as incumbent extend its own
        self.contenders[entrant.position] = entrant
        former = self.contenders.get(previous) if previous != self.reference else None
        if former is not None and former.best > entrant.best * (
                1.0 + excess_bound(self._noise(), len(former.runs), max(former.looks, 1))):
            self._drop(former, entrant.position, entrant.best)

    def finish(self) -> Raced:
        """Settle the best contenders head to head, then give the winner the full protocol against the
        reference (even past the budget: one candidate's trials more); without a decided win, the next best
        configs whose estimates clear the line get theirs, up to ``FINALISTS`` in all."""
        for rank, position in enumerate(sorted(self.contenders, key=lambda p: self.contenders[p].best)):
            entrant = self.contenders.get(position)
            if entrant is None or position == self.incumbent:
                continue
            if rank > SETTLED:  # the incumbent is among the first SETTLED + 1
                break
            self._settle(entrant, self.policy.sample_limit)
        winner = self.incumbent
        for position, entrant in list(self.contenders.items()):
            if position != winner:
                best = min(self.incumbent_runs[winner])
                self._dropped(entrant, "settled", f"settled: {self.names[winner]!r} kept as the race's winner"
                              f" (best run {entrant.best * 1e3:.4g} ms against {best * 1e3:.4g} ms after"
                              f" {len(entrant.pairs)} pairs)")
        if winner != self.reference and winner not in self.seeded:
            line = 1.0 / self.policy.min_speedup
            others = sorted((e for e in self.entrants.values() if e.position != winner and e.runs
                             and e.best / self.reference_floor <= line), key=lambda e: e.best)
            for finalist in [self.entrants[winner], *others][:FINALISTS]:
                deadline = max(self.deadline, self.clock() + self.policy.budget)
                final = candidate_trials(self.runner, self.policy, self.reference, finalist.position, self.names,
                                         deadline)
                self.outcomes[finalist.position] = dataclasses.replace(final, revision=finalist.validated.revision)
                if final.failure is None and judge(final.pairs, self.policy).wins:
                    winner = finalist.position
                    break
        ordered = tuple(self.outcomes[p] for p in sorted(self.outcomes))
        return Raced(ordered, dict(self.estimates), self.exhausted, winner)

    def _settle(self, entrant: Entrant, limit: int) -> None:
        """Head to head in fresh order-balanced pairs up to ``limit``: the contender takes the incumbent's
        place when its mean time over them is lower (within the noise, typical times rank, not best runs)."""
        head_to_head = Entrant(entrant.position, entrant.name, entrant.validated)
        while len(head_to_head.pairs) < limit and self.clock() <= self.deadline:
            if not self._pair(head_to_head):
                self.contenders.pop(entrant.position, None)
                return
        entrant.runs.extend(head_to_head.runs)
        entrant.pairs.extend(head_to_head.pairs)
        pairs = head_to_head.pairs
        if pairs and statistics.fmean(c for _, c in pairs) < statistics.fmean(i for i, _ in pairs):
            self._promote(entrant)
