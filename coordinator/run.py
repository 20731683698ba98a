"""A tuning run: validate the catalog, target live fingerprints, dispatch group tasks with backpressure,
aggregate and confirm winners, publish decisions, and show progress and a summary."""

from __future__ import annotations

import dataclasses
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

from farm.errors import FarmError
from farm_coordinator.aggregate import Aggregate, aggregate, confirm, trial_rows, unconfirmed
from farm_coordinator.catalog import Catalog
from farm_coordinator.plan import Problem, Target, expand, next_tasks
from farm_coordinator.sinks import Sink
from farm_fleet.protocol import GroupResult, GroupTask
from farm_fleet.settings import Settings

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


class Leases(Protocol):
    """Single flight across coordinators (see farm_coordinator.leases)."""

    def acquire(self, pids: list[str], holder: str) -> set[str]: ...

    def renew(self, pids: list[str], holder: str) -> set[str]: ...

    def release(self, pid: str, holder: str) -> None: ...

    def rounds(self, pids: list[str], run: str, fresh: bool) -> dict[str, str]: ...


class Results(Protocol):
    def get_many(self, keys: list[tuple[str, str, str]]) -> list[GroupResult | None]: ...


def tune(
    catalog: Catalog,
    fleet: Fleet,
    dispatcher: Dispatcher,
    sink: Sink,
    settings: Settings,
    *,
    leases: Leases | None = None,
    results: Results | None = None,
    runlog: Any = None,
    run: str | None = None,
    force: bool = False,
    fingerprint: str | None = None,
    console: Console | None = None,
    timeout: float | None = None,
    poll: float = 0.5,
    progress: Any = None,
) -> RunSummary:
    """Run the catalog on the fleet and publish through ``sink``. Raises FarmError when no device can run it.

    With ``leases`` (Redis), problems another live coordinator holds are waited for (or taken over when its
    lease expires), and group results already stored under a problem's round are reused (resume after a crash).

    ``progress``: a hook with ``started(run, problems, reused, trials)``, ``group_done(trials)``,
    ``problem_done(outcome, aggregate=None)`` (outcome "published", "failed" or "reused") and ``finished()``
    (``farm_cli.progress``); without one, a rich bar is drawn on ``console`` when it is a terminal.
    """
    from farm_coordinator.leases import LocalLeases
    from farm_coordinator.runlog import NoRunLog

    settings.check_limits(catalog.policy, catalog.path)
    state = _Run(catalog, fleet, dispatcher, sink, settings, leases or LocalLeases(), results, run or new_run_id(),
                 force, console or Console(stderr=True), poll)
    state.runlog = runlog or NoRunLog()
    state.hook = progress
    return state.execute(fingerprint, timeout)


class _Run:
    """The state of one tuning run (see :func:`tune`)."""

    def __init__(self, catalog: Catalog, fleet: Fleet, dispatcher: Dispatcher, sink: Sink, settings: Settings,
                 leases: Leases, results: Results | None, run: str, force: bool, console: Console, poll: float) -> None:
        self.catalog, self.fleet, self.dispatcher, self.sink = catalog, fleet, dispatcher, sink
        self.settings, self.leases, self.results, self.run = settings, leases, results, run
        self.force, self.console, self.poll = force, console, poll
        self.policy = catalog.policy
        self.queue: deque[tuple[GroupTask, str]] = deque()
        self.by_id: dict[str, Problem] = {}
        self.waiting: dict[str, Problem] = {}  # held by another coordinator
        self.confirming: dict[str, str] = {}  # problem id -> worker id confirming its winner
        self.observed: deque[float] = deque(maxlen=64)  # trial seconds of recent groups, for batch sizing
        self.batch_cap = settings.batch_limit(self.policy)
        self.summary = RunSummary(run)
        self.advance: Any = lambda digest, trials: None
        self.runlog: Any = None
        self.groups_done = 0
        self.hook: Any = None

    # -- the run ------------------------------------------------------------------------------------------

    def execute(self, fingerprint: str | None, timeout: float | None) -> RunSummary:
        targets = self.fleet.targets()
        if fingerprint:
            targets = [t for t in targets if t.digest.startswith(fingerprint) or t.fingerprint == fingerprint]
        if not targets:
            raise FarmError("no live workers" + (f" with fingerprint {fingerprint}" if fingerprint else "")
                            + ": start `farm worker` first")
        problems = expand(self.catalog, targets, self.run)
        if not problems:
            kinds = sorted({t.device_kind for t in targets})
            raise FarmError(f"{self.catalog.path}: no workload matches the device kinds online ({kinds})")
        self.summary.devices = sum(max(1, len(t.workers)) for t in targets)
        if not self.force:
            decided = self._decided(problems)
            self.summary.already_decided = [p for p in problems if p.problem_id in decided]
            problems = [p for p in problems if p.problem_id not in decided]
        self.by_id = {p.problem_id: p for p in problems}
        self.summary.tasks = sum(len(p.tasks) for p in problems)
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        self.runlog.start(self.run, self.catalog.path, self.summary.tasks)
        bar = _progress(self.console, problems) if self.hook is None else _hooked(self.hook, self, problems)
        with bar as advance:
            self.advance = advance
            self._claim(problems)
            last_upkeep = time.monotonic()
            while True:
                for again in self.dispatcher.take_unrun():
                    self.queue.appendleft((again, self.fleet.queue(self.by_id[again.problem_id].target)))
                if not self.queue and not self.dispatcher.pending and not self.waiting:
                    break
                if time.monotonic() - last_upkeep > min(1.0, self.settings.lease_ttl / 3):
                    last_upkeep = time.monotonic()
                    self._upkeep()
                self._submit()
                done = self.dispatcher.collect(wait=self.poll)
                for result in done:
                    self._on_result(result)
                if not done and deadline is not None and time.monotonic() > deadline:
                    self._expire()
                    break
        self.summary.wall_seconds = time.monotonic() - started
        self.runlog.update(self.run, self.groups_done, self.summary.published, state="finished")
        return self.summary

    def _decided(self, problems: list[Problem]) -> set[str]:
        decided: set[str] = set()
        for digest in {p.target.digest for p in problems}:
            decided |= self.sink.decided(digest, [p.problem_id for p in problems if p.target.digest == digest])
        return decided

    def _claim(self, problems: list[Problem]) -> None:
        """Lease what is free, give each leased problem its round, reuse results stored under it, queue the rest."""
        if not problems:
            return
        held = self.leases.acquire([p.problem_id for p in problems], self.run)
        for p in problems:
            if p.problem_id not in held:
                self.waiting[p.problem_id] = p
        mine = [p for p in problems if p.problem_id in held]
        if not mine:
            return
        rounds = self.leases.rounds([p.problem_id for p in mine], self.run, fresh=self.force)
        for p in mine:
            self.waiting.pop(p.problem_id, None)
            p.tasks = [dataclasses.replace(t, run=rounds[p.problem_id]) for t in p.tasks]
        if self.results is not None:
            keys = [(t.run, t.problem_id, t.group) for p in mine for t in p.tasks]
            for found in self.results.get_many(keys):
                if found is not None:
                    self._on_result(found, reused=True)
        for p in mine:
            self._queue_next(p)

    def _queue_next(self, problem: Problem) -> None:
        """Queue the problem's next group (groups run in turn, carrying what is left of the budget); decide the
        problem when every group has a result."""
        if problem.done or self._published(problem):
            return
        name = self.fleet.queue(problem.target)
        before = set(problem.results)
        self.queue.extend((t, name) for t in next_tasks(problem, self.policy.budget))
        for task in problem.tasks:  # groups not sent for lack of budget count as done on the progress bar
            if task.group in problem.results and task.group not in before:
                self.advance(problem.target.digest, len(task.candidates))
        if problem.done:
            self._decide(problem)

    def _upkeep(self) -> None:
        """Renew our leases, settle problems others decided, take over problems whose holder died, and give up on
        confirmations whose worker went away."""
        self.runlog.update(self.run, self.groups_done, self.summary.published)
        ours = [pid for pid, p in self.by_id.items() if pid not in self.waiting and not self._published(p)]
        for pid in self.leases.renew(ours, self.run):
            self.console.log(f"lost the lease of problem {pid}; another coordinator took it over")
        if self.waiting:
            waiting = list(self.waiting.values())
            for pid in self._decided(waiting) if not self.force else set():
                self.summary.already_decided.append(self.waiting.pop(pid))
                if self.hook is not None:
                    self.hook.problem_done("reused")
            self._claim(list(self.waiting.values()))
        for pid, worker_id in list(self.confirming.items()):
            if not self.fleet.alive(worker_id):
                del self.confirming[pid]
                self.dispatcher.pending.pop((self.by_id[pid].tasks[0].run, pid, CONFIRM_GROUP), None)
                self._publish(unconfirmed(self.by_id[pid].confirmation, self.policy,
                                          f"unconfirmed: confirming worker {worker_id} went away"))

    def _published(self, problem: Problem) -> bool:
        return any(a.problem is problem for a in self.summary.aggregates)

    def _batch_size(self) -> int:
        """Tiny groups share one broker round trip; big ones go alone so every device gets work."""
        if len(self.observed) < 3:
            return 1
        mean = max(sum(self.observed) / len(self.observed), 1e-6)
        by_cost = int(self.settings.batch_target_seconds / mean)
        by_spread = len(self.queue) // (2 * max(1, self.summary.devices))
        return max(1, min(by_cost, by_spread, self.batch_cap))

    def _submit(self) -> None:
        while self.queue and len(self.dispatcher.pending) < self.settings.max_in_flight:
            size = self._batch_size()
            task, name = self.queue.popleft()
            batch = [task]
            while self.queue and len(batch) < size and self.queue[0][1] == name:
                batch.append(self.queue.popleft()[0])
            self.dispatcher.submit(batch, name, self.settings.time_limits(self.policy, len(batch)))

    def _on_result(self, result: GroupResult, reused: bool = False) -> None:
        problem = self.by_id.get(result.problem_id)
        if problem is None or problem.problem_id in self.waiting or self._published(problem):
            return
        if result.group == CONFIRM_GROUP:
            if self.confirming.pop(problem.problem_id, None) is not None:
                self._publish(confirm(problem.confirmation, result, self.policy))
            return
        if result.group in problem.results or result.run != problem.tasks[0].run:
            return
        problem.results[result.group] = result
        self.groups_done += 1
        if not reused:
            self.observed.append(result.trial_seconds)
        task = next(t for t in problem.tasks if t.group == result.group)
        self.advance(problem.target.digest, len(task.candidates))
        if problem.done:
            self._decide(problem)
        elif not reused:
            self._queue_next(problem)

    def _decide(self, problem: Problem) -> None:
        agg = aggregate(problem, self.policy, self.run)
        if agg.record is not None and agg.record.index != 0:
            helper = self.fleet.confirmer(problem.target, agg.winner_worker)
            if helper is not None:
                problem.confirmation = agg
                self.confirming[problem.problem_id] = helper[0]
                task = _confirm_task(problem, agg)
                self.dispatcher.submit([task], helper[1], self.settings.time_limits(self.policy))
                return
            agg = unconfirmed(agg, self.policy)
        self._publish(agg)

    def _publish(self, agg: Aggregate) -> None:
        if agg.record is not None:
            self.sink.publish(agg.record, agg.problem.target.fingerprint, agg.problem.problem_id,
                              trial_rows(agg.problem, agg.judged))
        self.summary.aggregates.append(agg)
        self.leases.release(agg.problem.problem_id, self.run)
        if self.hook is not None:
            self.hook.problem_done("published" if agg.record is not None else "failed", agg)

    def _expire(self) -> None:
        """The run's timeout passed: every missing group is recorded as failed and what can be decided is."""
        queued = [t for t, _ in self.queue]
        self.queue.clear()
        pending = [item[0] for item in self.dispatcher.pending.values()]
        self.dispatcher.close()
        for problem in self.waiting.values():
            self.summary.aggregates.append(Aggregate(problem, None, (), None, None,
                                                     "held by another coordinator until the timeout", 0.0))
            if self.hook is not None:
                self.hook.problem_done("failed", self.summary.aggregates[-1])
        self.waiting.clear()
        unsent = [t for p in self.by_id.values() for t in p.tasks if t.group not in p.results and t.group not in p.sent]
        for task in [*queued, *pending, *unsent]:
            problem = self.by_id[task.problem_id]
            if self._published(problem):
                continue
            if task.group == CONFIRM_GROUP:
                self._publish(unconfirmed(problem.confirmation, self.policy, "unconfirmed: no confirmation before the timeout"))
                continue
            problem.results.setdefault(task.group, GroupResult.failed(task, "no result before the run's timeout"))
            if problem.done:
                self._publish(aggregate(problem, self.policy, self.run))


def _confirm_task(problem: Problem, agg: Aggregate) -> GroupTask:
    assert agg.record is not None
    base = problem.tasks[0]
    winner = (agg.record.name, problem.revision(agg.record.name))
    return GroupTask(base.run, base.problem_id, CONFIRM_GROUP, base.operation, base.device_kind, base.spec, (winner,),
                     base.policy, base.fingerprint, base.kernels, confirm_of=agg.record.name)


@contextmanager
def _progress(console: Console, problems: list[Problem]) -> Iterator[Any]:
    totals: dict[str, int] = {}
    for p in problems:
        totals[p.target.digest] = totals.get(p.target.digest, 0) + sum(len(t.candidates) for t in p.tasks)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("trials"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as progress:
        bars = {digest: progress.add_task(f"fingerprint {digest[:8]}", total=total) for digest, total in totals.items()}

        def advance(digest: str, trials: int) -> None:
            progress.advance(bars[digest], trials)

        yield advance


@contextmanager
def _hooked(hook: Any, state: _Run, problems: list[Problem]) -> Iterator[Any]:
    """The progress hook in place of the bar: problems (with those already decided) and trials."""
    reused = len(state.summary.already_decided)
    hook.started(state.run, len(problems) + reused, reused, sum(len(t.candidates) for p in problems for t in p.tasks))
    try:
        yield lambda digest, trials: hook.group_done(trials)
    finally:
        hook.finished()


def summary_table(summary: RunSummary) -> Table:
    """The decisions of a run as a table: one row per problem."""
    from farm_kernels import registry

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
        lost = sum(1 for c in r.meta.get("candidates", []) if c["name"] != r.name)
        confirmation = str(r.meta.get("confirmation") or "-").split(":")[0]
        table.add_row(*row, r.name, f"{r.ratio:.3f}", "yes" if r.verified else "no", confirmation, str(lost))
    return table
