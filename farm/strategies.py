"""Search strategies over a roster's spaces: which configs a search evaluates next, in ask/tell rounds.

A :class:`Sampler` (one per ``policy.strategy``) proposes positions (``ask(n)``: up to n configs not yet proposed,
[] when it has nothing more) and learns their results (``tell``: position and ratio, None for a config that failed
or gave no ratio). It is deterministic in its inputs: built again with the same roster, policy and exclusions and
told the same results after the same asks, it asks the same next configs, so a search resumed from stored results
never re-runs a finished config (:func:`replay`). Plain candidates are not a sampler's business: every search tries them.

- ``exhaustive``: every feasible config, in position order.
- ``random``: distinct feasible configs drawn uniformly with the policy's seed.
- ``bayes``: Optuna's TPE sampler in ask-and-tell mode (the ``tuning-farm[bayes]`` extra), batched asks with a
  constant liar, parameters of numeric values as ordered indices.
- ``local``: a local search over the parameters guided by an additive model of the results (farm.localsearch).

Each stops at ``max_configs`` proposals (None: when the spaces run out).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from farm.errors import TuneFailure
from farm.localsearch import LocalSearch
from farm.policy import StackPolicy
from farm.roster import Roster

Exclude = Callable[[int], bool]
# How many draws a sampling strategy may reject (infeasible, seen or excluded) per config it proposes before it
# falls back to walking the remaining configs in order.
REJECTS_PER_CONFIG = 64
BAYES_REJECTS_PER_CONFIG = 4  # each rejected TPE suggestion is a trial the model must fit again
# The value told for a config that failed, gave no ratio, or cannot run: far above any ratio worth having, so the
# model steers away from its region (TPE ranks values, it does not average them).
PENALTY = 100.0


class Sampler(Protocol):
    """The ask/tell port every sampling strategy implements (the coordinator's propose seam is
    ``farm_coordinator.strategy.Strategy``)."""

    name: str
    adaptive: bool  # whether ``tell`` changes what ``ask`` proposes next

    def ask(self, n: int) -> list[int]: ...

    def tell(self, results: Sequence[tuple[int, float | None]]) -> None: ...

    def usable(self, position: int) -> bool: ...  # not proposed yet, not excluded, feasible

    def adopt(self, positions: Sequence[int]) -> None: ...  # proposed for it (priors): never proposed again


def make_sampler(roster: Roster, policy: StackPolicy, exclude: Exclude | None = None) -> Sampler:
    """The policy's sampler over ``roster``'s spaces; ``exclude`` names positions never to propose (an
    incremental search's already-covered configs). INVALID_INPUT when bayes is chosen without Optuna."""
    skip = exclude or (lambda _p: False)
    if policy.strategy == "exhaustive":
        return Exhaustive(roster, policy.max_configs, skip)
    if policy.strategy == "random":
        return RandomDraw(roster, policy.max_configs, policy.seed, skip)
    if policy.strategy == "bayes":
        return Bayes(roster, policy.max_configs, policy.seed, skip)
    if policy.strategy == "local":
        return LocalSearch(roster, policy.max_configs, policy.seed, skip)
    raise TuneFailure.invalid(f"policy.strategy {policy.strategy!r} is not a strategy")


def replay(sampler: Sampler, rounds: Sequence[Sequence[tuple[int, float | None]]]) -> Sampler:
    """Bring a freshly built sampler to where stored ``rounds`` left it: each round is re-asked (its size) and
    its stored results told. ValueError when a round's positions differ from what the sampler asks (the
    stored results came from another roster, policy or seed)."""
    for results in rounds:
        asked = sampler.ask(len(results))
        if sorted(asked) != sorted(p for p, _ in results):
            raise ValueError(f"stored round {[p for p, _ in results]} differs from the sampler's asks {asked}")
        sampler.tell(results)
    return sampler


def effort(evaluated: int, space_size: int, strategy: str, seed: int | None, incremental: bool = False) -> str:
    """The summary of a space search: ``evaluated 60 of 10,240 configs (bayes, seed 0)``; a grown space's
    search says ``incremental`` (the other configs were covered by the stored decision)."""
    how = strategy if strategy == "exhaustive" or seed is None else f"{strategy}, seed {seed}"
    return f"evaluated {evaluated:,} of {space_size:,} configs ({how}{', incremental' if incremental else ''})"


def space_size(roster: Roster) -> int:
    """How many configs the roster's spaces declare (their cross products; restrictions apply lazily)."""
    return sum(s.size for s in roster.spaces())


class _Budgeted:
    """What every sampler shares: the roster, the proposal limit, the proposed set, feasibility checks."""

    name = ""
    adaptive = False

    def __init__(self, roster: Roster, max_configs: int | None, exclude: Exclude) -> None:
        self.roster = roster
        self.segments = tuple(roster.spaces())
        self.total = sum(s.size for s in self.segments)
        self.left = self.total if max_configs is None else min(max_configs, self.total)
        self.proposed: set[int] = set()
        self.exclude = exclude
        self._walking: Iterator[int] | None = None

    def usable(self, position: int) -> bool:
        """Not proposed yet, not excluded, and feasible (the candidate is eligible)."""
        return position not in self.proposed and not self.exclude(position) and self.roster[position].eligible

    def walked(self, out: list[int], want: int) -> list[int]:
        """Fill ``out`` up to ``want`` from the walk once one started (a sampler's fallback), and take it."""
        while len(out) < want and self._walking is not None:
            following = next(self._walking, None)
            if following is None:
                break
            if following not in out:
                out.append(following)
        return self.take(out)

    def take(self, positions: list[int]) -> list[int]:
        self.proposed.update(positions)
        self.left -= len(positions)
        return positions

    def adopt(self, positions: Sequence[int]) -> None:
        """Configs proposed for this sampler (a prior's): never proposed again, counted against the limit."""
        self.take([p for p in positions if p not in self.proposed])

    def position(self, ordinal: int) -> int:
        """The roster position of the ``ordinal``-th config over all spaces (0 <= ordinal < total)."""
        for segment in self.segments:
            if ordinal < segment.size:
                return segment.start + ordinal
            ordinal -= segment.size
        raise IndexError(ordinal)

    def walk(self, start: int = 0) -> Iterator[int]:
        """Every usable position from ordinal ``start`` on, wrapping around once."""
        for k in range(self.total):
            p = self.position((start + k) % self.total)
            if self.usable(p):
                yield p

    def tell(self, results: Sequence[tuple[int, float | None]]) -> None:
        """Exhaustive and random proposals do not depend on results."""


class Exhaustive(_Budgeted):
    """Every feasible config in position order (today's behaviour over every config)."""

    name = "exhaustive"

    def __init__(self, roster: Roster, max_configs: int | None, exclude: Exclude) -> None:
        super().__init__(roster, max_configs, exclude)
        self._cursor = 0

    def ask(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < min(n, self.left) and self._cursor < self.total:
            p = self.position(self._cursor)
            self._cursor += 1
            if self.usable(p):
                out.append(p)
        return self.take(out)


class RandomDraw(_Budgeted):
    """Distinct feasible configs drawn uniformly with a seed; after many rejected draws (a space mostly
    infeasible or mostly covered) it walks the rest from a random start, so it still ends."""

    name = "random"

    def __init__(self, roster: Roster, max_configs: int | None, seed: int, exclude: Exclude) -> None:
        super().__init__(roster, max_configs, exclude)
        self._rng = random.Random(seed)

    def ask(self, n: int) -> list[int]:
        out: list[int] = []
        want = min(n, self.left)
        rejects = 0
        while len(out) < want and self._walking is None and self.total:
            p = self.position(self._rng.randrange(self.total))
            if p not in out and self.usable(p):
                out.append(p)
                continue
            rejects += 1
            if rejects > REJECTS_PER_CONFIG * max(want, 1):
                self._walking = self.walk(self._rng.randrange(self.total))
        return self.walked(out, want)


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise TuneFailure.invalid(
            "policy.strategy 'bayes' needs Optuna: pip install 'tuning-farm[bayes]'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class Bayes(_Budgeted):
    """Optuna's TPE sampler over the spaces' parameters (a categorical choice of space when there are several).

    Numeric parameters are suggested as indices into their sorted values, so TPE sees their order; strings and
    bools are categorical. A failed config is told a penalty; an infeasible, excluded or already proposed
    suggestion is told back at once (the penalty, or its known ratio) and another is asked. After a few such
    rejections per config, or once half the space is proposed, the rest is walked from a seeded start."""

    name = "bayes"
    adaptive = True

    def __init__(self, roster: Roster, max_configs: int | None, seed: int, exclude: Exclude) -> None:
        super().__init__(roster, max_configs, exclude)
        optuna = _optuna()
        self._optuna = optuna
        with warnings.catch_warnings():  # multivariate TPE and the constant liar are marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True, multivariate=True,
                                                 n_startup_trials=10)
        self._study = optuna.create_study(direction="minimize", sampler=sampler)
        self._pending: dict[int, Any] = {}  # position -> its running Optuna trial
        self._known: dict[int, float | None] = {}
        self._rng = random.Random(seed)

    def _suggest(self, trial: Any) -> int:
        if len(self.segments) == 1:
            segment = self.segments[0]
        else:
            names = [s.space.name for s in self.segments if s.space is not None]
            chosen = trial.suggest_categorical("space", names)
            segment = self.segments[names.index(chosen)]
        space = segment.space
        assert space is not None
        config: dict[str, Any] = {}
        for p, values in space.params:
            key = f"{space.name}.{p}" if len(self.segments) > 1 else p
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                ordered = sorted(values)
                config[p] = ordered[trial.suggest_int(key, 0, len(ordered) - 1)]
            else:
                config[p] = values[trial.suggest_categorical(key, list(range(len(values))))]
        return segment.start + space.rank(config)

    def ask(self, n: int) -> list[int]:
        out: list[int] = []
        want = min(n, self.left)
        rejects = 0
        while len(out) < want and self._walking is None and self.total:
            if len(self.proposed) + len(out) >= self.total // 2:  # a nearly spent space: the model adds nothing
                self._walking = self.walk(self._rng.randrange(self.total))
                break
            trial = self._study.ask()
            p = self._suggest(trial)
            if p in out or p in self._pending:
                self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
            elif self.usable(p):
                self._pending[p] = trial
                out.append(p)
                continue
            else:  # proposed before (its known ratio), infeasible or excluded: the model learns it at once
                known = self._known.get(p)
                self._study.tell(trial, PENALTY if known is None else known)
            rejects += 1
            if rejects > BAYES_REJECTS_PER_CONFIG * max(want, 1):
                self._walking = self.walk(self._rng.randrange(self.total))
        return self.walked(out, want)

    def tell(self, results: Sequence[tuple[int, float | None]]) -> None:
        for position, ratio in results:
            self._known[position] = ratio
            trial = self._pending.pop(position, None)
            if trial is None:
                if position in self.proposed:  # an adopted config (a prior's): the model learns it as a trial
                    self._add(position, PENALTY if ratio is None else ratio)
                continue
            self._study.tell(trial, PENALTY if ratio is None else ratio)

    def _add(self, position: int, value: float) -> None:
        """Tell TPE the result of a config it did not suggest: the parameters ``_suggest`` would have chosen."""
        distributions, params = self._optuna.distributions, dict[str, Any]()
        index = next(n for n, s in enumerate(self.segments) if s.start <= position < s.start + s.size)
        segment = self.segments[index]
        space = segment.space
        assert space is not None
        dists: dict[str, Any] = {}
        if len(self.segments) > 1:
            names = [s.space.name for s in self.segments if s.space is not None]
            dists["space"], params["space"] = distributions.CategoricalDistribution(names), space.name
        config = space.config(position - segment.start)
        for p, values in space.params:
            key = f"{space.name}.{p}" if len(self.segments) > 1 else p
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                ordered = sorted(values)
                dists[key], params[key] = distributions.IntDistribution(0, len(ordered) - 1), ordered.index(config[p])
            else:
                choices = list(range(len(values)))
                dists[key], params[key] = distributions.CategoricalDistribution(choices), values.index(config[p])
        self._study.add_trial(self._optuna.trial.create_trial(params=params, distributions=dists, value=value))

