"""Expansion: catalog workloads x target fingerprints -> problems, each split into one task per priority group.

Tasks name their candidates (name, revision); the coordinator never works with implementation indices. A problem's
groups run one after the other, each carrying the budget the earlier ones left (:func:`next_tasks`; the rule is
``farm.search``'s), so the budget bounds the problem's whole search on the farm as in-process. Tiny groups travel
in batches (:func:`batch_size`, :func:`in_flight_limit`) so that the broker's cost per task is shared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.search import admit, budget_note
from farm.trials import Outcome
from farm_coordinator.catalog import Catalog, Workload
from farm_fleet.protocol import REFERENCE_GROUP, GroupResult, GroupTask, problem_id


@dataclass(frozen=True)
class Target:
    """A fingerprint with live devices of one kind; ``workers`` are their ids (confirmation picks among them)."""

    digest: str
    fingerprint: str
    device_kind: str
    workers: tuple[str, ...] = ()


@dataclass
class Problem:
    """One problem of a run: its tasks (in plan order), the candidates planning refused (``skipped``), the groups
    sent and not yet answered, and the results gathered so far."""

    problem_id: str
    target: Target
    workload: Workload
    tasks: list[GroupTask]
    skipped: list[Outcome] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)
    confirmation: Any = None
    confirmation_result: Any = None
    sent: set[str] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.tasks)

    def revision(self, name: str) -> str:
        """The revision of a candidate this problem's tasks name (KeyError for another name)."""
        revisions: dict[str, str] = dict(c for t in self.tasks for c in t.candidates)
        return revisions[name]


def group_tasks(
    run: str, pid: str, target: Target, workload: Workload, catalog: Catalog, policy_dict: dict[str, Any],
    banned: Collection[str] = (),
) -> tuple[list[GroupTask], list[Outcome]]:
    """One task per priority group in plan order, naming the candidates ``farm.search.admit`` lets the search
    try (the same rule as in-process: skips, bans and ``max_candidates``); the others come back as Outcomes."""
    from farm_kernels import registry

    tunable = registry.get(workload.operation).tunable(target.device_kind)
    order = tunable.search_order()  # the cache key's candidate list: the reference first
    candidates = [tunable[i].candidate() for i in order]
    admitted, refused = admit(candidates, 0, catalog.policy, banned=banned)
    tasks: list[GroupTask] = []
    groups: dict[int, list[int]] = {}
    for position in admitted:
        groups.setdefault(tunable[order[position]].group, []).append(position)
    for group, positions in groups.items():
        chosen = tuple((candidates[p].name, candidates[p].revision) for p in positions)
        tasks.append(GroupTask(run, pid, f"g{group}", workload.operation, target.device_kind, workload.spec,
                               chosen, policy_dict, target.digest, catalog.kernels))
    if not tasks:  # only the reference: one task still yields the cache key and its timings
        ref = candidates[0]
        tasks.append(GroupTask(run, pid, REFERENCE_GROUP, workload.operation, target.device_kind, workload.spec,
                               ((ref.name, ref.revision),), policy_dict, target.digest, catalog.kernels))
    return tasks, refused


def expand(catalog: Catalog, targets: list[Target], run: str) -> list[Problem]:
    """Every (workload, target) pair whose device kind matches, with its group tasks."""
    from farm_kernels import registry

    policy_dict = catalog.policy.to_dict()
    accuracy = catalog.policy.accuracy_key()
    problems = []
    normalized: dict[int, dict[str, Any]] = {}
    for target in targets:
        for workload in catalog.workloads:
            if target.device_kind not in workload.devices:
                continue
            operation = registry.get(workload.operation)
            checksum = operation.tunable(target.device_kind).checksum()
            # The id covers the spec with its defaults filled in: `seed = 0` spelled out, or a report's spec rebuilt
            # from inputs, is the same problem (decided once, banned once) as the spec that leaves them out.
            spec = normalized.get(id(workload))
            if spec is None:
                spec = normalized[id(workload)] = operation.normalize(workload.spec, catalog.path)
            pid = problem_id(target.digest, workload.operation, target.device_kind, checksum, spec, accuracy)
            tasks, skipped = group_tasks(run, pid, target, workload, catalog, policy_dict)
            problems.append(Problem(pid, target, workload, tasks, skipped))
    return problems


def apply_bans(problems: list[Problem], banned: Callable[[str, list[str]], dict[str, set[str]]], catalog: Catalog,
               run: str) -> int:
    """Re-plan the problems that have fleet bans (``coordinator/bans.py``; ``banned(digest, problem_ids)``):
    their banned candidates become SKIPPED outcomes. One lookup per fingerprint; returns how many were re-planned."""
    by_digest: dict[str, list[Problem]] = {}
    for p in problems:
        by_digest.setdefault(p.target.digest, []).append(p)
    policy_dict = catalog.policy.to_dict()
    changed = 0
    for digest, group in by_digest.items():
        bans = banned(digest, [p.problem_id for p in group])
        for p in group:
            if p.problem_id in bans:
                p.tasks, p.skipped = group_tasks(run, p.problem_id, p.target, p.workload, catalog, policy_dict,
                                                 bans[p.problem_id])
                changed += 1
    return changed


def next_tasks(problem: Problem, budget: float) -> list[GroupTask]:
    """The group task to send now, carrying the budget the problem's earlier groups left: none while a group is
    out or when all have results. The first group carries no number (the whole budget, charging its reference
    timing, as in-process). A group whose turn comes after the budget is spent is not sent: it gets a NOT_TRIED
    result here."""
    spent = sum(r.search_seconds for r in problem.results.values())
    for task in problem.tasks:
        if task.group in problem.results:
            continue
        if task.group in problem.sent:
            return []
        if not problem.results:
            left = None
        else:
            left = budget - spent
            if left <= 0:
                problem.results[task.group] = GroupResult.not_tried(task, budget_note(budget))
                continue
        problem.sent.add(task.group)
        return [dataclasses.replace(task, budget=left)]
    return []


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
