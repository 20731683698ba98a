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

Entry: ``tune(catalog, parts, settings, options)``: :class:`Parts` (the fleet, dispatcher, sink and the other ports
the run is given, and its one :class:`RunObserver`, which gets the progress, a :class:`RunEvent` for every state
change and group result, and the notes) and :class:`RunOptions` (frozen: run id, force, timeout, budget, ...).
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from farm.errors import FarmError
from farm_coordinator.aggregate import aggregate, confirm, unconfirmed
from farm_coordinator.catalog import Catalog
from farm_coordinator.claims import Claims, Taken
from farm_coordinator.endings import expire, interrupt
from farm_coordinator.machine import ACTIVE, Board, State, Tracked
from farm_coordinator.plan import FleetPriors, PlannedProblem, Planner, batch_size, in_flight_limit
from farm_coordinator.ports import (
    Fleet,
    Leases,
    Parts,
    Results,
    RunEvent,
    RunLog,
    RunObserver,
    RunOptions,
    RunSummary,
)
from farm_coordinator.precompile import Precompiled
from farm_coordinator.priors import run_lookup
from farm_coordinator.publish import PUBLISH_BATCH, PUBLISH_WAIT, Publisher
from farm_coordinator.runbudget import bought_by, budgeted
from farm_coordinator.runview import CONFIRM_GROUP, ConsoleObserver, confirm_task, observed
from farm_coordinator.settle import Settlement, quietly
from farm_coordinator.spacestrategy import strategy_for
from farm_coordinator.strategy import Strategy, next_tasks
from farm_fleet.errors import RunInterrupted, StoreUnavailable
from farm_fleet.protocol import STATUS_OK, GroupResult, GroupTask
from farm_fleet.results import reusable
from farm_fleet.retry import transient
from farm_fleet.settings import Settings

__all__ = ["PUBLISH_BATCH", "PUBLISH_WAIT", "Fleet", "Leases", "Parts", "Results", "RunEvent", "RunInterrupted",
           "RunObserver", "RunOptions", "RunSummary", "tune"]


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


DEFAULT_OPTIONS = RunOptions()


def tune(catalog: Catalog, parts: Parts, settings: Settings, options: RunOptions = DEFAULT_OPTIONS) -> RunSummary:
    """Run the catalog on ``parts.fleet`` and publish into ``parts.sink``. Raises FarmError when no device can run
    it, RunInterrupted on Ctrl-C. ``parts.observer`` (:class:`RunObserver`; default
    ``farm_coordinator.runview.ConsoleObserver``) is told the progress, every :class:`RunEvent` and the notes.

    With ``parts.leases`` (Redis), problems another live coordinator holds are waited for (or taken over when its
    lease expires), and successful group results already stored under a problem's round are reused (resume after
    a crash); failed ones run again.

    ``options.keep_aggregates``: how many full aggregates (verdicts, group results, records) the summary keeps, the
    first decided; every problem is in ``summary.problems`` compactly and its record in the sink.

    ``parts.precompile``: the compile stage run before any group is sent (``farm_coordinator.precompile``): the
    configs it rejects are planned as REJECTED with its verdicts, never sent; its notes go to the observer.

    ``options.priors``: a problem whose fingerprint has no decision of its family starts its space search from
    other fingerprints' decisions of the family, found in the sink's store and the ``options.prior_archives``
    directories (``farm_coordinator.priors``); False: none (``farm tune --no-priors``).

    ``options.budget_device_seconds`` (else ``catalog.run_budget``): the run's budget
    (``farm_coordinator.runbudget``); what it bought is ``summary.budget``.
    """
    settings.check_limits(catalog.policy, catalog.path)
    if options.budget_device_seconds is not None:
        catalog = replace(catalog, run_budget=options.budget_device_seconds)
    state = _Run(catalog, parts, settings, options)
    return bought_by(state.dispatcher, state.execute())


class _Run:
    """The loop of one tuning run (see :func:`tune`): it owns the send queue and the queues between receiving,
    deciding and publishing; each problem's state lives on ``board``, changed through its transitions."""

    def __init__(self, catalog: Catalog, parts: Parts, settings: Settings, options: RunOptions,
                 strategy: Strategy | None = None) -> None:
        from farm_coordinator.leases import LocalLeases
        from farm_coordinator.runlog import NoRunLog

        self.catalog, self.fleet, self.settings, self.options = catalog, parts.fleet, settings, options
        self.dispatcher = budgeted(parts.dispatcher, parts.fleet, catalog)  # catalog.run_budget's gate, if any
        self.leases: Leases = parts.leases if parts.leases is not None else LocalLeases()
        self.run = options.run or new_run_id()
        self.observer: RunObserver = parts.observer if parts.observer is not None else ConsoleObserver()
        self.runlog: RunLog = parts.runlog if parts.runlog is not None else NoRunLog()
        self.bans, self.precompile = parts.bans, parts.precompile
        self.strategy = strategy if strategy is not None else strategy_for(catalog.policy)
        self.policy = catalog.policy
        self.queue: deque[tuple[GroupTask, str]] = deque()
        self.board = Board([], self._moved, keep_final=False)
        self.summary = RunSummary(self.run, keep=options.keep_aggregates)
        self.settle = Settlement(self.board, self.leases, self.summary, self.observer)
        self.claims = Claims(self.run, self.board, self.leases, parts.sink, self.settle, settings, self.observer.note,
                             self.dispatcher, parts.results, options.force)
        self.publisher = Publisher(self.board, self.leases, parts.sink, self.settle, self.claims,
                                   lambda: bool(self.queue or self.dispatcher.in_flight()))
        self.inbox: deque[GroupResult] = deque()  # results collected, not yet handled
        self.to_decide: deque[str] = deque()  # problems whose search ended
        self.observed: deque[float] = deque(maxlen=64)  # trial seconds of recent groups, for batch sizing
        self.batch_cap: int = settings.batch_limit(self.policy)
        self.advance: Callable[[int, int], None] = lambda trials, planned: None
        self.groups_done = 0
        # other fingerprints' decisions (farm_coordinator.priors)
        self.fleet_priors: FleetPriors | None = run_lookup(parts.sink, options.priors, options.prior_archives)
        self.precompiled = Precompiled()  # what the compile stage found and charged (empty without one)

    # -- events --------------------------------------------------------------------------------------------

    def emit(self, kind: str, problem: PlannedProblem | None = None, note: str = "") -> None:
        self.observer.event(RunEvent(kind, problem, self.groups_done, self.summary.tasks, self.summary.published,
                                     self.summary.failures, note))

    def _moved(self, tracked: Tracked, old: State, new: State) -> None:
        self.emit(new.value, tracked.plan, tracked.state.note)

    def _record(self, state: str = "running") -> None:
        self.runlog.update(self.run, self.groups_done, self.summary.published, state=state, groups=self.summary.tasks,
                           partial=self.summary.partial)

    # -- the run ------------------------------------------------------------------------------------------

    def execute(self) -> RunSummary:
        fingerprint = self.options.fingerprint
        targets = self.fleet.targets()
        if fingerprint:
            targets = [t for t in targets if t.digest.startswith(fingerprint) or t.fingerprint == fingerprint]
        if not targets:
            raise FarmError("no live workers" + (f" with fingerprint {fingerprint}" if fingerprint else "")
                            + ": start `farm worker` first")
        banned = {t.digest: self.bans.banned(t.digest) for t in targets} if self.bans is not None else None
        precompiled = self.precompile(self.catalog, targets) if self.precompile is not None else None
        if precompiled is not None:
            for note in precompiled.notes:
                self.observer.note(note)
            self.precompiled = precompiled
            self.summary.compile_seconds = precompiled.seconds
            self.observer.compiled(precompiled.seconds)
        planner = Planner(self.catalog, targets, self.run, banned, precompiled.rejected if precompiled else None,
                          None if self.claims.force else self.claims.sink.problem_records, self.fleet_priors)
        if next(planner.pairs(), None) is None:
            kinds = sorted({t.device_kind for t in targets})
            raise FarmError(f"{self.catalog.path}: no workload matches the device kinds online ({kinds})")
        self.summary.devices = sum(max(1, len(t.workers)) for t in targets)
        survey = self.claims.survey(planner)
        self.summary.tasks = survey.tasks
        started = time.monotonic()
        deadline = None if self.options.timeout is None else started + self.options.timeout
        self.runlog.start(self.run, self.catalog.path, self.summary.tasks)
        try:
            reused = len(survey.decided)
            with observed(self.observer, self.run, survey.problems + reused, reused,
                          sum(survey.trials.values())) as advance:
                self.advance = advance
                self._loop(deadline)
        except KeyboardInterrupt:
            interrupt(self.board, self.claims, self.publisher, self.dispatcher, self.leases, self.summary,
                      self._record)
        self.summary.wall_seconds = time.monotonic() - started
        every_one_failed = self.summary.failures and not (self.summary.published or self.summary.decided_before)
        quietly(lambda: self._record("failed" if every_one_failed else "finished"))
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
                self.inbox.extend(self.dispatcher.collect(wait=self.options.poll))
                self.drain()
                if outage:
                    self.observer.note("the farm's Redis and broker answer again; carrying on")
                    self.emit("resumed")
                    outage = 0.0
            except Exception as e:
                if not (isinstance(e, StoreUnavailable) or transient(e)):
                    raise
                if not outage:
                    self.observer.note(f"lost the farm's Redis or broker ({e}); waiting for it to come back")
                    self.emit("outage", note=str(e))
                outage = min(max(outage * 2, 0.2), 5.0)
                time.sleep(outage)

    def _taken(self, taken: Taken) -> None:
        """Apply a claim step: reuse the stored results, queue each newly leased problem's next groups, and
        publish unconfirmed the winners whose confirming worker went away."""
        for _digest, tasks, trials in taken.replanned:
            self.summary.tasks += tasks
            self.advance(0, trials)
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
                    and t.state.aggregate is None):
                self._decide(t)
            self.to_decide.popleft()
        self.publisher.publish()

    def _batch_size(self) -> int:
        """Tiny groups share one broker round trip; big ones go alone so every device gets work."""
        return batch_size(self.observed, len(self.queue), self.summary.devices, self.settings.batch_target_seconds,
                          self.batch_cap)

    def _sendable(self, task: GroupTask) -> bool:
        t = self.board.get(task.problem_id)
        if t is None or task.run != t.state.run:
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
            # One operation per batch: its task is named by it from sending to success (farm_coordinator.tasknames).
            while (self.queue and len(batch) < size and self.queue[0][1] == name
                   and self.queue[0][0].operation == task.operation):
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
        if t is None or t.stage not in ACTIVE or task.run != t.state.run:
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
        if t is None or t.stage not in ACTIVE or result.run != t.state.run:
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
        self.advance(len(t.state.asked.get(result.group) or _candidates(t, result.group)), 0)
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
        invented = [task for task in tasks if t.plan.task(task.group) is None]  # a strategy's own groups: planned now
        if invented:
            self.summary.tasks += len(invented)
            self.advance(0, sum(len(task.candidates) for task in invented))
        stored = self._stored(invented)
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
                self.queue.appendleft((confirm_task(t.plan, t.state.run or "", agg), helper[1]))
                return
            agg = unconfirmed(agg, self.policy)
        self.publisher.conclude(agg)


def _candidates(t: Tracked, group: str) -> tuple[tuple[str, str], ...]:
    task = t.plan.task(group)
    return task.candidates if task is not None else ()
