"""The in-process search of a tunable set with spaces: plain candidates as always, then a strategy's configs.

A search that covered its spaces also stores a *family record* (:func:`family_key`), so a grown space's next
search judges only the stored winner and the new configs (docs/spaces.md, "Incremental spaces").
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from farm.decisions import TuneReport
from farm.identity import CacheKey, Candidate, Problem
from farm.policy import StackPolicy
from farm.priors import RANKED, PriorFirst, Source, active, ranked
from farm.racing import Race
from farm.roster import Roster
from farm.runner import TrialRunner
from farm.scoring import judge
from farm.search import admit, budget_note, search
from farm.space import format_value
from farm.stores.base import DecisionRecord
from farm.strategies import make_sampler, space_size
from farm.trials import (
    CandidateReport,
    Outcome,
    TrialVerdict,
    candidate_trials,
    pre_trial_skip,
    reference_trials,
)

ROUND = 8  # configs proposed per ask: the search is serial, the batch only sizes the strategy's rounds

Covered = dict[str, dict[str, list[Any]]]


@dataclass(frozen=True)
class Prior:
    """What a family record says: the configs an earlier complete search covered, and its winner's name."""

    covered: Covered
    winner: str


@dataclass(frozen=True)
class Explored:
    """A spaced search: the reference's timings, an Outcome per candidate and config tried or refused, whether
    it stopped early, how many configs it evaluated, and the configs the decision covers (None: not all)."""

    reference_times: tuple[float, ...]
    outcomes: tuple[Outcome, ...]
    budget_exhausted: bool
    evaluated: int
    space_size: int
    covered: Covered | None
    incremental: bool
    estimates: tuple[tuple[str, float], ...] = ()  # every config evaluated, best first (farm.priors.ranked)
    priors: tuple[str, ...] = ()  # the priors that ordered it (their fingerprints)


def family_key(problem: Problem, roster: Roster, reference: int, policy: StackPolicy) -> str:
    """The key of a roster's family record: its cache key with each space's entry replaced by ``name[*]`` and
    a digest of the space's family (its values left out)."""
    key = CacheKey.of(problem, roster.key_entries, reference, policy)
    spaces = [s.space for s in roster.spaces() if s.space is not None]
    family = {s.descriptor(): Candidate(f"{s.name}[*]", hashlib.sha256(s.family().encode()).hexdigest()[:32])
              for s in spaces}
    return key.replace(candidates=tuple(family.get(c.name, c) for c in key.candidates)).encode()


def family_record(record: DecisionRecord, key: str) -> DecisionRecord:
    """A decision as its family record under the family ``key``: its meta names the winner; its index points
    at the winner's entry in the key (a listed one, or its space's ``space[*]``), valid for archives."""
    names = CacheKey.decode(key).names
    entry = record.name if record.name in names else record.name.split("[", 1)[0] + "[*]"
    index = names.index(entry) if entry in names else record.reference_index
    return dataclasses.replace(record, cache_key=key, index=index, name=names[index],
                               meta={**record.meta, "winner": record.name})


def covered_by(roster: Roster) -> Covered:
    """Every space's value lists (what a complete search of the roster covers)."""
    return {s.space.name: {p: list(v) for p, v in s.space.params} for s in roster.spaces() if s.space is not None}


def prior_of(meta: Mapping[str, Any]) -> Prior | None:
    """The Prior a family record's meta holds, or None for a malformed one (then the search is not incremental)."""
    covered, winner = meta.get("covered"), meta.get("winner")
    if not isinstance(covered, dict) or not isinstance(winner, str):
        return None
    if all(isinstance(d, dict) and all(isinstance(v, list) for v in d.values()) for d in covered.values()):
        return Prior(covered, winner)
    return None


def covered_positions(roster: Roster, prior: Prior | None) -> Callable[[int], bool]:
    """Whether the config at a roster position was judged by the search ``prior`` records (never, without one):
    a grown space's search leaves those out (the stored winner among them is judged again, as a listed one)."""

    def covered(position: int) -> bool:
        segment, rank = roster.locate(position)
        space = segment.space
        lists = None if prior is None or space is None else prior.covered.get(space.name)
        if space is None or lists is None:
            return False
        config = space.config(rank)
        return all(format_value(v) in {format_value(x) for x in lists.get(p, [])} for p, v in config.items())

    return covered


def explore(runner: TrialRunner, policy: StackPolicy, reference: int, roster: Roster, banned: Collection[str],
            prior: Prior | None, sources: Sequence[Source] = ()) -> Explored:
    """Time the reference, try the admitted plain candidates (or only a prior's winner), then the strategy's
    configs (``sources``' best first) within the budget. Raises what :func:`farm.search.search` raises."""
    names = roster.names
    first, refused = admit(roster, reference, policy, order=roster.plain_positions, banned=banned)
    if prior is not None:  # a grown space's search re-judges only the stored winner among what it covered
        winner = roster.position(prior.winner)
        first, refused = ([winner] if winner is not None and winner != reference else []), []
    sampler = make_sampler(roster, policy, covered_positions(roster, prior))  # a missing Optuna fails at once
    if sources:
        sampler = PriorFirst(sampler, roster, sources, policy.max_configs, names[reference])
    estimates: dict[str, float | None] = {}
    deadline = time.monotonic() + policy.budget
    reference_times = reference_trials(runner, policy, reference, names[reference])
    race = Race(runner, policy, reference, names, reference_times, deadline) if policy.screening == "race" else None
    outcomes: list[Outcome] = list(refused)
    exhausted = False
    evaluated = 0

    def attempt(position: int, proposed: bool = True) -> float | None:
        nonlocal exhausted, evaluated
        cand = roster[position]
        note, verdict = pre_trial_skip(cand, policy, cand.name in banned), TrialVerdict.SKIPPED
        if note is None and (exhausted or time.monotonic() > deadline):
            exhausted, note, verdict = True, budget_note(policy.budget), TrialVerdict.NOT_TRIED
        if note is not None:
            outcomes.append(Outcome(position, cand.name, verdict=verdict, note=note, revision=cand.revision,
                                    budget_exhausted=verdict is TrialVerdict.NOT_TRIED))
            return None
        evaluated += proposed
        if race is not None and proposed:  # a config: raced against the incumbent
            estimate = race.enter(position, cand.revision)
            exhausted = exhausted or race.exhausted
            return estimate
        outcome = candidate_trials(runner, policy, reference, position, names, deadline)
        exhausted = exhausted or outcome.budget_exhausted
        outcomes.append(dataclasses.replace(outcome, revision=cand.revision))
        if race is not None:
            race.seed(outcome)  # a listed candidate (or a grown space's stored winner) the race may start from
        return None if outcome.failure is not None else judge(outcome.pairs, policy).ratio

    for position in first:
        estimates[names[position]] = attempt(position, proposed=False)
    while not exhausted:
        asked = sampler.ask(ROUND)
        if not asked:
            break
        told = [(p, attempt(p)) for p in asked]
        estimates.update((names[p], r) for p, r in told)
        sampler.tell(told)
    if race is not None:
        raced = race.finish()
        estimates.update((names[p], r) for p, r in raced.estimates.items())
        outcomes.extend(raced.outcomes)
        exhausted = exhausted or raced.budget_exhausted
    stopped_by_limit = policy.max_configs is not None and evaluated >= policy.max_configs
    complete = not exhausted and not stopped_by_limit and policy.strategy == "exhaustive"
    if stopped_by_limit and policy.strategy == "exhaustive":
        exhausted = True  # SEMANTICS: the search stopped before trying every eligible candidate
    return Explored(tuple(reference_times), tuple(outcomes), exhausted or any(o.budget_exhausted for o in refused),
                    evaluated, space_size(roster), covered_by(roster) if complete else None, prior is not None,
                    tuple(ranked(estimates, names[reference])), tuple(s.name for s in sources))


def space_meta(policy: StackPolicy, spaced: Explored | None, winner: str) -> dict[str, Any]:
    """What a spaced decision's record carries beyond the decision ({} without spaces): the search's figures,
    the winner, the priors used and the best ``RANKED`` configs (``ranked``: what another SKU reads)."""
    if spaced is None:
        return {}
    return {**_figures(policy, spaced), "winner": winner, "priors": list(spaced.priors),
            "ranked": [[n, r] for n, r in spaced.estimates[:RANKED]]}


def _figures(policy: StackPolicy, spaced: Explored) -> dict[str, Any]:
    return {"strategy": policy.strategy, "seed": policy.seed, "max_configs": policy.max_configs,
            "evaluated": spaced.evaluated, "space_size": spaced.space_size, "covered": spaced.covered,
            "incremental": spaced.incremental}


def decided(key: str, problem: Problem, candidates: Sequence[Candidate], index: int, reference: int,
            name: str, verified: bool, ratio: float, created: float, policy: StackPolicy,
            spaced: Explored | None, cost: Mapping[str, float] | None = None) -> list[DecisionRecord]:
    """The records a search stores: its decision (with :func:`space_meta` and the search's ``cost``: device
    and compile seconds), plus the family record of a search that covered its spaces."""
    meta = {**space_meta(policy, spaced, name), **(cost or {})}
    record = DecisionRecord(key, index, reference, name, verified, ratio, created, meta)
    if spaced is None or spaced.covered is None or not isinstance(candidates, Roster):
        return [record]
    return [record, family_record(record, family_key(problem, candidates, reference, policy))]


def search_report(problem: Problem, winner: str, elapsed: float, budget_exhausted: bool,
                  candidates: tuple[CandidateReport, ...], policy: StackPolicy, spaced: Explored | None) -> TuneReport:
    """A search's report, with its space figures when it searched spaces."""
    figures = {} if spaced is None else {**_figures(policy, spaced), "estimates": spaced.estimates,
                                         "priors": spaced.priors}
    return TuneReport(problem.operation, problem.environment, problem.workload, problem.execution_context,
                      winner, elapsed, budget_exhausted, candidates, **figures)


def searched(runner: TrialRunner, policy: StackPolicy, reference: int, candidates: Sequence[Candidate],
             banned: Collection[str], problem: Problem, stored: Callable[[str, bool], DecisionRecord | None],
             ) -> tuple[list[Outcome], tuple[float, ...], bool, Explored | None]:
    """A miss's search: a plain list through :func:`farm.search.search`, a roster with spaces through
    :func:`explore` (incremental when ``stored(family key, persistent)`` finds a fresh family record; priors
    from :func:`farm.priors.using`). Returns the outcomes (refused ones too) in position order, the
    reference's timings, whether the search stopped early, and the spaced search (None for a plain list)."""
    spaced = None
    if isinstance(candidates, Roster) and candidates.has_spaces:
        family = stored(family_key(problem, candidates, reference, policy), problem.persistent)
        fresh = family is not None and family.is_fresh(time.time(), policy.ttl)
        prior = prior_of(family.meta) if family is not None and fresh else None
        spaced = explore(runner, policy, reference, candidates, banned, prior, active())
        outcomes, times = spaced.outcomes, spaced.reference_times
    else:
        admitted, refused = admit(candidates, reference, policy, banned=banned)
        found = search(runner, policy, reference, candidates, admitted, banned=banned)
        outcomes, times = (*found.outcomes, *refused), found.reference_times
    ordered = sorted(outcomes, key=lambda o: o.index)
    exhausted = any(o.budget_exhausted for o in ordered) or (spaced is not None and spaced.budget_exhausted)
    return ordered, times, exhausted, spaced
