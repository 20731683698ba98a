"""The group task: run ONE candidate group of ONE problem on this worker's device, idempotently.

Celery-free on purpose: the Celery task (``farm_workers.app``) and the embedded farm call :func:`run_group` alike.
The group's candidates are searched by ``farm.search.search`` — the very function the in-process controller
calls — within the budget the task carries (what the problem's earlier groups left), on this same device.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.adapter import RuntimeTrials, stack_request
from farm.environment import farm_version, runtime_environment
from farm.errors import (
    ConfigError,
    DeviceBusy,
    FailureKind,
    ProtocolError,
    TuneFailure,
    ValidationUnavailable,
)
from farm.identity import Candidate, cache_key
from farm.policy import StackPolicy, Tolerance
from farm.roster import Roster
from farm.runner import Validation, runner_cost
from farm.runtimes.base import ComputeClient
from farm.search import search
from farm.tunable import TunableSet
from farm_fleet.errors import DeviceQuarantined
from farm_fleet.protocol import (
    STATUS_OK,
    STATUS_VALIDATION_UNAVAILABLE,
    GroupKey,
    GroupResult,
    GroupTask,
    set_difference,
)
from farm_fleet.results import ResultsStore, Runner
from farm_fleet.settings import Settings
from farm_workers.racing import race_group

log = logging.getLogger(__name__)
SENT_NAMES = 4096  # the most candidate names a result lists (farm.identity's listed-candidate limit)


__all__ = ["Batch", "DeviceQuarantined", "GuardedTrials", "WorkerContext", "run_group", "run_groups"]


@dataclass
class WorkerContext:
    """What a group task needs from the process it runs in."""

    client: ComputeClient
    results: ResultsStore
    settings: Settings
    worker_id: str
    kernels: tuple[str, ...] = ()
    interrupts: tuple[type[BaseException], ...] = ()
    on_quarantine: Callable[[str], None] | None = None
    quarantined: str | None = None
    interrupted: bool = False
    host: str = field(default_factory=socket.gethostname)
    deadline: float | None = None  # monotonic time of the current task's hard time limit, when it has one

    @property
    def runner(self) -> Runner:
        return Runner.here(self.worker_id)

    def claim_seconds(self) -> float:
        """How long a run claim taken now may last: until the task's hard time limit (past it the process is
        killed), or the broker's visibility timeout when the task has none."""
        if self.deadline is None:
            return self.settings.visibility_timeout
        return max(1.0, self.deadline - time.monotonic())

    @property
    def digest(self) -> str:
        return runtime_environment(self.client).digest

    def provenance(self, attempt: int) -> dict[str, Any]:
        return {
            "host": self.host,
            "device": self.client.device_id,
            "worker": self.worker_id,
            "pid": os.getpid(),
            "fingerprint": self.digest,
            "farm_version": farm_version(),
            "attempt": attempt,
        }


class GuardedTrials(RuntimeTrials):
    """RuntimeTrials that notices the task's time limit (``interrupts``) firing inside a trial: the trial is
    rejected as hung and the group stops starting new candidates."""

    def __init__(self, *args: Any, interrupts: tuple[type[BaseException], ...] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.interrupts = interrupts
        self.interrupted = False

    def _guard(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except TuneFailure as e:
            if self.interrupts and isinstance(e.__cause__, self.interrupts):
                self.interrupted = True
                raise TuneFailure.rejected("hit the task's time limit (the candidate hung or ran too long)") from e
            raise
        except self.interrupts as e:
            self.interrupted = True
            raise TuneFailure.rejected("hit the task's time limit (the candidate hung or ran too long)") from e

    def validate(self, reference: int, candidate: int, tolerance: Tolerance) -> Validation:
        result: Validation = self._guard(lambda: super(GuardedTrials, self).validate(reference, candidate, tolerance))
        return result

    def measure(self, candidate: int) -> float:
        result: float = self._guard(lambda: super(GuardedTrials, self).measure(candidate))
        return result


@dataclass
class Batch:
    """What became of a batch's groups: ``results`` of those run or answered, in order; ``unreached``, not begun
    because the batch stopped after a hang (the coordinator sends them again at once)."""

    results: list[dict[str, Any]] = field(default_factory=list)
    unreached: list[GroupKey] = field(default_factory=list)


def run_groups(messages: list[dict[str, Any]], ctx: WorkerContext) -> Batch:
    """Run a batch of group tasks in order (the coordinator batches tiny groups so the broker's per-task cost
    is shared). Stops after a group whose candidate hit the time limit, or at a group the time limit interrupted
    outside its trials: the groups not run get no result and the coordinator sends them again."""
    batch = Batch()
    ctx.interrupted = False
    for i, message in enumerate(messages):
        if ctx.interrupted:
            batch.unreached = [GroupKey.of(m) for m in messages[i:]]
            break
        try:
            batch.results.append(run_group(message, ctx))
        except ctx.interrupts:  # the time limit outside the trials (e.g. waiting on another delivery's run)
            ctx.interrupted = True
            batch.unreached = [GroupKey.of(m) for m in messages[i:]]
            break
    return batch


def run_group(message: dict[str, Any], ctx: WorkerContext) -> dict[str, Any]:
    """Run one group task and return its result as JSON. Stored under its GroupKey only if absent, so a
    redelivered task returns the first result, and a delivery that finds another one running the group waits for
    its result (``farm_fleet.results``): a group runs once. Raises DeviceQuarantined after a device failure."""
    task = GroupTask.from_dict(message)
    if ctx.quarantined is not None:  # before counting an attempt: another worker runs (or answers) the group
        raise DeviceQuarantined(ctx.quarantined)
    runner = ctx.runner
    begun = ctx.results.begin(task.key, runner, ctx.claim_seconds())
    if begun.result is not None:
        body: dict[str, Any] = begun.result.to_dict()
        return body
    try:
        result = _run_claimed(task, ctx, begun.attempt)
    except BaseException:
        _release(task, ctx, runner)
        raise
    body = ctx.results.put_if_absent(result).to_dict()  # ends the claim with the result
    return body


def _run_claimed(task: GroupTask, ctx: WorkerContext, attempt: int) -> GroupResult:
    """The group's result, this delivery holding its run claim."""
    provenance = ctx.provenance(attempt)
    if attempt > ctx.settings.max_attempts:
        return GroupResult.failed(
            task, f"gave up after {attempt - 1} attempts: the task kept killing its worker", provenance
        )
    try:
        with ctx.client.exclusive():  # one acquisition for the whole group; each trial re-enters it for free
            return _trials(task, ctx, provenance)
    except TuneFailure as e:
        if e.kind is FailureKind.DEVICE:
            ctx.quarantined = e.message
            if ctx.on_quarantine is not None:
                ctx.on_quarantine(e.message)
            raise DeviceQuarantined(e.message) from e
        return GroupResult.failed(task, f"{e.kind.value}: {e.message}", provenance)
    except (ConfigError, ProtocolError, LookupError, ValueError, DeviceBusy) as e:
        return GroupResult.failed(task, f"{type(e).__name__}: {e}", provenance)


def _release(task: GroupTask, ctx: WorkerContext, runner: Runner) -> None:
    """Give up the claim of a run that ended without a result; an unreachable store leaves it to expire."""
    try:
        ctx.results.release(task.key, runner)
    except Exception as e:
        log.warning("could not release the run claim of group %s of %s: %s", task.group, task.problem_id, e)


def _trials(task: GroupTask, ctx: WorkerContext, provenance: dict[str, Any]) -> GroupResult:
    name, tunable, build = _operation(task, ctx)
    if task.fingerprint != ctx.digest:
        raise ValueError(f"task for fingerprint {task.fingerprint} reached a worker of fingerprint {ctx.digest}")
    if task.expects is not None:  # a worker left on an old module would publish under its own, old set
        differs = set_difference(task.operation, f"{ctx.worker_id}@{ctx.host}", tunable.parts(), task.expects)
        if differs is not None:
            log.error("refused group %s of %s: %s", task.group, task.problem_id, differs)
            return GroupResult.failed(task, differs, provenance)
    policy = StackPolicy.from_dict(task.policy, where=f"task {task.run}/{task.problem_id}/{task.group} policy")
    client = ctx.client
    started = time.monotonic()
    inputs = build()
    problem, candidates, order = stack_request(name, client.device_kind, client, tunable, inputs)
    key = cache_key(problem, candidates, 0, policy)
    # A roster too long to send (a large space) travels as the key alone: the coordinator unranks its names
    # from the key's space descriptors (farm.keyroster).
    names = ([c.name for c in candidates] if not isinstance(candidates, Roster) else
             list(candidates.names) if len(candidates) <= SENT_NAMES else [])
    positions = _positions(task, candidates)
    runner = GuardedTrials(client, tunable, inputs, order, policy.timing, interrupts=ctx.interrupts)
    cost = runner_cost(runner)[0]  # the group's device seconds: every run it makes (validation, warm-ups, timing)

    def hit_time_limit() -> str | None:
        return "the group task hit its time limit" if runner.interrupted else None

    if task.incumbent is not None:  # a race's group: paired against the incumbent (farm_workers.racing)
        incumbent = _positions(dataclasses.replace(task, candidates=(task.incumbent,)), candidates)[0]
        raced = race_group(runner, policy, 0, incumbent, positions, _names(candidates), task.noise,
                           policy.budget if task.budget is None else task.budget, hit_time_limit,
                           [revision for _, revision in task.candidates])
        ctx.interrupted = ctx.interrupted or runner.interrupted
        return GroupResult(
            task.run, task.problem_id, task.group, STATUS_OK, outcomes=tuple(raced.outcomes),
            trial_seconds=time.monotonic() - started, search_seconds=raced.spent,
            budget_exhausted=raced.budget_exhausted, cache_key=key, reference_index=0, names=tuple(names),
            provenance=provenance, device_seconds=runner_cost(runner)[0] - cost, incumbent=task.incumbent[0],
            standings=raced.standings,
        )
    try:
        found = search(runner, policy, 0, candidates, positions, budget=task.budget,
                       charge_reference=task.budget is None, stop=hit_time_limit)
    except ValidationUnavailable:
        return GroupResult(task.run, task.problem_id, task.group, STATUS_VALIDATION_UNAVAILABLE,
                           trial_seconds=time.monotonic() - started, cache_key=key, reference_index=0,
                           names=tuple(names), provenance=provenance, device_seconds=runner_cost(runner)[0] - cost)
    ctx.interrupted = ctx.interrupted or runner.interrupted
    return GroupResult(
        task.run, task.problem_id, task.group, STATUS_OK, reference_times=found.reference_times,
        outcomes=found.outcomes, trial_seconds=time.monotonic() - started, search_seconds=found.spent,
        budget_exhausted=found.budget_exhausted, cache_key=key, reference_index=0, names=tuple(names),
        provenance=provenance, device_seconds=runner_cost(runner)[0] - cost,
    )


def _operation(task: GroupTask, ctx: WorkerContext) -> tuple[str, TunableSet, Callable[[], tuple[Any, ...]]]:
    """The task's operation name, tunable set and input builder, from this worker's own configuration only:
    its --kernels and entry points, or the recording its device serves (``farm_kernels.recorded``). A message may
    name the modules it expects, but that list is a check, never something to import (issue 12)."""
    from farm_kernels import recorded, registry

    if task.device_kind == recorded.KIND:
        recording = recorded.own(ctx.client, task.operation, task.spec)
        return task.operation, recording.tunable, lambda: recording.inputs
    registry.ensure_loaded(ctx.kernels)
    if task.operation not in registry.names():
        expected = f" (the task expects modules {', '.join(task.kernels)})" if task.kernels else ""
        raise LookupError(f"this worker has no operation {task.operation!r}{expected}: start it with --kernels "
                          f"naming the module (known: {', '.join(registry.names())})")
    operation = registry.get(task.operation)
    return operation.name, operation.tunable(task.device_kind), lambda: operation.build(task.spec, ctx.client)


def _names(candidates: Sequence[Candidate]) -> Sequence[str]:
    """The candidates' names by position (a roster's, unranked lazily)."""
    return candidates.names if isinstance(candidates, Roster) else [c.name for c in candidates]


def _positions(task: GroupTask, candidates: Sequence[Candidate]) -> list[int]:
    """The task's candidates as positions in this worker's candidate list (a space config by its canonical
    name); ValueError for a name this worker's operation lacks or a revision it does not have (mixed builds)."""
    find: Callable[[str], int | None]
    if isinstance(candidates, Roster):
        find = candidates.position
    else:
        where = {c.name: i for i, c in enumerate(candidates)}
        find = where.get
    positions = []
    for name, revision in task.candidates:
        index = find(name)
        if index is None:
            raise ValueError(f"task names candidate {name!r}, which {task.operation} on this worker does not have")
        if candidates[index].revision != revision:
            raise ValueError(f"task wants {name!r} revision {revision!r}; this worker has {candidates[index].revision!r}")
        positions.append(index)
    return positions
