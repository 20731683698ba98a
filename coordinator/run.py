"""A tuning run: target live fingerprints, dispatch group tasks with backpressure, aggregate, confirm, publish.

The run drives the board of ``farm_coordinator.machine`` (each problem's state, changed through its transitions):
every event does O(1) work on its problem, and upkeep (``farm_coordinator.claims``: leases, waiting problems,
confirmations) visits only the problems in the stages it concerns. What is sent next is the search strategy's
choice (``farm_coordinator.strategy``). What it holds
is bounded by its window of leased problems, not by the catalog: problems are made as they are taken
(``farm_coordinator.plan.Planner``), leave the board once final, and the summary keeps counts, one compact entry
per problem and the full aggregates of the first ``keep_aggregates`` only. Decisions are published in batches
(``farm_coordinator.publish``: one sink call, each publication still atomic and fenced) of up to ``PUBLISH_BATCH``
or ``PUBLISH_WAIT`` seconds; how problems leave the run is ``farm_coordinator.settle``'s. Faults:
a Redis or broker outage is waited out (back-off, never a traceback); a lost group is sent again (bounded by
``FARM_MAX_ATTEMPTS`` losses, then the problem fails: none is published with a group missing); a lost lease stops
the work on its problem; publication is fenced by the lease's token; Ctrl-C revokes the run's queued tasks and
releases its leases (:class:`RunInterrupted`).

Progress: ``tune(..., on_event=callback)`` gets a :class:`RunEvent` for every state change and group result.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable

from rich.console import Console

from farm.errors import FarmError
from farm_coordinator.aggregate import aggregate, confirm, unconfirmed
from farm_coordinator.catalog import Catalog
from farm_coordinator.claims import Claims, Taken
from farm_coordinator.dispatch import Dispatcher
from farm_coordinator.endings import expire, interrupt
from farm_coordinator.machine import ACTIVE, Board, State, Tracked
from farm_coordinator.plan import PlannedProblem, Planner, batch_size, in_flight_limit
from farm_coordinator.ports import Bans, Fleet, Leases, ProgressHook, Results, RunEvent, RunLog, RunSummary
from farm_coordinator.precompile import Precompiled, Precompiler
from farm_coordinator.publish import PUBLISH_BATCH, PUBLISH_WAIT, Publisher
from farm_coordinator.runview import CONFIRM_GROUP, confirm_task, hooked, progress, summary_table
from farm_coordinator.settle import Settlement, quietly
from farm_coordinator.sinks import Sink
from farm_coordinator.spacesearch import strategy_for
from farm_coordinator.strategy import Strategy, next_tasks
from farm_fleet.errors import RunInterrupted, StoreUnavailable
from farm_fleet.protocol import STATUS_OK, GroupResult, GroupTask
from farm_fleet.results import reusable
from farm_fleet.retry import transient
from farm_fleet.settings import Settings

__all__ = ["PUBLISH_BATCH", "PUBLISH_WAIT", "Fleet", "Leases", "Results", "RunEvent", "RunInterrupted",
           "RunSummary", "summary_table", "tune"]


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def tune(
    catalog: Catalog,
    fleet: Fleet,
    dispatcher: Dispatcher,
    sink: Sink,
    settings: Settings,
    *,
    leases: Leases | None = None,
    results: Results | None = None,
    runlog: RunLog | None = None,
    run: str | None = None,
    force: bool = False,
    fingerprint: str | None = None,
    console: Console | None = None,
    timeout: float | None = None,
    poll: float = 0.5,
    on_event: Callable[[RunEvent], None] | None = None,
    progress: ProgressHook | None = None,
    keep_aggregates: int = 1000,
    bans: Bans | None = None,
    precompile: Precompiler | None = None,
) -> RunSummary:
    """Run the catalog on the fleet and publish through ``sink``. Raises FarmError when no device can run it,
    RunInterrupted on Ctrl-C. ``on_event`` receives a :class:`RunEvent` for every step (progress displays).

    With ``leases`` (Redis), problems another live coordinator holds are waited for (or taken over when its
    lease expires), and successful group results already stored under a problem's round are reused (resume after
    a crash); failed ones run again.

    ``keep_aggregates``: how many full aggregates (verdicts, group results, records) the summary keeps, the first
    decided; every problem is in ``summary.problems`` compactly and its record in the sink.

    ``progress``: a display hook (``farm_cli.progress``) with ``started(run, problems, reused, trials)``,
    ``group_done(trials)``, ``problem_done(outcome, aggregate=None)`` (outcome "published", "failed" or "reused")
    and ``finished()``; without one, a rich bar per fingerprint is drawn on ``console`` when it is a terminal.

    ``precompile``: the compile stage run before any group is sent (``farm_coordinator.precompile``): the configs
    it rejects are planned as REJECTED with its verdicts, never sent; its notes go to ``console``.
    """
    from farm_coordinator.leases import LocalLeases
    from farm_coordinator.runlog import NoRunLog

    settings.check_limits(catalog.policy, catalog.path)
    state = _Run(catalog, fleet, dispatcher, sink, settings, leases or LocalLeases(), results, run or new_run_id(),
                 force, console or Console(stderr=True), poll, runlog or NoRunLog(), on_event, keep_aggregates,
                 progress)
    state.precompile = precompile
    return state.execute(fingerprint, timeout, bans)


class _Run:
    """The loop of one tuning run (see :func:`tune`): it owns the send queue and the queues between receiving,
    deciding and publishing; each problem's state lives on ``board``, changed through its transitions."""

    def __init__(self, catalog: Catalog, fleet: Fleet, dispatcher: Dispatcher, sink: Sink, settings: Settings,
                 leases: Leases, results: Results | None, run: str, force: bool, console: Console, poll: float,
                 runlog: RunLog, on_event: Callable[[RunEvent], None] | None, keep: int,
                 hook: ProgressHook | None, strategy: Strategy | None = None) -> None:
        self.catalog, self.fleet, self.dispatcher = catalog, fleet, dispatcher
        self.settings, self.leases, self.run = settings, leases, run
        self.console, self.poll, self.runlog = console, poll, runlog
        self.on_event, self.hook = on_event, hook
        self.strategy = strategy if strategy is not None else strategy_for(catalog.policy)
        self.policy = catalog.policy
        self.queue: deque[tuple[GroupTask, str]] = deque()
        self.board = Board([], self._moved, keep_final=False)
        self.summary = RunSummary(run, keep=keep)
        self.settle = Settlement(self.board, leases, self.summary, hook)
        self.claims = Claims(run, self.board, leases, sink, self.settle, settings, console, dispatcher, results, force)
        self.publisher = Publisher(self.board, leases, sink, self.settle, self.claims,
                                   lambda: bool(self.queue or self.dispatcher.in_flight()))
        self.inbox: deque[GroupResult] = deque()  # results collected, not yet handled
        self.to_decide: deque[str] = deque()  # problems whose search ended
        self.observed: deque[float] = deque(maxlen=64)  # trial seconds of recent groups, for batch sizing
        self.batch_cap: int = settings.batch_limit(self.policy)
        self.advance: Callable[[str, int], None] = lambda digest, trials: None
        self.groups_done = 0
        self.precompile: Precompiler | None = None
        self.precompiled = Precompiled()  # what the compile stage found and charged (empty without one)

    # -- events --------------------------------------------------------------------------------------------

    def emit(self, kind: str, problem: PlannedProblem | None = None, note: str = "") -> None:
        if self.on_event is not None:
            self.on_event(RunEvent(kind, problem, self.groups_done, self.summary.tasks, self.summary.published,
                                   self.summary.failures, note))

    def _moved(self, tracked: Tracked, old: State, new: State) -> None:
        self.emit(new.value, tracked.plan, tracked.state.note)

    def _record(self, state: str = "running") -> None:
        self.runlog.update(self.run, self.groups_done, self.summary.published, state=state)

    # -- the run ------------------------------------------------------------------------------------------

    def execute(self, fingerprint: str | None, timeout: float | None, bans: Bans | None) -> RunSummary:
        targets = self.fleet.targets()
        if fingerprint:
            targets = [t for t in targets if t.digest.startswith(fingerprint) or t.fingerprint == fingerprint]
        if not targets:
            raise FarmError("no live workers" + (f" with fingerprint {fingerprint}" if fingerprint else "")
                            + ": start `farm worker` first")
        banned = {t.digest: bans.banned(t.digest) for t in targets} if bans is not None else None
        precompiled = self.precompile(self.catalog, targets) if self.precompile is not None else None
        for note in precompiled.notes if precompiled is not None else ():
            self.console.log(note, markup=False)  # notes name configs: tiled[block=32] is not markup
        if precompiled is not None:
            self.precompiled = precompiled
            self.summary.compile_seconds = precompiled.seconds
            if self.hook is not None:
                self.hook.compiled(precompiled.seconds)
        planner = Planner(self.catalog, targets, self.run, banned, precompiled.rejected if precompiled else None,
                          None if self.claims.force else self.claims.sink.problem_records)
        if next(planner.pairs(), None) is None:
            kinds = sorted({t.device_kind for t in targets})
            raise FarmError(f"{self.catalog.path}: no workload matches the device kinds online ({kinds})")
        self.summary.devices = sum(max(1, len(t.workers)) for t in targets)
        survey = self.claims.survey(planner)
        self.summary.tasks = survey.tasks
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        self.runlog.start(self.run, self.catalog.path, self.summary.tasks)
        try:
            reused = len(survey.decided)
            view = (progress(self.console, survey.trials) if self.hook is None else
                    hooked(self.hook, self.run, survey.problems + reused, reused, sum(survey.trials.values())))
            with view as advance:
                self.advance = advance
                self._loop(deadline)
        except KeyboardInterrupt:
            interrupt(self.board, self.claims, self.publisher, self.dispatcher, self.leases, self.summary,
                      self._record)
        self.summary.wall_seconds = time.monotonic() - started
        quietly(lambda: self._record("finished"))
        return self.summary

    def _loop(self, deadline: float | None) -> None:
        next_upkeep = 0.0
        outage = 0.0
        while self.board.unfinished or self.claims.left:
            try:
                if deadline is not None and time.monotonic() > deadline:
                    expire(self.board, self.claims, self.publisher, self.settle, self.dispatcher, self.policy,
                           self.queue, self.drain)
                    return
                self.drain()
                self._taken(self.claims.refill())
                if time.monotonic() >= next_upkeep:
                    self._record()
                    self._taken(self.claims.upkeep(self.fleet))
                    waiting_only = self.board.count(*ACTIVE) == 0
                    interval = self.claims.wait_interval if waiting_only else min(1.0, self.settings.lease_ttl / 3)
                    next_upkeep = time.monotonic() + interval
                for task in self.dispatcher.lost():
                    self._lost(task)
                self._submit()
                if self.dispatcher.in_flight() == 0 and not (self.queue or self.publisher.waiting or self.to_decide):
                    # Nothing to wait on but upkeep (problems held elsewhere): sleep, never spin.
                    time.sleep(max(0.0, min(next_upkeep - time.monotonic(), 5.0)))
                    continue
                self.inbox.extend(self.dispatcher.collect(wait=self.poll))
                self.drain()
                if outage:
                    self.console.log("the farm's Redis and broker answer again; carrying on")
                    self.emit("resumed")
                    outage = 0.0
            except Exception as e:
                if not (isinstance(e, StoreUnavailable) or transient(e)):
                    raise
                if not outage:
                    self.console.log(f"lost the farm's Redis or broker ({e}); waiting for it to come back", markup=False)
                    self.emit("outage", note=str(e))
                outage = min(max(outage * 2, 0.2), 5.0)
                time.sleep(outage)

    def _taken(self, taken: Taken) -> None:
        """Apply a claim step: reuse the stored results, queue each newly leased problem's next groups, and
        publish unconfirmed the winners whose confirming worker went away."""
        for result in taken.reused:
            self.on_result(result, reused=True)
        for t in taken.mine:
            if t.stage is State.QUEUED:
                self.queue_next(t)
        for t, reason in taken.gave_up:
            assert t.state.confirming is not None
            self.publisher.conclude(unconfirmed(t.state.confirming, self.policy, reason))

    def drain(self) -> None:
        """Handle what arrived, then decide, then publish. Each step leaves its item at the head of its queue
        until it is done, so an outage in the middle loses nothing: the loop retries once the store answers."""
        while self.inbox:
            self.on_result(self.inbox[0])
            self.inbox.popleft()
        while self.to_decide:
            t = self.board.get(self.to_decide[0])
            if (t is not None and t.stage in (State.QUEUED, State.RUNNING) and t.state.ended
                    and t.state.verdict is None):
                self._decide(t)
            self.to_decide.popleft()
        self.publisher.publish()

    def _batch_size(self) -> int:
        """Tiny groups share one broker round trip; big ones go alone so every device gets work."""
        return batch_size(self.observed, len(self.queue), self.summary.devices, self.settings.batch_target_seconds,
                          self.batch_cap)

    def _sendable(self, task: GroupTask) -> bool:
        t = self.board.get(task.problem_id)
        if t is None or task.run != t.state.round:
            return False
        if task.group == CONFIRM_GROUP:
            return t.stage is State.CONFIRMING
        return t.stage in (State.QUEUED, State.RUNNING) and task.group not in t.state.results

    def _submit(self) -> None:
        limit = in_flight_limit(self.observed, self.summary.devices, self.settings.max_in_flight)
        while self.queue and self.dispatcher.in_flight() < limit:
            size = self._batch_size()
            task, name = self.queue.popleft()
            if not self._sendable(task):
                continue
            batch = [task]
            while self.queue and len(batch) < size and self.queue[0][1] == name:
                nxt = self.queue.popleft()[0]
                if self._sendable(nxt):
                    batch.append(nxt)
            try:
                self.dispatcher.submit(batch, name, self.settings.time_limits(self.policy, len(batch)))
            except Exception:
                self.queue.extendleft((t, name) for t in reversed(batch))
                raise
            for sent in batch:
                self.board.sent(sent.problem_id, sent.group)

    def _lost(self, task: GroupTask) -> None:
        """A group in flight will not come back as sent: send it again, or fail its problem past the bound."""
        t = self.board.get(task.problem_id)
        if t is None or t.stage not in ACTIVE or task.run != t.state.round:
            return
        self.summary.resent += 1
        lost = self.board.lost(t.pid, task.group)
        self.emit("lost", t.plan, task.group)
        if task.group == CONFIRM_GROUP:
            if t.stage is State.CONFIRMING:
                assert t.state.confirming is not None
                self.publisher.conclude(unconfirmed(t.state.confirming, self.policy,
                                                    "unconfirmed: the confirmation was lost"))
        elif lost >= self.settings.max_attempts:
            self.settle.failed(t, f"group {task.group}: started {lost} times and never came back")
        else:
            self.queue.appendleft((task, self.fleet.queue(t.plan.target)))

    def on_result(self, result: GroupResult, reused: bool = False) -> None:
        t = self.board.get(result.problem_id)
        if t is None or t.stage not in ACTIVE or result.run != t.state.round:
            return
        if result.group == CONFIRM_GROUP:
            if t.stage is State.CONFIRMING:
                assert t.state.confirming is not None
                # A confirmation task that failed as a task (no trials: killed, timed out waiting for the device)
                # is no verdict on the winner: the decision is published unconfirmed, saying why.
                failed = result.status != STATUS_OK and not result.outcomes
                self.publisher.conclude(unconfirmed(t.state.confirming, self.policy,
                                                    f"unconfirmed: the confirmation failed ({result.error})")
                                        if failed else confirm(t.state.confirming, result, self.policy))
            return
        if t.stage is State.CONFIRMING or not self.board.result(t.pid, result):
            return
        self.groups_done += 1
        if reused:
            self.summary.reused += 1
            self.emit("reused", t.plan, result.group)
        else:
            self.summary.ran += 1
            self.observed.append(result.trial_seconds)
            self.emit("group", t.plan, result.group)
        self.advance(t.plan.target.digest, len(t.state.asked.get(result.group) or _candidates(t, result.group)))
        if not reused:
            self.queue_next(t)

    def queue_next(self, t: Tracked) -> None:
        """Queue what the strategy sends next (``farm_coordinator.strategy.next_tasks``: with today's rule, the
        next group, carrying what the earlier ones left of the budget; a group whose turn comes after it is spent is
        recorded not tried); a problem whose search ended is decided. A group the strategy invented (a space
        search's round) whose result is stored under the round already is reused, not sent: a restarted
        coordinator's strategy asks the same groups again (the claim found only the plan's groups)."""
        name = self.fleet.queue(t.plan.target)
        tasks, not_tried = next_tasks(t.plan, t.state, self.policy.budget, self.strategy,
                                      max(1, len(t.plan.target.workers)))
        stored = self._stored([task for task in tasks if t.plan.task(task.group) is None])
        self.queue.extend((task, name) for task in tasks if task.group not in stored)
        if self.board.asked(t.pid, tasks, not_tried):
            self.to_decide.append(t.pid)
        for result in stored.values():
            self.on_result(result, reused=True)
        if stored:
            self.queue_next(t)

    def _stored(self, tasks: list[GroupTask]) -> dict[str, GroupResult]:
        results = self.claims.results
        if results is None or not tasks:
            return {}
        found = results.get_many([task.key for task in tasks])
        return {task.group: r for task, r in zip(tasks, found, strict=True) if r is not None and reusable(r)}

    def _decide(self, t: Tracked) -> None:
        charged = self.precompiled.charged_to(t.plan.target.digest, t.plan.workload.operation)
        agg = aggregate(t.plan, t.state.results, self.policy, self.run, t.state.asked, charged)
        if agg.record is not None and agg.record.index != 0:
            helper = self.fleet.confirmer(t.plan.target, agg.winner_worker)
            if helper is not None:
                self.board.confirming(t.pid, agg, (helper[0], helper[2]))
                self.queue.appendleft((confirm_task(t.plan, t.state.round or "", agg), helper[1]))
                return
            agg = unconfirmed(agg, self.policy)
        self.publisher.conclude(agg)


def _candidates(t: Tracked, group: str) -> tuple[tuple[str, str], ...]:
    task = t.plan.task(group)
    return task.candidates if task is not None else ()
