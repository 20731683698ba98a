"""Expansion: catalog workloads x target fingerprints -> problems, each split into one task per priority group.

A run takes its problems one at a time from a :class:`Planner` (never the whole catalog expanded at once), so what
it holds grows with the problems it works on, not with the catalog.

Tasks name their candidates (name, revision); the coordinator never works with implementation indices. Which
groups are sent when is the search strategy's choice (``farm_coordinator.strategy``: today's rule runs the groups
one after the other, each carrying the budget the earlier ones left), so the budget bounds the problem's whole
search on the farm as in-process. Tiny groups travel
in batches (:func:`batch_size`, :func:`in_flight_limit`) so that the broker's cost per task is shared. A candidate
the fleet banned for a problem (``coordinator/bans.py``) is planned as SKIPPED for that problem only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from farm.policy import StackPolicy
from farm.search import admit
from farm.trials import Outcome, TrialVerdict
from farm_coordinator.catalog import Catalog, Workload
from farm_fleet.protocol import REFERENCE_GROUP, GroupTask, problem_id


@dataclass(frozen=True)
class Target:
    """A fingerprint with live devices of one kind; ``workers`` are their ids (confirmation picks among them)."""

    digest: str
    fingerprint: str
    device_kind: str
    workers: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlannedProblem:
    """What the catalog and the fingerprint fix about one problem of a run: its id, target and workload, its group
    tasks in plan order (under the run's id: the round a claim gives it is state, ``ProblemState.round``) and the
    candidates planning refused (``skipped``). Frozen: what a run learns about the problem lives on its board."""

    problem_id: str
    target: Target
    workload: Workload
    tasks: tuple[GroupTask, ...]
    skipped: tuple[Outcome, ...] = ()

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

    @property
    def trials(self) -> int:
        return sum(len(candidates) for _, candidates in self.groups)


def searches_spaces(policy: StackPolicy) -> bool:
    """Whether a run searches spaces in rounds (``farm_coordinator.spacesearch``: a strategy other than exhaustive,
    or a ``max_configs``); else a space's feasible configs are planned as candidates of its priority group."""
    return policy.strategy != "exhaustive" or policy.max_configs is not None


def plan_groups(operation: str, device_kind: str, catalog: Catalog, banned: Collection[str] = (),
                rejected: Mapping[str, str] | None = None) -> Groups:
    """One task per priority group in plan order, naming the candidates ``farm.search.admit`` lets the search
    try (the same rule as in-process: skips, bans and ``max_candidates``); the others come back as Outcomes.
    Under :func:`searches_spaces` only the listed candidates are planned: a space is never enumerated here.
    ``rejected``: configs the compile stage rejected (name -> its verdict, ``farm_coordinator.precompile``), each
    an Outcome REJECTED with the verdict as its note, never planned (nor asked by a space search)."""
    from farm_kernels import registry

    tunable = registry.get(operation).tunable(device_kind)
    if tunable.spaces and searches_spaces(catalog.policy):  # the spaces are the strategy's (SpaceSearch)
        roster = tunable.roster()
        order = [roster.indices[p] for p in roster.plain_positions]
    else:
        order = tunable.search_order()  # the cache key's candidate list: the reference first
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
    return Groups(tunable.checksum(), planned, tuple(refused))


class Planner:
    """Every (workload, target) pair of a run whose device kind matches, in plan order, made into problems one at a
    time: a run holds the problems it works on, never the whole catalog expanded (its tasks are built when a problem
    is taken). What depends only on the operation and device kind is planned once."""

    def __init__(self, catalog: Catalog, targets: list[Target], run: str,
                 bans: Mapping[str, Mapping[str, Collection[str]]] | None = None,
                 rejected: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None) -> None:
        """``bans``: fingerprint digest -> problem id -> the candidates the fleet banned for it. ``rejected``:
        fingerprint digest -> operation -> the configs its compile stage rejected, with their verdicts
        (``farm_coordinator.precompile``)."""
        self.catalog, self.targets, self.run = catalog, targets, run
        self.bans = bans or {}
        self.rejected = rejected or {}
        self.policy_dict = catalog.policy.to_dict()
        self.accuracy = catalog.policy.accuracy_key()
        self._groups: dict[tuple[str, str, str], Groups] = {}

    def _rejected(self, target: Target, workload: Workload) -> Mapping[str, str]:
        return self.rejected.get(target.digest, {}).get(workload.operation, {})

    def pairs(self) -> Iterator[tuple[Target, Workload]]:
        for target in self.targets:
            for workload in self.catalog.workloads:
                if target.device_kind in workload.devices:
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

    def problem(self, target: Target, workload: Workload, pid: str | None = None) -> PlannedProblem:
        """The problem of one pair, with its group tasks (``pid``: its id when the caller has it already)."""
        planned = self.groups(target, workload)
        pid = pid or self.problem_id(target, workload)
        banned = self.bans.get(target.digest, {}).get(pid)
        if banned:
            planned = plan_groups(workload.operation, target.device_kind, self.catalog, banned,
                                  self._rejected(target, workload))
        tasks = tuple(GroupTask(self.run, pid, group, workload.operation, target.device_kind, workload.normalized, candidates,
                                self.policy_dict, target.digest, self.catalog.kernels)
                      for group, candidates in planned.groups)
        return PlannedProblem(pid, target, workload, tasks, planned.refused)


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
