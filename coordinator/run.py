"""A tuning run: validate the catalog, target live fingerprints, dispatch group tasks with backpressure,
aggregate and confirm winners, publish decisions, and show progress and a summary."""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from coordinator.aggregate import Aggregate, aggregate, confirm, trial_rows
from coordinator.catalog import Catalog
from coordinator.plan import Problem, Target, expand
from coordinator.sinks import Sink
from farm.errors import FarmError
from farm.protocol import GroupResult, GroupTask
from farm.settings import Settings

CONFIRM_GROUP = "confirm"


class Fleet(Protocol):
    """Where tasks can run: target fingerprints, their queues, and a second device for confirmations."""

    def targets(self) -> list[Target]: ...

    def queue(self, target: Target) -> str: ...

    def confirmer(self, target: Target, exclude: str | None) -> tuple[str, str] | None:
        """(worker id, queue) of another healthy device of the target's fingerprint, or None."""
        ...

    def alive(self, worker_id: str) -> bool:
        """Whether a worker still serves (a confirmation sent to its own queue can still come back)."""
        ...


class Dispatcher(Protocol):
    pending: Any

    def submit(self, tasks: list[GroupTask], queue: str, limits: tuple[float, float]) -> None: ...

    def collect(self, wait: float = 0.0) -> list[GroupResult]: ...

    def take_unrun(self) -> list[GroupTask]: ...

    def close(self) -> None: ...


@dataclass
class RunSummary:
    run: str
    aggregates: list[Aggregate] = field(default_factory=list)
    already_decided: list[Problem] = field(default_factory=list)
    wall_seconds: float = 0.0
    tasks: int = 0
    devices: int = 0

    @property
    def trial_seconds(self) -> float:
        return sum(a.trial_seconds for a in self.aggregates)

    @property
    def published(self) -> int:
        return sum(1 for a in self.aggregates if a.record is not None)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def tune(
    catalog: Catalog,
    fleet: Fleet,
    dispatcher: Dispatcher,
    sink: Sink,
    settings: Settings,
    *,
    run: str | None = None,
    force: bool = False,
    fingerprint: str | None = None,
    console: Console | None = None,
    timeout: float | None = None,
    poll: float = 0.5,
) -> RunSummary:
    """Run the catalog on the fleet and publish through ``sink``. Raises FarmError when no device can run it."""
    console = console or Console(stderr=True)
    settings.check_limits(catalog.policy, catalog.path)
    run = run or new_run_id()
    targets = fleet.targets()
    if fingerprint:
        targets = [t for t in targets if t.digest.startswith(fingerprint) or t.fingerprint == fingerprint]
    if not targets:
        raise FarmError("no live workers" + (f" with fingerprint {fingerprint}" if fingerprint else "") + ": start `farm worker` first")
    problems = expand(catalog, targets, run)
    if not problems:
        raise FarmError(f"{catalog.path}: no workload matches the device kinds online ({sorted({t.device_kind for t in targets})})")
    summary = RunSummary(run, devices=sum(max(1, len(t.workers)) for t in targets))
    if not force:
        decided: set[str] = set()
        for target in targets:
            decided |= sink.decided(target.digest, [p.problem_id for p in problems if p.target is target])
        summary.already_decided = [p for p in problems if p.problem_id in decided]
        problems = [p for p in problems if p.problem_id not in decided]
    by_id = {p.problem_id: p for p in problems}
    queue: deque[tuple[GroupTask, str]] = deque((t, fleet.queue(p.target)) for p in problems for t in p.tasks)
    summary.tasks = len(queue)
    limits = settings.time_limits(catalog.policy)
    batch_cap = settings.batch_limit(catalog.policy)
    observed: deque[float] = deque(maxlen=64)  # trial seconds of recent groups, for batch sizing

    def batch_size() -> int:
        """Tiny groups share one broker round trip; big ones go alone so every device gets work."""
        if len(observed) < 3:
            return 1
        mean = max(sum(observed) / len(observed), 1e-6)
        by_cost = int(settings.batch_target_seconds / mean)
        by_spread = len(queue) // (2 * max(1, summary.devices))
        return max(1, min(by_cost, by_spread, batch_cap))

    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    confirming: dict[str, str] = {}  # problem id -> worker id confirming its winner
    last_liveness = time.monotonic()
    with _progress(console, problems) as advance:
        while True:
            for again in dispatcher.take_unrun():
                queue.appendleft((again, fleet.queue(by_id[again.problem_id].target)))
            if not queue and not dispatcher.pending:
                break
            if confirming and time.monotonic() - last_liveness > 1.0:
                last_liveness = time.monotonic()
                for pid, worker_id in list(confirming.items()):
                    if not fleet.alive(worker_id):
                        del confirming[pid]
                        dispatcher.pending.pop((run, pid, CONFIRM_GROUP), None)
                        reason = f"unconfirmed: confirming worker {worker_id} went away"
                        _publish(_unconfirmed(by_id[pid].confirmation, reason), sink, summary)
            while queue and len(dispatcher.pending) < settings.max_in_flight:
                size = batch_size()
                task, name = queue.popleft()
                batch = [task]
                while queue and len(batch) < size and queue[0][1] == name:
                    batch.append(queue.popleft()[0])
                dispatcher.submit(batch, name, settings.time_limits(catalog.policy, len(batch)))
            results = dispatcher.collect(wait=poll)
            if not results:
                if deadline is not None and time.monotonic() > deadline:
                    _expire(dispatcher, queue, by_id, summary, catalog, run, sink, advance)
                    break
                continue
            for result in results:
                problem = by_id.get(result.problem_id)
                if problem is None:
                    continue
                if result.group == CONFIRM_GROUP:
                    if confirming.pop(problem.problem_id, None) is None:
                        continue  # given up on already
                    agg = confirm(problem.confirmation, result, catalog.policy)
                    _publish(agg, sink, summary)
                    continue
                if result.group in problem.results:
                    continue
                problem.results[result.group] = result
                observed.append(result.trial_seconds)
                task = next(t for t in problem.tasks if t.group == result.group)
                advance(problem.target.digest, len(task.indices))
                if problem.done:
                    agg = aggregate(problem, catalog.policy, run)
                    if agg.record is not None and agg.record.index != 0:
                        helper = fleet.confirmer(problem.target, agg.winner_worker)
                        if helper is not None:
                            problem.confirmation = agg
                            confirming[problem.problem_id] = helper[0]
                            dispatcher.submit([_confirm_task(problem, agg)], helper[1], limits)
                            continue
                        agg = _unconfirmed(agg)
                    _publish(agg, sink, summary)
    summary.wall_seconds = time.monotonic() - started
    return summary


def _confirm_task(problem: Problem, agg: Aggregate) -> GroupTask:
    assert agg.record is not None
    base = problem.tasks[0]
    from kernels import registry

    tunable = registry.get(base.operation).tunable(base.device_kind)
    impl = next(i for i, impl in enumerate(tunable.implementations) if impl.name == agg.record.name)
    return GroupTask(base.run, base.problem_id, CONFIRM_GROUP, base.operation, base.device_kind, base.spec, (impl,),
                     base.policy, base.fingerprint, base.kernels, confirm_of=agg.record.name)


def _unconfirmed(agg: Aggregate, reason: str = "unconfirmed: no second device of this fingerprint online") -> Aggregate:
    from coordinator.aggregate import Aggregate as A
    from farm.stores.base import DecisionRecord

    assert agg.record is not None
    r = agg.record
    meta = dict(r.meta, confirmation=reason)
    return A(agg.problem, DecisionRecord(r.cache_key, r.index, r.reference_index, r.name, r.verified, r.ratio, r.created, meta),
             agg.judged, agg.winner, agg.ratio, agg.error, agg.trial_seconds, agg.winner_worker)


def _publish(agg: Aggregate, sink: Sink, summary: RunSummary) -> None:
    if agg.record is not None:
        sink.publish(agg.record, agg.problem.target.fingerprint, agg.problem.problem_id, trial_rows(agg.problem, agg.judged))
    summary.aggregates.append(agg)


def _expire(dispatcher: Dispatcher, queue: deque[Any], by_id: dict[str, Problem], summary: RunSummary,
            catalog: Catalog, run: str, sink: Sink, advance: Any) -> None:
    """The run's timeout passed: every missing group is recorded as failed and what can be decided is."""
    queued = [t for t, _ in queue]
    queue.clear()
    pending = list(dispatcher.pending.values()) if isinstance(dispatcher.pending, dict) else []
    dispatcher.close()
    for item in [*queued, *pending]:
        task = item[0] if isinstance(item, tuple) else item
        problem = by_id[task.problem_id]
        if task.group == CONFIRM_GROUP:
            _publish(_unconfirmed(problem.confirmation), sink, summary)
            continue
        problem.results.setdefault(task.group, GroupResult.failed(task, "no result before the run's timeout"))
        if problem.done and not any(a.problem is problem for a in summary.aggregates):
            _publish(aggregate(problem, catalog.policy, run), sink, summary)


@contextmanager
def _progress(console: Console, problems: list[Problem]) -> Iterator[Any]:
    totals: dict[str, int] = {}
    for p in problems:
        totals[p.target.digest] = totals.get(p.target.digest, 0) + sum(len(t.indices) for t in p.tasks)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("trials"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as progress:
        bars = {digest: progress.add_task(f"fingerprint {digest[:8]}", total=total) for digest, total in totals.items()}

        def advance(digest: str, trials: int) -> None:
            progress.advance(bars[digest], trials)

        yield advance


def summary_table(summary: RunSummary) -> Table:
    """The decisions of a run as a table: one row per problem."""
    from kernels import registry

    table = Table(title=f"run {summary.run}: {summary.published} decisions, {len(summary.already_decided)} already decided")
    for column in ("fingerprint", "operation", "workload", "winner", "ratio", "verified", "confirmation", "lost"):
        table.add_column(column, no_wrap=column != "workload")
    for agg in sorted(summary.aggregates, key=lambda a: (a.problem.target.digest, a.problem.workload.where)):
        r = agg.record
        workload = registry.get(agg.problem.workload.operation).label(agg.problem.workload.spec)
        row = [agg.problem.target.digest[:8], agg.problem.workload.operation, workload]
        if r is None:
            table.add_row(*row, "-", "-", "-", "-", agg.error or "")
            continue
        lost = sum(1 for c in r.meta.get("candidates", []) if not str(c["note"]).startswith("selected"))
        confirmation = str(r.meta.get("confirmation") or "-").split(":")[0]
        table.add_row(*row, r.name, f"{r.ratio:.3f}", "yes" if r.verified else "no", confirmation, str(lost))
    return table
