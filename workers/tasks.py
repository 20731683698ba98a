"""The group task: run ONE candidate group of ONE problem on this worker's device, idempotently.

Celery-free on purpose: the Celery task (``farm_workers.app``) and the embedded farm call :func:`run_group` alike.
The group's candidates are searched by ``farm.search.search`` — the very function the in-process controller
calls — within the budget the task carries (what the problem's earlier groups left), on this same device.
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
from farm.environment import farm_version, runtime_environment
from farm.errors import (
    ConfigError,
    DeviceBusy,
    DeviceQuarantined,
    FailureKind,
    ProtocolError,
    TuneFailure,
    ValidationUnavailable,
)
from farm.identity import Candidate, cache_key
from farm.policy import StackPolicy, Tolerance
from farm.runtimes.base import ComputeClient
from farm.search import search
from farm.trials import Validation
from farm_fleet.protocol import STATUS_OK, STATUS_VALIDATION_UNAVAILABLE, GroupResult, GroupTask
from farm_fleet.results import MemoryResults, RedisResults
from farm_fleet.settings import Settings

log = logging.getLogger(__name__)


__all__ = ["DeviceQuarantined", "GuardedTrials", "WorkerContext", "run_group", "run_groups"]


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
    if ctx.quarantined is not None:  # before counting an attempt: another worker runs (or answers) the group
        raise DeviceQuarantined(ctx.quarantined)
    existing, attempt = ctx.results.begin(task.run, task.problem_id, task.group)
    if existing is not None:
        body: dict[str, Any] = existing.to_dict()
        return body
    provenance = ctx.provenance(attempt)
    if attempt > ctx.settings.max_attempts:
        failed = GroupResult.failed(
            task, f"gave up after {attempt - 1} attempts: the task kept killing its worker", provenance
        )
        body = ctx.results.put_if_absent(failed).to_dict()
        return body
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
    body = ctx.results.put_if_absent(result).to_dict()
    return body


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
    positions = _positions(task, candidates)
    runner = GuardedTrials(client, tunable, inputs, order, policy.timing, interrupts=ctx.interrupts)

    def hit_time_limit() -> str | None:
        return "the group task hit its time limit" if runner.interrupted else None

    try:
        found = search(runner, policy, 0, candidates, positions, budget=task.budget,
                       charge_reference=task.budget is None, stop=hit_time_limit)
    except ValidationUnavailable:
        return GroupResult(task.run, task.problem_id, task.group, STATUS_VALIDATION_UNAVAILABLE,
                           trial_seconds=time.monotonic() - started, cache_key=key, reference_index=0,
                           names=tuple(names), provenance=provenance)
    ctx.interrupted = ctx.interrupted or runner.interrupted
    return GroupResult(
        task.run, task.problem_id, task.group, STATUS_OK, reference_times=found.reference_times,
        outcomes=found.outcomes, trial_seconds=time.monotonic() - started, search_seconds=found.spent,
        budget_exhausted=found.budget_exhausted, cache_key=key, reference_index=0, names=tuple(names),
        provenance=provenance,
    )


def _positions(task: GroupTask, candidates: list[Candidate]) -> list[int]:
    """The task's candidates as positions in this worker's candidate list; ValueError for a name this worker's
    operation lacks or a revision it does not have (mixed builds)."""
    where = {c.name: i for i, c in enumerate(candidates)}
    positions = []
    for name, revision in task.candidates:
        index = where.get(name)
        if index is None:
            raise ValueError(f"task names candidate {name!r}, which {task.operation} on this worker does not have")
        if candidates[index].revision != revision:
            raise ValueError(f"task wants {name!r} revision {revision!r}; this worker has {candidates[index].revision!r}")
        positions.append(index)
    return positions
