"""Expansion: catalog workloads x target fingerprints -> problems, each split into one task per priority group."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from farm_coordinator.catalog import Catalog, Workload
from farm_fleet.protocol import GroupTask, problem_id


@dataclass(frozen=True)
class Target:
    """A fingerprint with live devices of one kind; ``workers`` are their ids (confirmation picks among them)."""

    digest: str
    fingerprint: str
    device_kind: str
    workers: tuple[str, ...] = ()


@dataclass
class Problem:
    """One problem of a run: its tasks, and the results gathered so far."""

    problem_id: str
    target: Target
    workload: Workload
    tasks: list[GroupTask]
    skipped: dict[int, str] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    confirmation: Any = None
    confirmation_result: Any = None

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.tasks)


def group_tasks(
    run: str, pid: str, target: Target, workload: Workload, catalog: Catalog, policy_dict: dict[str, Any]
) -> tuple[list[GroupTask], dict[int, str]]:
    """One task per priority group in plan order; candidates past ``max_candidates`` (the reference counts one)
    are not dispatched and come back as skip notes keyed by implementation index."""
    from farm_kernels import registry

    tunable = registry.get(workload.operation).tunable(target.device_kind)
    reference = tunable.stack_reference()
    budget = catalog.policy.max_candidates - 1
    tasks: list[GroupTask] = []
    skipped: dict[int, str] = {}
    for batch in tunable.plan():
        chosen = []
        for index in batch:
            if index == reference:
                continue
            if budget <= 0:
                skipped[index] = f"not tried: max_candidates {catalog.policy.max_candidates} reached"
                continue
            budget -= 1
            chosen.append(index)
        if chosen:
            group = f"g{tunable[chosen[0]].group}"
            tasks.append(GroupTask(run, pid, group, workload.operation, target.device_kind, workload.spec,
                                   tuple(chosen), policy_dict, target.digest, catalog.kernels))
    if not tasks:  # only the reference: one task still yields the cache key and its timings
        assert reference is not None
        tasks.append(GroupTask(run, pid, "reference", workload.operation, target.device_kind, workload.spec,
                               (reference,), policy_dict, target.digest, catalog.kernels))
    return tasks, skipped


def expand(catalog: Catalog, targets: list[Target], run: str) -> list[Problem]:
    """Every (workload, target) pair whose device kind matches, with its group tasks."""
    from farm_kernels import registry

    policy_dict = catalog.policy.to_dict()
    accuracy = catalog.policy.accuracy_key()
    problems = []
    for target in targets:
        for workload in catalog.workloads:
            if target.device_kind not in workload.devices:
                continue
            checksum = registry.get(workload.operation).tunable(target.device_kind).checksum()
            pid = problem_id(target.digest, workload.operation, target.device_kind, checksum, workload.spec, accuracy)
            tasks, skipped = group_tasks(run, pid, target, workload, catalog, policy_dict)
            problems.append(Problem(pid, target, workload, tasks, skipped))
    return problems
