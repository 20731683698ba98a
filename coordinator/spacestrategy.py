"""The farm's search of a tunable set's spaces: a coordinator :class:`~farm_coordinator.strategy.Strategy` around
a ``farm.strategies.Sampler`` (exhaustive, random, bayes or local, ``max_configs``, ``seed`` from the catalog's
[policy]).

The plan names the listed candidates (``plan_groups`` leaves the spaces out when :func:`searches_spaces`); they run
first, group after group, as with :class:`~farm_coordinator.strategy.PriorityGroups`. Then the spaces are searched,
each config sent as its own group task named ``s<round>.<position>``, at most ``capacity`` (the live devices of the
fingerprint) in flight at once:

- a sampler whose proposals do not depend on results (exhaustive, random) is asked for configs whenever a device
  is free: its groups are all named ``s0.<position>`` and the configs it proposed are recomputed from a fresh
  sampler (the same seed gives the same sequence), so a device never waits for the slowest config of a batch;
- an adaptive sampler (bayes, local) is searched in rounds: a round asks for ``capacity`` configs; once every group of
  the round has a result the results are told (a ratio, or None for a config that failed or lost) and the next
  round is asked.

**Fleet priors.** A problem planned with other fingerprints' decisions of its family (``plan.family.fleet_priors``,
``farm_coordinator.plan``) starts with their best configs (``farm.priors.PriorFirst``): they are sent in rounds of
their own, ``p<round>.<position>``, at most ``capacity`` at once, each round's results told before the next is
asked (the priors' weights follow this device's results, so a misleading source is muted after a round or two);
the sampler adopts them (never proposes them again; they count toward ``max_configs``) and is told their results.
When the priors propose nothing more, the sampler's own groups follow as above.

The search ends when the sampler has nothing more (its end, or ``max_configs``) or when the budget answered a
group NOT_TRIED. A config the compile stage rejected (the plan's REJECTED outcomes) is never asked. Pure in its inputs: each ``propose`` builds the sampler afresh and brings it to where the group
names and results show (``farm.strategies.replay`` for rounds), so a coordinator killed mid-search and restarted
asks the same groups again and reuses their stored results (``coordinator/run.py`` looks stored results up
before it sends a sampler's group); a config asked before the kill whose result never came is asked again.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Collection, Mapping, Sequence

from farm.policy import StackPolicy
from farm.priors import PriorFirst
from farm.roster import Roster
from farm.scoring import judge
from farm.spacesearch import covered_positions
from farm.strategies import Sampler, make_sampler, replay
from farm.trials import TrialVerdict
from farm.tunable import TunableSet
from farm_coordinator.plan import PlannedProblem, searches_spaces
from farm_coordinator.racing import final_group, parse_final, race_state
from farm_coordinator.strategy import PRIORITY_GROUPS, Ask, Strategy
from farm_fleet.protocol import STATUS_NOT_TRIED, STATUS_OK, GroupResult

_GROUP = re.compile(r"s(\d+)\.(\d+)\Z")
_PRIOR_GROUP = re.compile(r"p(\d+)\.(\d+)\Z")
_TIMED = (TrialVerdict.PASSED, TrialVerdict.UNVERIFIED)


def strategy_for(policy: StackPolicy) -> Strategy:
    """The coordinator strategy a run under ``policy`` uses: a space search races its configs under
    ``screening = "race"`` (:class:`RaceSearch`)."""
    if not searches_spaces(policy):
        return PRIORITY_GROUPS
    return RaceSearch(policy) if policy.screening == "race" else SpaceSearch(policy)


def group_name(round_no: int, position: int) -> str:
    """The group of one config of a round: ``s3.1042`` (round index 3, roster position 1042)."""
    return f"s{round_no}.{position}"


def parse_group(name: str) -> tuple[int, int] | None:
    """(round, position) of a space search's group name, or None for another group."""
    match = _GROUP.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def prior_group(round_no: int, position: int) -> str:
    """The group of one config the fleet priors proposed: ``p0.1042`` (their round 0, roster position 1042)."""
    return f"p{round_no}.{position}"


def parse_prior_group(name: str) -> tuple[int, int] | None:
    """(round, position) of a priors' group name, or None for another group."""
    match = _PRIOR_GROUP.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def searched(name: str) -> bool:
    """Whether ``name`` is a space search's group (the sampler's or the priors')."""
    return parse_group(name) is not None or parse_prior_group(name) is not None


def _roster(operation: str, device_kind: str) -> Roster:
    from farm_kernels import recorded

    return _roster_of(recorded.tunable(operation, device_kind))


@functools.lru_cache(maxsize=64)
def _roster_of(tunable: TunableSet) -> Roster:
    """A tunable set's roster, built once per set object (an operation registered anew gets its own)."""
    return tunable.roster()


def excluded_positions(roster: Roster, plan: PlannedProblem) -> Callable[[int], bool] | None:
    """The configs never to ask: those the compile stage rejected (the plan's REJECTED outcomes,
    ``farm_coordinator.precompile``) and, for a grown space, those its family's earlier search covered (the
    stored winner among them is a planned group); None when there are none."""
    names = {o.name for o in plan.skipped if o.verdict is TrialVerdict.REJECTED}
    prior = plan.family.prior if plan.family is not None else None
    if prior is None:
        return (lambda position: roster.names[position] in names) if names else None
    covered = covered_positions(roster, prior)
    return lambda position: covered(position) or roster.names[position] in names


def _replayed(prior: PriorFirst, rounds: Sequence[Sequence[tuple[int, float | None]]]) -> bool:
    """Bring ``prior`` through its stored rounds (each re-asked, then told); False at the first round it would not
    ask again."""
    for told in rounds:
        if sorted(prior.lead(len(told))) != sorted(p for p, _ in told):
            return False
        prior.tell(told)
    return True


class SpaceSearch:
    """The listed candidates' groups, then the spaces in rounds; see the module docstring. ``rosters``: how a
    problem's roster is found (default: the kernel registry's tunable set for the operation and device kind)."""

    def __init__(self, policy: StackPolicy, rosters: Callable[[str, str], Roster] | None = None) -> None:
        self.policy = policy
        self.rosters: Callable[[str, str], Roster] = rosters or _roster

    def propose(self, plan: PlannedProblem, results: Mapping[str, GroupResult], in_flight: Collection[str],
                capacity: int) -> Sequence[Ask]:
        if any(t.group not in results for t in plan.tasks):
            return PRIORITY_GROUPS.propose(plan, results, in_flight, capacity)
        if any(r.status == STATUS_NOT_TRIED for r in results.values()):
            return ()  # the budget is spent
        roster = self.rosters(plan.tasks[0].operation, plan.tasks[0].device_kind)
        if not roster.has_spaces:
            return ()
        def fresh() -> Sampler:
            return make_sampler(roster, self.policy, excluded_positions(roster, plan))

        sampler = fresh()
        adaptive = sampler.adaptive
        sources = plan.family.fleet_priors if plan.family is not None else ()
        if sources:
            led = self._led(roster, PriorFirst(sampler, roster, sources, self.policy.max_configs, roster.names[0]),
                            fresh, results, in_flight, capacity)
            if not isinstance(led, PriorFirst):
                return led  # the priors' next round, or nothing while one is out
            sampler = led
        pending = [g for g in in_flight if parse_group(g) is not None]
        if not adaptive:
            return self._free(roster, sampler, results, pending, capacity)
        if pending:
            return ()  # wait for the round
        rounds: dict[int, list[tuple[int, float | None]]] = {}
        for group, result in results.items():
            parsed = parse_group(group)
            if parsed is not None:
                rounds.setdefault(parsed[0], []).append((parsed[1], self.ratio(roster, parsed[1], result)))
        if sorted(rounds) != list(range(len(rounds))):
            return ()  # a gap: these results are not this search's
        try:
            sampler = replay(sampler, [rounds[r] for r in range(len(rounds))])
        except (ValueError, IndexError):
            return ()  # stored rounds of another roster, policy or seed: nothing more to ask
        asks = sampler.ask(max(1, capacity))
        return [Ask(group_name(len(rounds), p), ((roster.names[p], roster[p].revision),)) for p in asks]

    def _led(self, roster: Roster, prior: PriorFirst, fresh: Callable[[], Sampler],
             results: Mapping[str, GroupResult], in_flight: Collection[str], capacity: int) -> PriorFirst | Sequence[Ask]:
        """The priors' phase: ``prior`` brought to where the stored ``p`` rounds left it (each re-asked and told),
        then their next round; ``prior`` itself once they propose nothing more (the sampler's turn, for good).
        Nothing while a round is out. Stored rounds the priors would not ask again (a coordinator restarted after
        the fleet published another decision of the family, or one whose round was cut short) end the priors'
        phase: a ``fresh()`` sampler adopts and is told every stored priors' config, and takes over."""
        if any(parse_prior_group(g) is not None for g in in_flight):
            return ()
        rounds: dict[int, list[tuple[int, float | None]]] = {}
        for group, result in results.items():
            parsed = parse_prior_group(group)
            if parsed is not None:
                rounds.setdefault(parsed[0], []).append((parsed[1], self.ratio(roster, parsed[1], result)))
        ordered = [rounds[r] for r in sorted(rounds)]
        if sorted(rounds) != list(range(len(rounds))) or not _replayed(prior, ordered):
            inner = fresh()
            stored = [result for told in ordered for result in told]
            inner.adopt([p for p, _ in stored])
            inner.tell(stored)
            done = PriorFirst(inner, roster, (), self.policy.max_configs, roster.names[0])
            done.lead(1)  # no sources: done at once
            return done
        asks = prior.lead(max(1, capacity))
        if not asks:
            return prior
        return [Ask(prior_group(len(rounds), p), ((roster.names[p], roster[p].revision),)) for p in asks]

    @staticmethod
    def _free(roster: Roster, sampler: Sampler, results: Mapping[str, GroupResult], pending: Sequence[str],
              capacity: int) -> Sequence[Ask]:
        """A non-adaptive sampler's next configs for the free devices: those it proposed that have neither a
        result nor a group in flight (asked before a restart), then new ones."""
        free = max(1, capacity) - len(pending)
        if free <= 0:
            return ()
        known = {parsed[1] for g in (*results, *pending) if (parsed := parse_group(g)) is not None}
        # The sampler's sequence up to every known config: at most ``capacity`` configs were in flight when a
        # coordinator stopped, so the holes are few; beyond that the groups are another search's.
        proposed: list[int] = []
        while (missing := len(known - set(proposed))) and len(proposed) <= len(known) + 2 * max(1, capacity):
            more = sampler.ask(missing)
            if not more:
                break
            proposed += more
        if not known <= set(proposed):
            return ()  # groups of another roster, policy or seed: nothing more to ask
        asks = [p for p in proposed if p not in known][:free]
        asks += sampler.ask(free - len(asks)) if len(asks) < free else []
        return [Ask(group_name(0, p), ((roster.names[p], roster[p].revision),)) for p in asks]

    def ratio(self, roster: Roster, position: int, result: GroupResult) -> float | None:
        """What the sampler is told of one config: its judged ratio, None when it failed or was not timed."""
        if result.status != STATUS_OK:
            return None
        name = roster.names[position]
        outcome = next((o for o in result.outcomes if o.name == name), None)
        if outcome is None or outcome.verdict not in _TIMED or not outcome.pairs:
            return None
        return judge(outcome.pairs, self.policy).ratio


class RaceSearch(SpaceSearch):
    """A :class:`SpaceSearch` under ``screening = "race"`` (docs/farm.md, "Racing on the farm"): the same configs
    in the same groups, each sent with the incumbent and the noise of the race the stored results show
    (``farm_coordinator.racing.race_state``), the sampler told each config's estimated ratio to the reference;
    once the space search proposes nothing more (its end, ``max_configs`` or the budget) and no config is in
    flight, the incumbent other than the reference gets its full trials against the reference in one final group
    (``final.<position>``, sent even when the budget is spent), unless a listed candidate's full verdict made it
    the incumbent. Pure in its inputs like SpaceSearch: a restarted coordinator rebuilds the same race."""

    def propose(self, plan: PlannedProblem, results: Mapping[str, GroupResult], in_flight: Collection[str],
                capacity: int) -> Sequence[Ask]:
        if any(t.group not in results for t in plan.tasks):
            return PRIORITY_GROUPS.propose(plan, results, in_flight, capacity)
        if any(parse_final(g) is not None for g in (*results, *in_flight)):
            return ()  # the race is over: its winner's final group is out or back
        roster = self.rosters(plan.tasks[0].operation, plan.tasks[0].device_kind)
        race = race_state(roster.names[0], results, self.policy)
        space = _Told(self.policy, lambda operation, kind: roster, race.estimates)
        asks = space.propose(plan, results, in_flight, capacity)
        if asks:
            position = roster.position(race.incumbent)
            assert position is not None, race.incumbent
            incumbent = (race.incumbent, roster[position].revision)
            return [dataclasses.replace(a, incumbent=incumbent, noise=race.noise) for a in asks]
        if any(searched(g) for g in in_flight) or race.incumbent == roster.names[0] or race.seeded:
            return ()  # configs still racing, or no final trials to take
        position = roster.position(race.incumbent)
        assert position is not None, race.incumbent
        return [Ask(final_group(position), ((race.incumbent, roster[position].revision),), whole_budget=True)]


class _Told(SpaceSearch):
    """A SpaceSearch whose sampler is told the race's estimated ratios to the reference."""

    def __init__(self, policy: StackPolicy, rosters: Callable[[str, str], Roster],
                 estimates: Mapping[str, float | None]) -> None:
        super().__init__(policy, rosters)
        self.estimates = estimates

    def ratio(self, roster: Roster, position: int, result: GroupResult) -> float | None:
        return self.estimates.get(roster.names[position])
