"""The in-process search of a tunable set with spaces: plain candidates as always, then a strategy's configs.

Every config a strategy proposes goes through the same trial protocol as a plain candidate (validated against
the reference first, then full paired timings): a wrong output or an error is a verdict, never a winner, and
only a decided win clearing ``min_speedup`` beats the reference. The budget bounds the whole search.

**Incremental spaces.** After a search that covered its spaces completely, a *family record* remembers which
parameter values it covered (``family_key``: the cache key with each space's value lists left out). When a space
grows, the next search finds that record, evaluates the stored winner again (a full verdict, against the same
reference timings as the new configs) and only the configs the old space lacked; the plain candidates, already
judged, are not tried again. The decision's ``covered`` names the configs it covers.
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
from farm.space import Space, format_value
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

# Configs proposed per ask: the in-process search is serial, the batch only sizes the strategy's rounds.
ROUND = 8

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


def family_entries(roster: Roster) -> dict[str, Candidate]:
    """Each space's key entry (its descriptor) -> the entry its family record lists instead (values left out)."""
    return {s.space.descriptor(): Candidate(f"{s.space.name}[*]", hashlib.sha256(s.space.family().encode()).hexdigest()[:32])
            for s in roster.spaces() if s.space is not None}


def family_key(problem: Problem, roster: Roster, reference: int, policy: StackPolicy) -> str:
    """The key of a roster's family record: its cache key with each space named by its family, not its values."""
    return family_of_key(CacheKey.of(problem, roster.key_entries, reference, policy), family_entries(roster))


def family_of_key(key: CacheKey | str, entries: Mapping[str, Candidate]) -> str:
    """The family record's key of a decision's cache key: each space descriptor ``entries`` names replaced by its
    family entry (:func:`family_entries`; the farm's coordinator has them from planning, a worker the key)."""
    decoded = CacheKey.decode(key) if isinstance(key, str) else key
    return decoded.replace(candidates=tuple(entries.get(c.name, c) for c in decoded.candidates)).encode()


def family_record(record: DecisionRecord, key: str) -> DecisionRecord:
    """A decision as its family record (under the family ``key``, :func:`family_of_key`): its meta names the
    winner (what the next search judges again); its index points at the winner's entry in the family key (the
    reference, a listed candidate, or the ``space[*]`` entry of the winner's space), so the record is a valid one
    for its key wherever it travels (archives check that the winner is the key's candidate at its index)."""
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
    if not all(isinstance(lists, dict) and all(isinstance(v, list) for v in lists.values()) for lists in covered.values()):
        return None
    return Prior(covered, winner)


def was_covered(space: Space, config: Mapping[str, Any], covered: Covered) -> bool:
    """Whether an earlier search that covered ``covered`` (a family record's value lists) judged ``config``."""
    lists = covered.get(space.name)
    if lists is None:
        return False
    return all(format_value(v) in {format_value(x) for x in lists.get(p, [])} for p, v in config.items())


def covered_positions(roster: Roster, prior: Prior | None) -> Callable[[int], bool]:
    """Whether the config at a roster position was judged by the search ``prior`` records (never, without one):
    a grown space's search leaves those out (the stored winner among them is judged again, as a listed one)."""
    if prior is None:
        return lambda position: False

    def covered(position: int) -> bool:
        segment, rank = roster.locate(position)
        return segment.space is not None and was_covered(segment.space, segment.space.config(rank), prior.covered)

    return covered


def explore(
    runner: TrialRunner, policy: StackPolicy, reference: int, roster: Roster, banned: Collection[str], prior: Prior | None,
    sources: Sequence[Source] = (),
) -> Explored:
    """Time the reference, try the admitted plain candidates (all of them, or only a prior's winner), then the
    strategy's configs (the best of other devices' rankings ``sources`` first: farm.priors), within the policy's
    budget. Raises what :func:`farm.search.search` raises."""
    names = roster.names
    plain, refused = admit(roster, reference, policy, order=roster.plain_positions, banned=banned)
    first = plain  # a grown space's search re-judges only the stored winner among what it covered
    if prior is not None:
        winner = roster.position(prior.winner)
        first, refused = ([winner] if winner is not None and winner != reference else []), []

    sampler = make_sampler(roster, policy, covered_positions(roster, prior))  # before any trial: a missing Optuna fails at once
    if sources:
        sampler = PriorFirst(sampler, roster, sources, policy.max_configs, names[reference])
    estimates: dict[str, float | None] = {}
    started = time.monotonic()
    deadline = started + policy.budget
    reference_times = reference_trials(runner, policy, reference, names[reference])
    race = Race(runner, policy, reference, names, reference_times, deadline) if policy.screening == "race" else None
    outcomes: list[Outcome] = list(refused)
    exhausted = False
    evaluated = 0

    def attempt(position: int, proposed: bool = True) -> float | None:
        nonlocal exhausted, evaluated
        cand = roster[position]
        note = pre_trial_skip(cand, policy, cand.name in banned)
        if note is not None:
            outcomes.append(Outcome(position, cand.name, verdict=TrialVerdict.SKIPPED, note=note, revision=cand.revision))
            return None
        if exhausted or time.monotonic() > deadline:
            exhausted = True
            outcomes.append(Outcome(position, cand.name, verdict=TrialVerdict.NOT_TRIED, note=budget_note(policy.budget),
                                    revision=cand.revision, budget_exhausted=True))
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
        if outcome.failure is not None:
            return None
        return judge(outcome.pairs, policy).ratio

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
    """What a spaced decision's record carries beyond the decision (none for a set without spaces): the effort
    (strategy, seed, max_configs, evaluated, space_size), the configs covered, the winner's name, the best
    ``RANKED`` configs with their ratios (``ranked``: what another SKU reads as a prior) and the priors used."""
    if spaced is None:
        return {}
    return {"strategy": policy.strategy, "seed": policy.seed, "max_configs": policy.max_configs,
            "evaluated": spaced.evaluated, "space_size": spaced.space_size, "covered": spaced.covered,
            "winner": winner, "incremental": spaced.incremental, "priors": list(spaced.priors),
            "ranked": [[n, r] for n, r in spaced.estimates[:RANKED]]}


def decided(
    key: str, problem: Problem, candidates: Sequence[Candidate], index: int, reference: int, name: str,
    verified: bool, ratio: float, created: float, policy: StackPolicy, spaced: Explored | None,
    cost: Mapping[str, float] | None = None,
) -> list[DecisionRecord]:
    """The records a search stores: its decision (with :func:`space_meta` and the search's ``cost``: device and
    compile seconds), plus the family record of a search that covered its spaces (what a grown space's next
    search looks for)."""
    meta = {**space_meta(policy, spaced, name), **(cost or {})}
    record = DecisionRecord(key, index, reference, name, verified, ratio, created, meta)
    if spaced is None or spaced.covered is None or not isinstance(candidates, Roster):
        return [record]
    return [record, family_record(record, family_key(problem, candidates, reference, policy))]


def search_report(problem: Problem, winner: str, elapsed: float, budget_exhausted: bool,
                  candidates: tuple[CandidateReport, ...], policy: StackPolicy, spaced: Explored | None) -> TuneReport:
    """A search's report, with its space figures when it searched spaces."""
    report = TuneReport(problem.operation, problem.environment, problem.workload, problem.execution_context, winner,
                        elapsed, budget_exhausted, candidates)
    if spaced is None:
        return report
    return dataclasses.replace(report, evaluated=spaced.evaluated, space_size=spaced.space_size,
                               strategy=policy.strategy, seed=policy.seed, max_configs=policy.max_configs,
                               covered=spaced.covered, incremental=spaced.incremental,
                               estimates=spaced.estimates, priors=spaced.priors)


def searched(
    runner: TrialRunner, policy: StackPolicy, reference: int, candidates: Sequence[Candidate], banned: Collection[str],
    problem: Problem, stored: Callable[[str, bool], DecisionRecord | None],
) -> tuple[list[Outcome], tuple[float, ...], bool, Explored | None]:
    """A miss's search: a plain list through :func:`farm.search.search` (Outcomes of refused candidates
    included), a roster with spaces through :func:`explore`, incremental when ``stored(family key, persistent)``
    finds a fresh family record. Returns the outcomes in position order, the reference's timings, whether the
    search stopped early, and the spaced search (None for a plain list). Other devices' priors come from
    :func:`farm.priors.using` (``farm.tune(priors=...)``); the farm's engine gives none."""
    spaced = None
    if isinstance(candidates, Roster) and candidates.has_spaces:
        family = stored(family_key(problem, candidates, reference, policy), problem.persistent)
        fresh = family is not None and family.is_fresh(time.time(), policy.ttl)
        spaced = explore(runner, policy, reference, candidates, banned,
                         prior_of(family.meta) if family is not None and fresh else None, active())
        outcomes, times = spaced.outcomes, spaced.reference_times
    else:
        admitted, refused = admit(candidates, reference, policy, banned=banned)
        found = search(runner, policy, reference, candidates, admitted, banned=banned)
        outcomes, times = (*found.outcomes, *refused), found.reference_times
    ordered = sorted(outcomes, key=lambda o: o.index)
    exhausted = any(o.budget_exhausted for o in ordered) or (spaced is not None and spaced.budget_exhausted)
    return ordered, times, exhausted, spaced
