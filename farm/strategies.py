"""Search strategies over a roster's spaces: which configs a search evaluates next, in ask/tell rounds.

One :class:`Sampler` per ``policy.strategy`` (docs/spaces.md, "Strategies"), deterministic in its inputs so
that a resumed search never re-runs a finished config (:func:`replay`). Every search tries plain candidates.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from farm.errors import TuneFailure
from farm.localsearch import LocalSearch
from farm.policy import StackPolicy
from farm.roster import Roster
from farm.sampler import Budgeted, Exclude, numeric
from farm.space import Space

REJECTS_PER_CONFIG = 64  # rejected draws (infeasible, seen, excluded) per config before walking the rest
BAYES_REJECTS_PER_CONFIG = 4  # each rejected TPE suggestion is a trial the model must fit again
# Told for a config that failed or cannot run: far above any ratio worth having (TPE ranks values).
PENALTY = 100.0


class Sampler(Protocol):
    """The ask/tell port every sampling strategy implements."""

    name: str
    adaptive: bool  # whether ``tell`` changes what ``ask`` proposes next

    def ask(self, n: int) -> list[int]: ...  # up to n configs not proposed yet; [] when it has nothing more

    def tell(self, results: Sequence[tuple[int, float | None]]) -> None: ...  # ratio None: failed, no ratio

    def usable(self, position: int) -> bool: ...  # not proposed yet, not excluded, feasible

    def adopt(self, positions: Sequence[int]) -> None: ...  # proposed for it (priors): never proposed again


def make_sampler(roster: Roster, policy: StackPolicy, exclude: Exclude | None = None) -> Sampler:
    """The policy's sampler over ``roster``'s spaces; ``exclude`` names positions never to propose (an
    incremental search's already-covered configs). INVALID_INPUT when bayes is chosen without Optuna."""
    samplers: dict[str, Callable[[Roster, int | None, int, Exclude], Sampler]] = {
        "exhaustive": Exhaustive, "random": RandomDraw, "bayes": Bayes, "local": LocalSearch}
    if policy.strategy not in samplers:
        raise TuneFailure.invalid(f"policy.strategy {policy.strategy!r} is not a strategy")
    return samplers[policy.strategy](roster, policy.max_configs, policy.seed, exclude or (lambda _p: False))


def replay(sampler: Sampler, rounds: Sequence[Sequence[tuple[int, float | None]]]) -> Sampler:
    """Bring a freshly built sampler to where stored ``rounds`` left it (each re-asked, its results told).
    ValueError when a round differs from the sampler's asks (another roster, policy or seed stored it)."""
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


class Exhaustive(Budgeted):
    """Every feasible config in position order."""

    name = "exhaustive"

    def ask(self, n: int) -> list[int]:
        if self._walking is None:
            self._walking = self.walk()
        return self.walked([], min(n, self.left))


class RandomDraw(Budgeted):
    """Distinct feasible configs drawn uniformly with a seed; after many rejected draws, the rest walked."""

    name = "random"

    def ask(self, n: int) -> list[int]:
        out: list[int] = []
        want = min(n, self.left)
        rejects = 0
        while len(out) < want and self._walking is None and self.total:
            p = self.position(self.rng.randrange(self.total))
            if p not in out and self.usable(p):
                out.append(p)
                continue
            rejects += 1
            if rejects > REJECTS_PER_CONFIG * max(want, 1):
                self._walking = self.walk(self.rng.randrange(self.total))
        return self.walked(out, want)


class Bayes(Budgeted):
    """Optuna's TPE over the spaces' parameters, numeric ones as indices into their sorted values; a rejected
    suggestion is told back at once; after a few per config, or once half the space is asked, a walk."""

    name = "bayes"
    adaptive = True

    def __init__(self, roster: Roster, max_configs: int | None, seed: int, exclude: Exclude) -> None:
        super().__init__(roster, max_configs, seed, exclude)
        try:
            import optuna
        except ImportError:
            raise TuneFailure.invalid("policy.strategy 'bayes' needs Optuna: "
                                      "pip install 'tuning-farm[bayes]'") from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        with warnings.catch_warnings():  # multivariate TPE and the constant liar are marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True, multivariate=True,
                                                 n_startup_trials=10)
        self._study = optuna.create_study(direction="minimize", sampler=sampler)
        self._pending: dict[int, Any] = {}  # position -> its running Optuna trial
        self._known: dict[int, float | None] = {}
        self._names = [s.space.name for s in self.segments if s.space is not None]

    def _params(self, space: Space) -> Iterator[tuple[str, str, list[Any], bool]]:
        """Each parameter, its Optuna name, its values (sorted when numeric) and whether it is numeric."""
        for p, values in space.params:
            key = f"{space.name}.{p}" if len(self.segments) > 1 else p
            yield p, key, sorted(values) if numeric(values) else list(values), numeric(values)

    def _suggest(self, trial: Any) -> int:
        segment = self.segments[0]
        if len(self.segments) > 1:
            segment = self.segments[self._names.index(trial.suggest_categorical("space", self._names))]
        space = segment.space
        assert space is not None
        config: dict[str, Any] = {}
        for p, key, values, ordered in self._params(space):
            index = (trial.suggest_int(key, 0, len(values) - 1) if ordered
                     else trial.suggest_categorical(key, list(range(len(values)))))
            config[p] = values[index]
        return segment.start + space.rank(config)

    def ask(self, n: int) -> list[int]:
        out: list[int] = []
        want = min(n, self.left)
        rejects = 0
        while len(out) < want and self._walking is None and self.total:
            half = len(self.proposed) + len(out) >= self.total // 2  # half spent: the model adds nothing
            if half or rejects > BAYES_REJECTS_PER_CONFIG * max(want, 1):  # walk the rest
                self._walking = self.walk(self.rng.randrange(self.total))
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
        return self.walked(out, want)

    def tell(self, results: Sequence[tuple[int, float | None]]) -> None:
        for position, ratio in results:
            self._known[position] = ratio
            value = PENALTY if ratio is None else ratio
            trial = self._pending.pop(position, None)
            if trial is not None:
                self._study.tell(trial, value)
            elif position in self.proposed:  # an adopted config (a prior's): the model learns it as a trial
                self._add(position, value)

    def _add(self, position: int, value: float) -> None:
        """Tell TPE the result of a config it did not suggest: the parameters ``_suggest`` would have chosen."""
        distributions = self._optuna.distributions
        segment, rank = self.roster.locate(position)
        space = segment.space
        assert space is not None
        dists: dict[str, Any] = {}
        params: dict[str, Any] = {}
        if len(self.segments) > 1:
            dists["space"], params["space"] = distributions.CategoricalDistribution(self._names), space.name
        config = space.config(rank)
        for p, key, values, ordered in self._params(space):
            dists[key] = (distributions.IntDistribution(0, len(values) - 1) if ordered
                          else distributions.CategoricalDistribution(list(range(len(values)))))
            params[key] = values.index(config[p])
        self._study.add_trial(self._optuna.trial.create_trial(params=params, distributions=dists, value=value))
