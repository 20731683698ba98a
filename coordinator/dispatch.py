"""Dispatchers: how group tasks reach devices and results come back. A dispatcher owns its pending work: what
was sent, when, and when it counts as lost.

- :class:`CeleryDispatcher`: ``send_task`` to the fingerprint's (or a worker's own) queue with time limits from
  the policy. Results travel one way, through the farm's results store: the coordinator blocks on the completion
  notices workers push (``prefix:done:<round>``) and reads only the results they name, plus a sweep of what is in
  flight every ``sweep`` seconds (a notice lost while Redis was unreachable). A group is **lost** (sent again by
  the coordinator) when it has no result ``Settings.lost_after(hard limit)`` seconds after its delivery started,
  or at once when its batch ended without running it. A group that never started while its queue stood still
  that long (a message stuck in a restarted broker, or held by a worker that died) is sent again by the
  dispatcher itself, backing off (each wait twice the last).
- :class:`LocalDispatcher`: the embedded farm: runs each task in-process through an injected ``execute`` (the CLI
  passes :func:`farm_workers.tasks.run_group`, the very function the Celery task runs for each group of a batch).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from farm_fleet.protocol import GROUP_TASK, GroupKey, GroupResult, GroupTask
from farm_fleet.results import RedisResults
from farm_fleet.settings import Settings

if TYPE_CHECKING:  # types only
    from celery import Celery

class Dispatcher(Protocol):
    """The coordinator's port to the devices. It owns what is in flight."""

    def submit(self, tasks: list[GroupTask], queue: str, limits: tuple[float, float]) -> None:
        """Send ``tasks`` as one unit of work (groups run in order on one device). Raises on a broker outage,
        with nothing recorded as sent."""
        ...

    def collect(self, wait: float = 0.0) -> list[GroupResult]:
        """Results that arrived, blocking up to ``wait`` seconds for the first (never spinning)."""
        ...

    def lost(self) -> list[GroupTask]:
        """Groups in flight that will not come back: started but past their deadline, or their batch ended
        without running them. The coordinator sends them again or gives up on them."""
        ...

    def forget(self, keys: list[GroupKey]) -> None:
        """Stop waiting for these groups (a lease was lost, a confirmation given up)."""
        ...

    def in_flight(self) -> int: ...

    def cancel(self) -> list[GroupTask]:
        """Revoke everything still pending (Ctrl-C); return it."""
        ...


@dataclass
class Flight:
    task: GroupTask
    queue: str
    task_id: str
    sent: float
    limits: tuple[float, float]
    resent: int = 0  # times sent again by this dispatcher because it never started
    started: float | None = None  # monotonic time this coordinator saw the latest delivery start
    mark: float | None = None  # that delivery's start mark, as the worker wrote it


class CeleryDispatcher:
    def __init__(self, app: Celery, results: RedisResults, settings: Settings, sweep: float = 1.0) -> None:
        self.app = app
        self.results = results
        self.settings = settings
        self._pending: dict[GroupKey, Flight] = {}
        self._rounds: Counter[str] = Counter()
        self._moved: dict[str, float] = {}  # queue -> when a task of it last started or finished
        self._unrun: list[GroupKey] = []
        self._sweep = sweep
        self._last_sweep = 0.0
        self._last_deadlines = 0.0

    def in_flight(self) -> int:
        return len(self._pending)

    def submit(self, tasks: list[GroupTask], queue: str, limits: tuple[float, float]) -> None:
        task_id = self._send(tasks, queue, limits)
        now = time.monotonic()
        self._moved.setdefault(queue, now)
        for task in tasks:
            key = task.key
            if key not in self._pending:
                self._rounds[task.run] += 1
            self._pending[key] = Flight(task, queue, task_id, now, limits)

    def _send(self, tasks: list[GroupTask], queue: str, limits: tuple[float, float]) -> str:
        soft, hard = limits
        first = tasks[0]
        task_id = f"{first.run}.{first.problem_id}.{first.group}.x{len(tasks)}.{time.time_ns()}"
        # The name Flower and its metrics show (the worker still runs GROUP_TASK): split by operation.
        shadow = f"{GROUP_TASK}:{first.operation}" if len({t.operation for t in tasks}) == 1 else GROUP_TASK
        self.app.send_task(GROUP_TASK, args=[[t.to_dict() for t in tasks]], queue=queue, soft_time_limit=soft,
                           time_limit=hard, task_id=task_id, ignore_result=True, shadow=shadow)
        return task_id

    def _pop(self, key: GroupKey) -> Flight | None:
        flight = self._pending.pop(key, None)
        if flight is not None:
            self._rounds[flight.task.run] -= 1
            if self._rounds[flight.task.run] <= 0:
                del self._rounds[flight.task.run]
        return flight

    def collect(self, wait: float = 0.0) -> list[GroupResult]:
        if not self._pending:
            if wait > 0:
                time.sleep(wait)
            return []
        ready: set[GroupKey] = set()
        for kind, key in self.results.notices(list(self._rounds), wait):
            if key in self._pending:
                if kind == "result":
                    ready.add(key)
                else:
                    self._unrun.append(key)
        now = time.monotonic()
        if now - self._last_sweep >= self._sweep:
            self._last_sweep = now
            keys = list(self._pending)
            ready.update(keys)
            for key, at in zip(keys, self.results.started_at(keys), strict=True):
                flight = self._pending[key]
                # A new delivery started: timed from when this coordinator saw it (no cross-host clock skew).
                if at is not None and at != flight.mark:
                    flight.mark, flight.started = at, now
                    self._moved[flight.queue] = now
        order = list(ready)
        done: list[GroupResult] = []
        for key, result in zip(order, self.results.get_many(order), strict=True):
            if result is not None:
                landed = self._pop(key)
                if landed is not None:
                    self._moved[landed.queue] = now
                done.append(result)
        return done

    def lost(self) -> list[GroupTask]:
        now = time.monotonic()
        lost: list[GroupTask] = []
        for key in self._unrun:
            unrun = self._pop(key)
            if unrun is not None:
                lost.append(unrun.task)
        self._unrun.clear()
        if now - self._last_deadlines < self._sweep:
            return lost
        self._last_deadlines = now
        for key, flight in list(self._pending.items()):
            patience = self.settings.lost_after(flight.limits[1])
            if flight.started is not None:
                if now - flight.started > patience:  # started and never finished: the coordinator decides
                    self._pop(key)
                    lost.append(flight.task)
            elif now - max(flight.sent, self._moved.get(flight.queue, 0.0)) > patience * 2 ** flight.resent:
                # Never started while its queue stood still (a message lost in a broker restart, or held by a
                # worker that died): send it again, backing off (a busy fleet only looks like a stuck one).
                flight.task_id = self._send([flight.task], flight.queue, flight.limits)
                flight.sent, flight.resent = now, flight.resent + 1
        return lost

    def forget(self, keys: list[GroupKey]) -> None:
        for key in keys:
            self._pop(key)

    def cancel(self) -> list[GroupTask]:
        ids = sorted({f.task_id for f in self._pending.values()})
        tasks = [f.task for f in self._pending.values()]
        if ids:
            self.app.control.revoke(ids)
        self._pending.clear()
        self._rounds.clear()
        return tasks


class LocalDispatcher:
    """Runs tasks one at a time in this process through ``execute(task, queue) -> result``."""

    def __init__(self, execute: Callable[[GroupTask, str], GroupResult]) -> None:
        self.execute = execute
        self._queue: deque[tuple[GroupTask, str]] = deque()

    def in_flight(self) -> int:
        return len(self._queue)

    def submit(self, tasks: list[GroupTask], queue: str, limits: tuple[float, float]) -> None:
        self._queue.extend((task, queue) for task in tasks)

    def lost(self) -> list[GroupTask]:
        return []

    def collect(self, wait: float = 0.0) -> list[GroupResult]:
        if not self._queue:
            return []
        return [self.execute(*self._queue.popleft())]

    def forget(self, keys: list[GroupKey]) -> None:
        drop = set(keys)
        self._queue = deque((t, q) for t, q in self._queue if t.key not in drop)

    def cancel(self) -> list[GroupTask]:
        tasks = [t for t, _ in self._queue]
        self._queue.clear()
        return tasks
