"""Expansion: catalog workloads x target fingerprints -> problems, each split into one task per priority group.

A run takes its problems one at a time from a :class:`Planner` (never the whole catalog expanded at once), so what
it holds grows with the problems it works on, not with the catalog.

Tasks name their candidates (name, revision); the coordinator never works with implementation indices. Which
groups are sent when is the search strategy's choice (``farm_coordinator.strategy``: today's rule runs the groups
one after the other, each carrying the budget the earlier ones left), so the budget bounds the problem's whole
search on the farm as in-process. Tiny groups travel
in batches (:func:`batch_size`, :func:`in_flight_limit`) so that the broker's cost per task is shared. A candidate
the fleet banned for a problem (``coordinator/bans.py``) is planned as SKIPPED for that problem only.

**Incremental spaces.** A problem whose tunable set has spaces has a *family* (:class:`SpaceFamily`): the same
problem with each space's value lists left out. A problem's id covers its spaces' value lists (a grown space is a
new problem), its family's id does not. A complete search's decision is indexed under the family's id too
(``farm_coordinator.publish``), and the Planner looks it up (``families``): when a space grew, the problem is
planned as the in-process search does it (``farm.spacesearch``): the stored winner and only the configs the old
space lacked, against the reference; the other listed candidates, judged before, are not planned again.

**Fleet priors.** A family also has an id across fingerprints (:meth:`Planner.fleet_family_id`: the same id without
the fingerprint; a recording's is its kernel's, ``farm_kernels.recorded.family``), and every spaced decision is
indexed under it too. A problem whose fingerprint has no earlier search of its family is planned with the
decisions of the same family on up to ``farm.priors.SOURCES`` other fingerprints (``fleet_priors``: the run's
decision store, and archives): its space search tries their best configs first (``farm.priors.PriorFirst``,
``farm_coordinator.spacestrategy``). Not to be confused with :class:`Prior`, this fingerprint's own earlier search.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.encoding import fields
from farm.policy import StackPolicy
from farm.priors import SOURCES, Source, from_records
from farm.roster import Roster
from farm.search import admit
from farm.spacesearch import Covered, Prior, covered_by, covered_positions, prior_of
from farm.stores.base import DecisionRecord
from farm.trials import Outcome, TrialVerdict
from farm_coordinator.catalog import Catalog, Workload
from farm_coordinator.partial import is_partial, judged_before
from farm_fleet.protocol import REFERENCE_GROUP, GroupTask, problem_id


@dataclass(frozen=True)
class Target:
    """A fingerprint with live devices of one kind; ``workers`` are their ids (confirmation picks among them)."""

    digest: str
    fingerprint: str
    device_kind: str
    workers: tuple[str, ...] = ()


@dataclass(frozen=True)
class SpaceFamily:
    """A problem's family (its tunable set has spaces): the family's id (a complete search's decision is indexed
    under it too), the value lists a complete search of this problem covers, and the family's earlier complete
    search found for it (None: a full search)."""

    problem_id: str
    covered: Covered
    prior: Prior | None = None
    fleet_id: str = ""  # the family's id across fingerprints (Planner.fleet_family_id): what priors are found by
    fleet_priors: tuple[Source, ...] = ()  # other fingerprints' decisions of the family its search starts from


# Where a Planner finds a family's last complete decision: (fingerprint digest, family ids) -> the records, by id.
Families = Callable[[str, list[str]], Mapping[str, DecisionRecord]]
# Where a Planner finds fleet priors: (family id across fingerprints, the digest to leave out, how many at most) ->
# (fingerprint digest, record) of other fingerprints' decisions of the family (the stores' ``priors``).
FleetPriors = Callable[[str, str, int], Sequence[tuple[str, DecisionRecord]]]


@dataclass(frozen=True)
class PlannedProblem:
    """What the catalog and the fingerprint fix about one problem of a run: its id, target and workload, its group
    tasks in plan order (under the run's id: the run a claim gives it is state, ``ProblemState.run``) and the
    candidates planning refused (``skipped``). Frozen: what a run learns about the problem lives on its board."""

    problem_id: str
    target: Target
    workload: Workload
    tasks: tuple[GroupTask, ...]
    skipped: tuple[Outcome, ...] = ()
    family: SpaceFamily | None = field(default=None, compare=False)
    continues: Mapping[str, Any] | None = field(default=None, compare=False)  # a partial decision's meta, continued

    def revision(self, name: str) -> str:
        """The revision of a candidate this problem's tasks name (KeyError for another name)."""
        revisions: dict[str, str] = dict(c for t in self.tasks for c in t.candidates)
        return revisions[name]

    def task(self, group: str) -> GroupTask | None:
        """The planned task of ``group``, or None for a group the plan does not name."""
        return next((t for t in self.tasks if t.group == group), None)

    def in_round(self, round_id: str) -> list[GroupTask]:
        """The planned tasks as sent under ``round_id``."""
        return [dataclasses.replace(t, run=round_id) for t in self.tasks]


@dataclass(frozen=True)
class Groups:
    """What planning decides once per (operation, device kind): the tunable's checksum, each priority group's
    candidates (name, revision) in plan order, and the Outcomes of the candidates ``admit`` refused."""

    checksum: str
    groups: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    refused: tuple[Outcome, ...]
    family: SpaceFamily | None = None  # its problem id left empty: Planner.problem fills it per problem
    family_checksum: str = ""  # what the family's id covers: the set's checksum, its spaces' values left out
    parts: dict[str, str] | None = None  # the set part by part (TunableSet.parts): each task's ``expects``

    @property
    def trials(self) -> int:
        return sum(len(candidates) for _, candidates in self.groups)


def searches_spaces(policy: StackPolicy) -> bool:
    """Whether a run searches spaces in rounds (``farm_coordinator.spacestrategy``: a strategy other than exhaustive,
    or a ``max_configs``); else a space's feasible configs are planned as candidates of its priority group."""
    return policy.strategy != "exhaustive" or policy.max_configs is not None


def plan_groups(operation: str, device_kind: str, catalog: Catalog, banned: Collection[str] = (),
                rejected: Mapping[str, str] | None = None, prior: Prior | None = None,
                continues: Mapping[str, Any] | None = None) -> Groups:
    """One task per priority group in plan order, naming the candidates ``farm.search.admit`` lets the search
    try (the same rule as in-process: skips, bans and ``max_candidates``); the others come back as Outcomes.
    Under :func:`searches_spaces` only the listed candidates are planned: a space is never enumerated here.
    ``rejected``: configs the compile stage rejected (name -> its verdict, ``farm_coordinator.precompile``), each
    an Outcome REJECTED with the verdict as its note, never planned (nor asked by a space search). ``prior``: the
    family's earlier complete search (a grown space): only its winner and the configs it did not cover
    are planned (a space search leaves the covered ones out too, ``farm_coordinator.spacestrategy``).
    ``continues``: the meta of this problem's partial decision (``farm_coordinator.partial``): its winner is
    planned first after the reference, then only the candidates its searches did not judge."""
    from farm_kernels import recorded

    tunable = recorded.tunable(operation, device_kind)
    roster = tunable.roster() if tunable.spaces else None
    if roster is not None and searches_spaces(catalog.policy):  # the spaces are the strategy's (SpaceSearch)
        order = [roster.indices[p] for p in roster.plain_positions]
    else:
        order = tunable.search_order()  # the cache key's candidate list: the reference first
    if roster is not None and prior is not None:
        order = _incremental(order, roster, prior)
    if continues is not None:
        order = _continued(order, tunable, continues)
    candidates = [tunable[i].candidate() for i in order]
    rejected = rejected or {}
    planned_names = {c.name for c in candidates}
    allowed = [p for p in range(len(candidates)) if p == 0 or candidates[p].name not in rejected]
    admitted, refused = admit(candidates, 0, catalog.policy, order=allowed, banned=banned)
    if rejected:
        refused += [Outcome(p, candidates[p].name, verdict=TrialVerdict.REJECTED, note=rejected[candidates[p].name],
                            revision=candidates[p].revision)
                    for p in range(1, len(candidates)) if candidates[p].name in rejected]
        roster = tunable.roster()
        for name in sorted(set(rejected) - planned_names):  # a space's config, searched in rounds
            position = roster.position(name)
            if position is not None:
                refused.append(Outcome(position, name, verdict=TrialVerdict.REJECTED, note=rejected[name],
                                       revision=roster[position].revision))
    groups: dict[int, list[int]] = {}
    for position in admitted:
        groups.setdefault(tunable[order[position]].group, []).append(position)
    planned = tuple((f"g{group}", tuple((candidates[p].name, candidates[p].revision) for p in positions))
                    for group, positions in groups.items())
    if not planned:  # only the reference: one task still yields the cache key and its timings
        ref = candidates[0]
        planned = ((REFERENCE_GROUP, ((ref.name, ref.revision),)),)
    if roster is None:
        return Groups(tunable.checksum(), planned, tuple(refused), parts=tunable.parts())
    # A problem's id covers its spaces' value lists (a grown space is a new problem); its family's id does not.
    descriptors = [s.space.descriptor() for s in roster.spaces() if s.space is not None]
    checksum = hashlib.sha256(fields([tunable.checksum(), *descriptors]).encode()).hexdigest()
    family = SpaceFamily("", covered_by(roster), prior)
    return Groups(checksum, planned, tuple(refused), family, tunable.checksum(), tunable.parts())


def _incremental(order: list[int], roster: Roster, prior: Prior) -> list[int]:
    """A grown space's plan (``order``: tunable indices, the reference first): the reference, the prior's winner,
    then the space configs the prior did not cover, in order (the other listed candidates were judged)."""
    covered = covered_positions(roster, prior)
    winner = roster.position(prior.winner)
    kept = [order[0]] + ([roster.indices[winner]] if winner is not None and winner != 0 else [])
    for index in order[1:]:
        segment = next(s for s in roster.segments if s.index <= index < s.index + s.size)
        if segment.space is not None and index not in kept and not covered(segment.start + index - segment.index):
            kept.append(index)
    return kept


def _continued(order: list[int], tunable: Any, meta: Mapping[str, Any]) -> list[int]:
    """A partial decision's continuation (``order``: tunable indices, the reference first): the reference, its
    winner (judged again, against this run's reference timings), then the candidates it did not judge, in order."""
    judged = judged_before(meta)
    selected = meta.get("winner") or next((c.get("name") for c in meta.get("candidates", [])
                                           if str(c.get("note", "")).startswith("selected")), None)
    winner = next((i for i in order[1:] if tunable[i].name == selected), None)
    rest = [i for i in order[1:] if i != winner and tunable[i].name not in judged]
    return [order[0], *([winner] if winner is not None else []), *rest]


class Planner:
    """Every (workload, target) pair of a run whose device kind matches, in plan order, made into problems one at a
    time: a run holds the problems it works on, never the whole catalog expanded (its tasks are built when a problem
    is taken). What depends only on the operation and device kind is planned once."""

    def __init__(self, catalog: Catalog, targets: list[Target], run: str,
                 bans: Mapping[str, Mapping[str, Collection[str]]] | None = None,
                 rejected: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None,
                 families: Families | None = None, fleet_priors: FleetPriors | None = None) -> None:
        """``bans``: fingerprint digest -> problem id -> the candidates the fleet banned for it. ``rejected``:
        fingerprint digest -> operation -> the configs its compile stage rejected, with their verdicts
        (``farm_coordinator.precompile``). ``families``: where a family's last complete decision is found (None: every problem
        with spaces is searched in full, as a forced run does). ``fleet_priors``: where other fingerprints'
        decisions of a family are found (None: no priors, ``farm tune --no-priors``)."""
        self.fleet_priors = fleet_priors
        self.catalog, self.targets, self.run = catalog, targets, run
        self.bans = bans or {}
        self.rejected = rejected or {}
        self.families = families
        self.policy_dict = catalog.policy.to_dict()
        self.accuracy = catalog.policy.accuracy_key()
        self._groups: dict[tuple[str, str, str], Groups] = {}

    def _rejected(self, target: Target, workload: Workload) -> Mapping[str, str]:
        return self.rejected.get(target.digest, {}).get(workload.operation, {})

    def pairs(self) -> Iterator[tuple[Target, Workload]]:
        for target in self.targets:
            for workload in self.catalog.workloads:
                if target.device_kind in workload.devices and workload.fingerprint in ("", target.digest):
                    yield target, workload

    def groups(self, target: Target, workload: Workload) -> Groups:
        rejected = self._rejected(target, workload)
        key = (workload.operation, target.device_kind, target.digest if rejected else "")
        found = self._groups.get(key)
        if found is None:
            found = self._groups[key] = plan_groups(workload.operation, target.device_kind, self.catalog,
                                                    rejected=rejected)
        return found

    def problem_id(self, target: Target, workload: Workload) -> str:
        """The id covers the spec with its defaults filled in (normalized once, at catalog load): ``seed = 0``
        spelled out, or a fleet report's spec rebuilt from inputs, is the same problem (decided once, banned once)
        as the spec that leaves them out."""
        return problem_id(target.digest, workload.operation, target.device_kind,
                          self.groups(target, workload).checksum, workload.normalized, self.accuracy)

    def family_id(self, target: Target, workload: Workload) -> str | None:
        """The id of the problem's family (its spaces' value lists left out), None without spaces."""
        planned = self.groups(target, workload)
        if planned.family is None:
            return None
        return problem_id(target.digest, workload.operation, target.device_kind, "family:" + planned.family_checksum,
                          workload.normalized, self.accuracy)

    def fleet_family_id(self, target: Target, workload: Workload) -> str | None:
        """The id of the problem's family across fingerprints (:meth:`family_id` without the fingerprint; for a
        recording, its kernel's family: ``farm_kernels.recorded.family``), None without spaces."""
        from farm_kernels import recorded

        planned = self.groups(target, workload)
        if planned.family is None:
            return None
        same = recorded.family(workload.operation) if target.device_kind == recorded.KIND else None
        operation, checksum, spec = same or (workload.operation, planned.family_checksum, workload.normalized)
        return problem_id("", operation, target.device_kind, "family:" + checksum, spec, self.accuracy)

    def problem(self, target: Target, workload: Workload, pid: str | None = None,
                prior: Prior | None = None, continues: Mapping[str, Any] | None = None,
                priors: tuple[Source, ...] = ()) -> PlannedProblem:
        """The problem of one pair, with its group tasks (``pid``: its id when the caller has it already;
        ``prior``: its family's earlier complete search, ``continues``: the meta of its own partial decision,
        :meth:`problems` finds both; ``priors``: other fingerprints' decisions of its family, :meth:`fleet_priors_of`)."""
        planned = self.groups(target, workload)
        pid = pid or self.problem_id(target, workload)
        banned = self.bans.get(target.digest, {}).get(pid)
        if banned or prior is not None or continues is not None:
            planned = plan_groups(workload.operation, target.device_kind, self.catalog, banned or (),
                                  self._rejected(target, workload), prior, continues)
        tasks = tuple(GroupTask(self.run, pid, group, workload.operation, target.device_kind, workload.normalized, candidates,
                                self.policy_dict, target.digest, self.catalog.kernels, expects=planned.parts)
                      for group, candidates in planned.groups)
        family = planned.family
        if family is not None:
            family = dataclasses.replace(family, problem_id=self.family_id(target, workload) or "",
                                         fleet_id=self.fleet_family_id(target, workload) or "", fleet_priors=priors)
        return PlannedProblem(pid, target, workload, tasks, planned.refused, family, continues)

    def problems(self, taken: Sequence[tuple[str, Target, Workload]]) -> list[PlannedProblem]:
        """The problems of ``taken`` (id, target, workload), each with its family's earlier complete search when
        one is on record and fresh, and its own partial decision when one is (``farm_coordinator.partial``: the
        search continues it): one read of the problem index per fingerprint."""
        priors: dict[str, Prior] = {}
        partials: dict[str, Mapping[str, Any]] = {}
        wanted: dict[str, dict[str, str]] = {}  # digest -> family id -> problem id
        own: dict[str, set[str]] = {}  # digest -> the taken problems' own ids
        for pid, target, workload in taken if self.families is not None else ():
            own.setdefault(target.digest, set()).add(pid)
            family = self.family_id(target, workload)
            if family is not None:
                wanted.setdefault(target.digest, {})[family] = pid
        now = time.time()
        for digest in own.keys() | wanted.keys():
            assert self.families is not None
            ids = wanted.get(digest, {})
            for found, record in self.families(digest, [*ids, *sorted(own.get(digest, ()))]).items():
                if found in own.get(digest, ()) and is_partial(record.meta):
                    partials[found] = record.meta
                    continue
                prior = prior_of(record.meta) if record.is_fresh(now, self.catalog.policy.ttl) else None
                if prior is not None and found in ids:
                    priors[ids[found]] = prior
        return [self.problem(target, workload, pid, priors.get(pid), partials.get(pid),
                             self.fleet_priors_of(target, workload) if pid not in priors else ())
                for pid, target, workload in taken]

    def fleet_priors_of(self, target: Target, workload: Workload) -> tuple[Source, ...]:
        """Other fingerprints' fresh decisions of the problem's family that keep a ranking, as priors named by
        their fingerprint digests (at most ``SOURCES``, one lookup); none without spaces or ``fleet_priors``."""
        family = self.fleet_family_id(target, workload) if self.fleet_priors is not None else None
        if family is None:
            return ()
        assert self.fleet_priors is not None
        now, ttl = time.time(), self.catalog.policy.ttl
        found = [(digest, record) for digest, record in self.fleet_priors(family, target.digest, SOURCES)
                 if digest != target.digest and record.is_fresh(now, ttl) and record.meta.get("fleet_family") == family]
        return from_records(found)


def expand(catalog: Catalog, targets: list[Target], run: str,
           bans: Mapping[str, Mapping[str, Collection[str]]] | None = None,
           rejected: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None) -> list[PlannedProblem]:
    """Every problem of the run at once (small catalogs and tests; a run takes them one by one from a Planner)."""
    planner = Planner(catalog, targets, run, bans, rejected)
    return [planner.problem(target, workload) for target, workload in planner.pairs()]


WARMUP = 3
"""Groups that must report their cost before groups are batched."""


def batch_size(observed: Sequence[float], queued: int, devices: int, target_seconds: float, cap: int) -> int:
    """How many groups the next task carries: as many as the recent groups' mean trial seconds (``observed``) fit
    in ``target_seconds``, at most ``cap``, and no more than a share of the ``queued`` groups that leaves every
    device work. One group until :data:`WARMUP` groups have reported their cost."""
    if len(observed) < WARMUP:
        return 1
    mean = max(sum(observed) / len(observed), 1e-6)
    return max(1, min(int(target_seconds / mean), queued // (2 * max(1, devices)), cap))


def in_flight_limit(observed: Sequence[float], devices: int, most: int) -> int:
    """How many groups may be in flight: ``most``, but while the batch size is unknown (fewer than
    :data:`WARMUP` groups reported) only two per device, one running and one queued behind it: a flood of
    single-group tasks would each cost a broker round trip that batches share once the cost is known."""
    return most if len(observed) >= WARMUP else min(most, 2 * max(1, devices))
