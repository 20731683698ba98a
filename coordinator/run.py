"""A tuning run: target live fingerprints, dispatch group tasks with backpressure, aggregate, confirm, publish.

The run drives the state machine of ``farm_coordinator.machine``: every event does O(1) work on its problem, and
upkeep (leases, waiting problems, confirmations) visits only the problems in the states it concerns. What it holds
is bounded by its window of leased problems, not by the catalog: problems are made as they are taken
(``farm_coordinator.plan.Planner``), leave the board once final, and the summary keeps counts, one compact entry
per problem and the full aggregates of the first ``keep_aggregates`` only. Decisions are published in batches (one
sink call, each publication still atomic and fenced) of up to ``PUBLISH_BATCH`` or ``PUBLISH_WAIT`` seconds. Faults:
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
from farm.stores.base import Publication
from farm_coordinator.aggregate import Aggregate, aggregate, confirm, trial_rows, unconfirmed
from farm_coordinator.catalog import Catalog
from farm_coordinator.claims import Claims
from farm_coordinator.dispatch import Dispatcher
from farm_coordinator.endings import expire, interrupt, quietly
from farm_coordinator.machine import ACTIVE, Board, State, Tracked
from farm_coordinator.plan import Planner, Problem, batch_size, in_flight_limit, next_tasks
from farm_coordinator.ports import Bans, Fleet, Leases, ProgressHook, Results, RunEvent, RunLog, RunSummary
from farm_coordinator.runview import CONFIRM_GROUP, confirm_task, hooked, progress, summary_table
from farm_coordinator.sinks import Sink
from farm_fleet.errors import RunInterrupted, StoreUnavailable
from farm_fleet.protocol import STATUS_OK, GroupResult, GroupTask
from farm_fleet.retry import transient
from farm_fleet.settings import Settings

__all__ = ["Fleet", "Leases", "Results", "RunEvent", "RunInterrupted", "RunSummary", "summary_table", "tune"]

PUBLISH_BATCH = 256  # decisions per sink call at most (fewer commits, or round trips, per decision)...
PUBLISH_WAIT = 0.2  # ...and seconds the first of them waits at most (it never waits when nothing else is running)


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
    """
    from farm_coordinator.leases import LocalLeases
    from farm_coordinator.runlog import NoRunLog

    settings.check_limits(catalog.policy, catalog.path)
    state = _Run(catalog, fleet, dispatcher, sink, settings, leases or LocalLeases(), results, run or new_run_id(),
                 force, console or Console(stderr=True), poll, runlog or NoRunLog(), on_event, keep_aggregates)
    state.hook = progress
    state.bans = bans
    return state.execute(fingerprint, timeout)


class _Run:
    """The state of one tuning run (see :func:`tune`)."""

    def __init__(self, catalog: Catalog, fleet: Fleet, dispatcher: Dispatcher, sink: Sink, settings: Settings,
                 leases: Leases, results: Results | None, run: str, force: bool, console: Console, poll: float,
                 runlog: RunLog, on_event: Callable[[RunEvent], None] | None, keep: int) -> None:
        self.catalog, self.fleet, self.dispatcher, self.sink = catalog, fleet, dispatcher, sink
        self.settings, self.leases, self.results, self.run = settings, leases, results, run
        self.force, self.console, self.poll, self.runlog = force, console, poll, runlog
        self.on_event = on_event
        self.policy = catalog.policy
        self.queue: deque[tuple[GroupTask, str]] = deque()
        self.board = Board([], self._moved, keep_final=False)
        self.claims = Claims(self)
        self.inbox: deque[GroupResult] = deque()  # results collected, not yet handled
        self.to_decide: deque[str] = deque()  # problems whose groups are all back
        self.to_publish: deque[Aggregate] = deque()  # decided, publication not yet acknowledged by the store
        self.publish_since = 0.0  # when the oldest of them was decided
        self.observed: deque[float] = deque(maxlen=64)  # trial seconds of recent groups, for batch sizing
        self.batch_cap: int = settings.batch_limit(self.policy)
        self.summary = RunSummary(run, keep=keep)
        self.advance: Callable[[str, int], None] = lambda digest, trials: None
        self.groups_done = 0
        self.hook: ProgressHook | None = None
        self.bans: Bans | None = None

    # -- events --------------------------------------------------------------------------------------------

    def emit(self, kind: str, problem: Problem | None = None, note: str = "") -> None:
        if self.on_event is not None:
            self.on_event(RunEvent(kind, problem, self.groups_done, self.summary.tasks, self.summary.published,
                                   self.summary.failures, note))

    def settled(self, outcome: str, agg: Aggregate | None = None) -> None:
        """A problem left the run: published, failed, or reused (decided by an earlier run or another coordinator)."""
        if self.hook is not None:
            self.hook.problem_done(outcome, agg)

    def _moved(self, tracked: Tracked, old: State, new: State) -> None:
        self.emit(new.value, tracked.problem, tracked.note)

    # -- the run ------------------------------------------------------------------------------------------

    def execute(self, fingerprint: str | None, timeout: float | None) -> RunSummary:
        targets = self.fleet.targets()
        if fingerprint:
            targets = [t for t in targets if t.digest.startswith(fingerprint) or t.fingerprint == fingerprint]
        if not targets:
            raise FarmError("no live workers" + (f" with fingerprint {fingerprint}" if fingerprint else "")
                            + ": start `farm worker` first")
        bans = {t.digest: self.bans.banned(t.digest) for t in targets} if self.bans is not None else None
        planner = Planner(self.catalog, targets, self.run, bans)
        if next(planner.pairs(), None) is None:
            kinds = sorted({t.device_kind for t in targets})
            raise FarmError(f"{self.catalog.path}: no workload matches the device kinds online ({kinds})")
        self.summary.devices = sum(max(1, len(t.workers)) for t in targets)
        survey = self.claims.survey(planner, self.force)
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
            interrupt(self)
        self.summary.wall_seconds = time.monotonic() - started
        quietly(lambda: self.runlog.update(self.run, self.groups_done, self.summary.published, state="finished"))
        return self.summary

    def _loop(self, deadline: float | None) -> None:
        next_upkeep = 0.0
        outage = 0.0
        while self.board.unfinished or self.claims.left:
            try:
                if deadline is not None and time.monotonic() > deadline:
                    expire(self)
                    return
                self.drain()
                self.claims.refill()
                if time.monotonic() >= next_upkeep:
                    self.claims.upkeep()
                    waiting_only = self.board.count(*ACTIVE) == 0
                    interval = self.claims.wait_interval if waiting_only else min(1.0, self.settings.lease_ttl / 3)
                    next_upkeep = time.monotonic() + interval
                for task in self.dispatcher.lost():
                    self._lost(task)
                self._submit()
                if self.dispatcher.in_flight() == 0 and not (self.queue or self.to_publish or self.to_decide):
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
                    self.console.log(f"lost the farm's Redis or broker ({e}); waiting for it to come back")
                    self.emit("outage", note=str(e))
                outage = min(max(outage * 2, 0.2), 5.0)
                time.sleep(outage)

    def drain(self) -> None:
        """Handle what arrived, then decide, then publish. Each step leaves its item at the head of its queue
        until it is done, so an outage in the middle loses nothing: the loop retries once the store answers."""
        while self.inbox:
            self.on_result(self.inbox[0])
            self.inbox.popleft()
        while self.to_decide:
            t = self.board.get(self.to_decide[0])
            if t is not None and t.state in (State.QUEUED, State.RUNNING) and t.problem.done and t.verdict is None:
                self._decide(t)
            self.to_decide.popleft()
        self.publish_pending()

    def _batch_size(self) -> int:
        """Tiny groups share one broker round trip; big ones go alone so every device gets work."""
        return batch_size(self.observed, len(self.queue), self.summary.devices, self.settings.batch_target_seconds,
                          self.batch_cap)

    def _sendable(self, task: GroupTask) -> bool:
        t = self.board.get(task.problem_id)
        if t is None or task.run != t.round:
            return False
        if task.group == CONFIRM_GROUP:
            return t.state is State.CONFIRMING
        return t.state in (State.QUEUED, State.RUNNING) and task.group not in t.problem.results

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
                tracked = self.board[sent.problem_id]
                tracked.sends[sent.group] = tracked.sends.get(sent.group, 0) + 1
                if tracked.state is State.QUEUED:
                    self.board.move(sent.problem_id, State.RUNNING)

    def _lost(self, task: GroupTask) -> None:
        """A group in flight will not come back as sent: send it again, or fail its problem past the bound."""
        t = self.board.get(task.problem_id)
        if t is None or t.state not in ACTIVE or task.run != t.round:
            return
        self.summary.resent += 1
        t.lost[task.group] = lost = t.lost.get(task.group, 0) + 1
        self.emit("lost", t.problem, task.group)
        if task.group == CONFIRM_GROUP:
            if t.state is State.CONFIRMING:
                self.conclude(unconfirmed(t.problem.confirmation, self.policy, "unconfirmed: the confirmation was lost"))
        elif lost >= self.settings.max_attempts:
            self.fail(t, f"group {task.group}: started {lost} times and never came back")
        else:
            self.queue.appendleft((task, self.fleet.queue(t.problem.target)))

    def on_result(self, result: GroupResult, reused: bool = False) -> None:
        t = self.board.get(result.problem_id)
        if t is None or t.state not in ACTIVE or result.run != t.round:
            return
        problem = t.problem
        if result.group == CONFIRM_GROUP and t.state is State.CONFIRMING:
            # A confirmation task that failed as a task (no trials: killed, timed out waiting for the device) is
            # no verdict on the winner: the decision is published unconfirmed, saying why.
            failed = result.status != STATUS_OK and not result.outcomes
            self.conclude(unconfirmed(problem.confirmation, self.policy,
                                      f"unconfirmed: the confirmation failed ({result.error})")
                          if failed else confirm(problem.confirmation, result, self.policy))
        if result.group == CONFIRM_GROUP:
            return
        if result.group in problem.results or t.state is State.CONFIRMING:
            return
        problem.results[result.group] = result
        self.groups_done += 1
        if reused:
            self.summary.reused += 1
            self.emit("reused", problem, result.group)
        else:
            self.summary.ran += 1
            self.observed.append(result.trial_seconds)
            self.emit("group", problem, result.group)
        task = next(task for task in problem.tasks if task.group == result.group)
        self.advance(problem.target.digest, len(task.candidates))
        if problem.done:
            self.to_decide.append(t.pid)
        elif not reused:
            self.queue_next(t)

    def queue_next(self, t: Tracked) -> None:
        """Queue the problem's next group: a problem's groups run in turn, each carrying what the earlier ones left
        of the budget (``farm_coordinator.plan.next_tasks``); groups whose turn comes after it is spent are
        recorded not tried, and a problem with every group back is decided."""
        name = self.fleet.queue(t.problem.target)
        self.queue.extend((task, name) for task in next_tasks(t.problem, self.policy.budget))
        if t.problem.done:
            self.to_decide.append(t.pid)

    def _decide(self, t: Tracked) -> None:
        agg = aggregate(t.problem, self.policy, self.run)
        if agg.record is not None and agg.record.index != 0:
            helper = self.fleet.confirmer(t.problem.target, agg.winner_worker)
            if helper is not None:
                t.problem.confirmation = agg
                t.confirmer = (helper[0], helper[2])
                self.board.move(t.pid, State.CONFIRMING)
                self.queue.appendleft((confirm_task(t.problem, agg), helper[1]))
                return
            agg = unconfirmed(agg, self.policy)
        self.conclude(agg)

    def conclude(self, agg: Aggregate) -> None:
        """A problem is decided: publish it (with the next batch, or once the store answers again). The first
        verdict of a claim stands: a later one (a confirmation given up on meanwhile) is ignored."""
        t = self.board[agg.problem.problem_id]
        if t.verdict is not None:
            return
        if agg.record is None:
            self.fail(t, agg.error or "nothing to publish", agg)
            return
        t.verdict = agg
        if not self.to_publish:
            self.publish_since = time.monotonic()
        self.to_publish.append(agg)

    def publish_pending(self, flush: bool = False) -> None:
        """Publish the decisions waiting, in one sink call, once there are ``PUBLISH_BATCH`` of them, the oldest
        waited ``PUBLISH_WAIT`` seconds, nothing else is under way, or ``flush``. Each publication is atomic and
        fenced by its own lease; a problem whose claim ended meanwhile is left out."""
        if not self.to_publish or not (
                flush or len(self.to_publish) >= PUBLISH_BATCH or not (self.queue or self.dispatcher.in_flight())
                or time.monotonic() - self.publish_since >= PUBLISH_WAIT):
            return
        batch: list[tuple[Aggregate, Tracked, tuple[str, str] | None]] = []
        publications = []
        for agg in self.to_publish:
            t = self.board.get(agg.problem.problem_id)
            if t is None or t.verdict is not agg or t.state not in ACTIVE or t.lease is None:
                continue
            assert agg.record is not None
            fence = self.leases.fence(t.pid, t.lease)
            batch.append((agg, t, fence))
            publications.append(Publication(agg.record, agg.problem.target.fingerprint, t.pid,
                                            tuple(trial_rows(agg.problem, agg.judged)), fence=fence))
        replies = self.sink.publish_many(publications) if publications else []
        self.to_publish.clear()
        for (agg, t, fence), (_, reason) in zip(batch, replies, strict=True):
            t.verdict = None
            if reason.startswith("refused"):
                if t.pid in self.claims.decided([t.problem]):  # theirs (or ours, its reply lost and the call retried)
                    self.summary.decided_elsewhere(t.problem)
                    self.board.move(t.pid, State.PUBLISHED, "decided by another coordinator")
                    self.settled("reused")
                else:
                    self.claims.lose(t)
                continue
            lease = t.lease or ""
            self.summary.decided(agg)
            self.board.move(t.pid, State.PUBLISHED, reason)
            self.settled("published", agg)
            if fence is None:
                self.leases.release(t.pid, lease)

    def fail(self, t: Tracked, reason: str, agg: Aggregate | None = None) -> None:
        """Nothing will be published for ``t`` in this run (``agg``: the verdict that says why, if any)."""
        agg = agg or Aggregate(t.problem, None, (), None, None, reason, 0.0)
        self.summary.decided(agg, reason)
        self.settled("failed", agg)
        lease = t.lease
        self.board.move(t.pid, State.FAILED, reason)
        if lease is not None:
            quietly(lambda: self.leases.release(t.pid, lease))
