"""The group task: run ONE candidate group of ONE problem on this worker's device, idempotently.

Celery-free on purpose: the Celery task (``farm_workers.app``) and the embedded farm call :func:`run_group` alike.
For each candidate of the group it runs warmups, validation against the reference and the policy's paired
alternating samples with the reference, on this same device, through the core's trial protocol
(``farm.trials``) — the very code the in-process controller uses.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from farm.adapter import RuntimeTrials, stack_request
from farm.engine import Validation
from farm.environment import farm_version, runtime_environment
from farm.errors import ConfigError, DeviceBusy, FailureKind, TuneFailure
from farm.identity import cache_key
from farm.policy import StackPolicy, Tolerance
from farm.runtimes.base import ComputeClient
from farm.trials import Outcome, ValidationUnavailable, candidate_trials, pre_trial_skip, reference_trials
from farm_fleet.protocol import (
    STATUS_OK,
    STATUS_VALIDATION_UNAVAILABLE,
    GroupResult,
    GroupTask,
    ProtocolError,
)
from farm_fleet.results import MemoryResults, RedisResults
from farm_fleet.settings import Settings

log = logging.getLogger(__name__)


class DeviceQuarantined(Exception):
    """Raised when this worker's device failed a completion fence: the task must go to another worker."""


@dataclass
class WorkerContext:
    """What a group task needs from the process it runs in."""

    client: ComputeClient
    results: MemoryResults | RedisResults
    settings: Settings
    worker_id: str
    kernels: tuple[str, ...] = ()
    interrupts: tuple[type[BaseException], ...] = ()
    on_quarantine: Callable[[str], None] | None = None
    quarantined: str | None = None
    interrupted: bool = False
    host: str = field(default_factory=socket.gethostname)

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


def run_groups(messages: list[dict[str, Any]], ctx: WorkerContext) -> list[dict[str, Any]]:
    """Run a batch of group tasks in order (the coordinator batches tiny groups so the broker's per-task cost
    is shared). Stops after a group whose candidate hit the time limit: the groups not run get no result and
    the coordinator sends them again."""
    done = []
    ctx.interrupted = False
    for message in messages:
        done.append(run_group(message, ctx))
        if ctx.interrupted:
            break
    return done


def run_group(message: dict[str, Any], ctx: WorkerContext) -> dict[str, Any]:
    """Run one group task and return its result as JSON. Stored under (run, problem, group) only if absent, so a
    redelivered task returns the first result. Raises DeviceQuarantined after a device failure."""
    task = GroupTask.from_dict(message)
    existing = ctx.results.get(task.run, task.problem_id, task.group)
    if existing is not None:
        return existing.to_dict()
    if ctx.quarantined is not None:
        raise DeviceQuarantined(ctx.quarantined)
    attempt = ctx.results.attempt(task.run, task.problem_id, task.group)
    provenance = ctx.provenance(attempt)
    if attempt > ctx.settings.max_attempts:
        failed = GroupResult.failed(
            task, f"gave up after {attempt - 1} attempts: the task kept killing its worker", provenance
        )
        return ctx.results.put_if_absent(failed).to_dict()
    try:
        with ctx.client.exclusive():  # one acquisition for the whole group; each trial re-enters it for free
            result = _trials(task, ctx, provenance)
    except TuneFailure as e:
        if e.kind is FailureKind.DEVICE:
            ctx.quarantined = e.message
            if ctx.on_quarantine is not None:
                ctx.on_quarantine(e.message)
            raise DeviceQuarantined(e.message) from e
        result = GroupResult.failed(task, f"{e.kind.value}: {e.message}", provenance)
    except (ConfigError, ProtocolError, LookupError, ValueError, DeviceBusy) as e:
        result = GroupResult.failed(task, f"{type(e).__name__}: {e}", provenance)
    return ctx.results.put_if_absent(result).to_dict()


def _trials(task: GroupTask, ctx: WorkerContext, provenance: dict[str, Any]) -> GroupResult:
    from farm_kernels import registry

    # Operations come only from the worker's own configuration (--kernels, entry points): a message may name the
    # modules it expects, but that list is a check, never something to import (issue 12).
    registry.ensure_loaded(ctx.kernels)
    if task.operation not in registry.names():
        expected = f" (the task expects modules {', '.join(task.kernels)})" if task.kernels else ""
        raise LookupError(f"this worker has no operation {task.operation!r}{expected}: start it with --kernels "
                          f"naming the module (known: {', '.join(registry.names())})")
    if task.fingerprint != ctx.digest:
        raise ValueError(f"task for fingerprint {task.fingerprint} reached a worker of fingerprint {ctx.digest}")
    operation = registry.get(task.operation)
    tunable = operation.tunable(task.device_kind)
    policy = StackPolicy.from_dict(task.policy, where=f"task {task.run}/{task.problem_id}/{task.group} policy")
    client = ctx.client
    started = time.monotonic()
    inputs = operation.build(task.spec, client)
    problem, candidates, order = stack_request(operation.name, client.device_kind, client, tunable, inputs)
    key = cache_key(problem, candidates, 0, policy)
    names = [c.name for c in candidates]
    runner = GuardedTrials(client, tunable, inputs, order, policy.timing, interrupts=ctx.interrupts)
    common = dict(cache_key=key, reference_index=0, names=tuple(names), provenance=provenance)
    try:
        reference_times = reference_trials(runner, policy, 0, names[0])
    except ValidationUnavailable:
        return GroupResult(task.run, task.problem_id, task.group, STATUS_VALIDATION_UNAVAILABLE,
                           trial_seconds=time.monotonic() - started, **common)
    deadline = time.monotonic() + policy.budget
    outcomes: list[Outcome] = []
    for impl_index in task.indices:
        position = order.index(impl_index)
        if position == 0:
            continue
        skip = pre_trial_skip(candidates[position], policy, banned=False)
        if skip is None and runner.interrupted:
            skip = "not tried: the group task hit its time limit"
        if skip is None and time.monotonic() > deadline:
            outcomes.append(Outcome(position, names[position], failure=f"not tried: budget of {policy.budget:g}s exhausted", budget_exhausted=True))
            continue
        if skip is not None:
            outcomes.append(Outcome(position, names[position], failure=skip))
            continue
        runner.last_check = None
        outcomes.append(candidate_trials(runner, policy, 0, position, names, deadline))
    ctx.interrupted = ctx.interrupted or runner.interrupted
    return GroupResult(
        task.run, task.problem_id, task.group, STATUS_OK, reference_times=tuple(reference_times),
        outcomes=tuple(outcomes), trial_seconds=time.monotonic() - started, **common,
    )
