"""Racing: how a search evaluates a space's configs under ``screening = "race"`` (the default).

Strategies propose, racing evaluates. A config is validated against the reference (its validation run is its
warm-up), then timed in order-balanced pairs against the **incumbent**, the best config so far (the reference at
first), with a sequential test after every pair:

- **decided slower** than the incumbent: dropped (verdict ``dropped``, never a winner);
- **decided faster**: it becomes the incumbent (the one it replaced stays a contender unless decided slower);
- still close after :func:`screening_limit` pairs (3 for the default ``samples``): a **contender**.

The best contenders are then settled head to head against the incumbent (fresh pairs up to ``sample_limit``, the
mean times deciding: typical times, not fastest runs, rank configs within the noise of each other), and the race's
winner gets the full protocol against the reference (:func:`farm.trials.candidate_trials`): a decision's meaning
never depends on the race, only its cost does.

**The test.** Noise and interference only ever add time, so a config's fastest run ``c_min`` is at least its true
time, and the incumbent's fastest run ``i_min`` (over every run it made in the race) is at least the incumbent's.
Let ``e = t / t_floor - 1`` be a run's relative excess over its true time, with the distribution the incumbent's
own runs show (its excesses over its fastest run). A config is decided slower after ``k`` runs when
``c_min > i_min * (1 + q_k)``, where ``q_k`` is the excess that each of ``k`` independent runs exceeds with
probability at most ``beta_k``: ``P(e > q_k) <= beta_k ** (1 / k)``, ``beta_k = BETA * 6 / (pi^2 k^2)``. A config
truly at least as fast as the incumbent has ``c_true <= i_true <= i_min``, so it is dropped only if all of its ``k``
runs exceeded ``q_k``: the chance that it is dropped at ANY look is at most ``sum_k beta_k = BETA`` (1 %), however
many pairs it takes. Decided faster is the mirror image over the incumbent's runs (``i_min > c_min * (1 + q_n)``,
``n`` the incumbent's runs), so a wrong promotion is as rare; it would cost only effort, never meaning. The bound
assumes a config's excess is distributed as the incumbent's (noise proportional to time), and reads ``q_k`` from
the excesses the reference's and the incumbent's runs showed (the latest ``NOISE_WINDOW`` of each): their empirical
quantile once they are enough to show the level, before that an exponential tail fitted to them
(:func:`excess_bound`), since a few runs cannot show the tail a 1 % level asks for.
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
from farm.trials import Outcome, TrialVerdict, candidate_trials, failure_of, timed, validation_trial

SETTLED = 4
"""The most contenders settled head to head (the best by their fastest run); the others lose to the winner."""
FINALISTS = 3
"""The most configs given the full verdict against the reference when the race's winner does not win it."""

BETA = 0.01
"""The most probability that a config truly at least as fast as the incumbent is dropped."""


def screening_limit(policy: StackPolicy) -> int:
    """The pairs a config may take before it is kept as a contender: ``(samples - 1) // 2`` (3 for the default
    7). Only the best ``SETTLED`` contenders are settled, with up to ``sample_limit`` pairs each: screening needs
    only to tell the close from the clearly slower."""
    return max(2, (policy.samples - 1) // 2)


def look_beta(look: int) -> float:
    """The error the ``look``-th look (1-based) of one config may spend: ``BETA * 6 / (pi^2 look^2)``."""
    return BETA * 6.0 / (math.pi**2 * look**2)


NOISE_WINDOW = 255
"""The latest runs of each incumbent whose excesses make the noise distribution (the pool is bounded)."""


def excesses(runs: Sequence[float]) -> list[float]:
    """The relative excesses of the latest runs over the fastest of them, that one left out (it is the floor's
    estimate, not a draw of the excess); empty for fewer than two runs."""
    if len(runs) < 2:
        return []
    recent = list(runs[-NOISE_WINDOW:])
    recent.remove(min(recent))
    floor = min(runs[-NOISE_WINDOW:])
    return [t / floor - 1.0 for t in recent]


def excess_bound(noise: Sequence[float], runs: int, look: int) -> float:
    """``q``: a relative excess that each of ``runs`` independent runs exceeds with probability at most
    ``level = look_beta(look) ** (1 / runs)``, from the observed excesses ``noise`` (:func:`excesses`).

    When the excesses can show that level (at least ``1 / level`` of them), their empirical quantile, one order
    statistic on the safe side. When they cannot (a few runs, a 1 % level), the larger of their largest and an
    exponential tail, ``m * ln(1 / level)``, with ``m`` an upper bound of the mean excess (``mean * (1 + 2 /
    sqrt(n))``, about 95 % for n excesses of an exponential). Infinite without any excess: nothing is decided."""
    if not noise:
        return math.inf
    excess = sorted(noise)
    n = len(excess)
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
    """A race over configs a strategy proposes one at a time (:meth:`enter`), then :meth:`finish`.

    ``reference_times`` are the reference's own timings (the first incumbent's runs); ``names`` maps positions
    to candidate names; ``deadline`` bounds the race (time.monotonic)."""

    def __init__(self, runner: TrialRunner, policy: StackPolicy, reference: int, names: Sequence[str],
                 reference_times: Sequence[float], deadline: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.runner, self.policy, self.reference, self.names = runner, policy, reference, names
        self.deadline, self.clock = deadline, clock
        self.reference_floor = min(reference_times)
        self.incumbent = reference
        self.incumbent_runs: dict[int, list[float]] = {reference: list(reference_times)}  # an entrant's: its runs
        self.incumbent_best = min(reference_times)
        self.contenders: dict[int, Entrant] = {}
        self.entrants: dict[int, Entrant] = {}  # every config validated, whatever became of it
        self.outcomes: dict[int, Outcome] = {}
        self.estimates: dict[int, float | None] = {}
        self.exhausted = False
        self.seeded: set[int] = set()

    def seed(self, outcome: Outcome) -> None:
        """A candidate already judged with the full protocol (a listed one, a grown space's stored winner): the
        race starts from it when its runs were faster than the incumbent's. Its Outcome stays the caller's."""
        if outcome.failure is not None or not outcome.pairs:
            return
        runs = [c for _, c in outcome.pairs]
        if min(runs) < self.incumbent_best:
            self.incumbent, self.incumbent_best = outcome.index, min(runs)
            self.incumbent_runs[outcome.index] = runs
            self.seeded.add(outcome.index)

    # -- one config --------------------------------------------------------------------------------------

    def enter(self, position: int, revision: str = "") -> float | None:
        """Validate and screen the config at ``position``; its estimated ratio to the reference (what a strategy
        is told), or None when it failed or the budget stopped the race before it ran."""
        name = self.names[position]
        if self.exhausted or self.clock() > self.deadline:
            self.exhausted = True
            self.outcomes[position] = Outcome(position, name, verdict=TrialVerdict.NOT_TRIED, revision=revision,
                                              note=f"budget of {self.policy.budget:g}s exhausted",
                                              budget_exhausted=True)
            self.estimates[position] = None
            return None
        validated = dataclasses.replace(validation_trial(self.runner, self.policy, self.reference, position, name),
                                        revision=revision)
        if validated.failure is not None:
            self.outcomes[position] = validated
            self.estimates[position] = None
            return None
        entrant = Entrant(position, name, validated)
        self.entrants[position] = entrant
        self._screen(entrant, screening_limit(self.policy))
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
            incumbent_runs = self.incumbent_runs[self.incumbent]
            incumbent_best = self.incumbent_best
            verdict = screen(entrant.best, len(entrant.runs), incumbent_best, len(incumbent_runs), self._noise(),
                             entrant.looks)
            if verdict == "slower":
                self._drop(entrant, self.incumbent, incumbent_best)
                return
            if verdict == "faster":
                self._promote(entrant)
                return
        if entrant.runs:
            self.contenders[entrant.position] = entrant
            self._estimate(entrant)

    def _pair(self, entrant: Entrant) -> bool:
        """Time one pair (incumbent first on even pairs); False when the config failed (its Outcome set). A
        failure of the incumbent's run is the incumbent's: it already ran clean, so it propagates as the
        config's failure only when the config's run raised."""
        incumbent = self.incumbent
        first = len(entrant.pairs) % 2 == 0
        try:
            if first:
                i = timed(self.runner, incumbent, self.names[incumbent])
                c = timed(self.runner, entrant.position, entrant.name)
            else:
                c = timed(self.runner, entrant.position, entrant.name)
                i = timed(self.runner, incumbent, self.names[incumbent])
        except Exception as e:
            verdict, note = failure_of(e)
            self.outcomes[entrant.position] = dataclasses.replace(entrant.validated, verdict=verdict, note=note,
                                                                  pairs=tuple(entrant.pairs))
            self.estimates[entrant.position] = None
            self.contenders.pop(entrant.position, None)
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

    def _estimate(self, entrant: Entrant) -> None:
        self.estimates[entrant.position] = entrant.best / self.reference_floor

    def _drop(self, entrant: Entrant, by: int, by_best: float) -> None:
        self._estimate(entrant)
        self.contenders.pop(entrant.position, None)
        self.outcomes[entrant.position] = dataclasses.replace(
            entrant.validated, verdict=TrialVerdict.DROPPED, pairs=tuple(entrant.pairs), stop="decided",
            note=f"slower than {self.names[by]!r}: best run {entrant.best * 1e3:.4g} ms against {by_best * 1e3:.4g} ms "
                 f"after {len(entrant.pairs)} pairs")

    def _promote(self, entrant: Entrant) -> None:
        """``entrant`` becomes the incumbent; the one it replaced stays a contender unless decided slower."""
        self._estimate(entrant)
        previous = self.incumbent
        self.incumbent = entrant.position
        self.incumbent_runs[entrant.position] = entrant.runs  # its runs as incumbent extend its own
        self.incumbent_best = entrant.best
        self.contenders[entrant.position] = entrant
        if previous == self.reference:
            return
        former = self.contenders.get(previous)
        if former is None:
            return
        if former.best > entrant.best * (1.0 + excess_bound(self._noise(), len(former.runs), max(former.looks, 1))):
            self._drop(former, entrant.position, entrant.best)

    # -- the end ---------------------------------------------------------------------------------------------

    def finish(self) -> Raced:
        """Settle the best contenders head to head against the incumbent, then give the winner the full protocol
        against the reference (even when the budget ran out during the race: one candidate's trials more). When
        that verdict is no decided win (the noise of a slow reference), the next best configs whose estimates
        clear the line get theirs, up to ``FINALISTS`` in all."""
        limit = self.policy.sample_limit
        for rank, position in enumerate(sorted(self.contenders, key=lambda p: self.contenders[p].best)):
            entrant = self.contenders.get(position)
            if entrant is None or position == self.incumbent:
                continue
            if rank > SETTLED:  # the incumbent is among the first SETTLED + 1
                break
            self._settle(entrant, limit)
        winner = self.incumbent
        for position, entrant in list(self.contenders.items()):
            if position != winner:
                self._lost(entrant, winner)
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
        """Head to head: the contender and the incumbent in fresh order-balanced pairs up to ``limit``; it takes the
        incumbent's place when its mean time is below the incumbent's over those pairs (each side's runs alike
        disturbed, order-balanced). Typical times decide here, not fastest runs: the contenders are all within the
        noise of the incumbent's fastest, and a median (of times or of ratios) misjudges a config whose times
        have two modes."""
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

    def _lost(self, entrant: Entrant, winner: int) -> None:
        self.outcomes[entrant.position] = dataclasses.replace(
            entrant.validated, verdict=TrialVerdict.DROPPED, pairs=tuple(entrant.pairs), stop="settled",
            note=f"settled: {self.names[winner]!r} kept as the race's winner (best run {entrant.best * 1e3:.4g} ms "
                 f"against {min(self.incumbent_runs[winner]) * 1e3:.4g} ms after {len(entrant.pairs)} pairs)")
        self._estimate(entrant)
