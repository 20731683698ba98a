"""Dispatchers: how group tasks reach devices and results come back.

- :class:`CeleryDispatcher`: ``send_task`` to the fingerprint's (or a worker's own) queue with time limits from
  the policy; results are read from the shared results store as they complete (no chords); a task Celery marks
  failed without a stored result (hard time limit, lost beyond retries) becomes a failed group result.
- :class:`LocalDispatcher`: the embedded farm: runs each task in-process through an injected ``execute`` (the CLI
  passes :func:`farm_workers.tasks.run_group`, the very function the Celery task runs for each group of a batch).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from farm_fleet.protocol import GROUP_TASK, GroupResult, GroupTask
from farm_fleet.results import RedisResults
from farm_fleet.settings import Settings

Key = tuple[str, str, str]


def task_key(task: GroupTask) -> Key:
    return (task.run, task.problem_id, task.group)


class CeleryDispatcher:
    def __init__(self, app: Any, results: RedisResults, settings: Settings, state_poll: float = 1.0) -> None:
        self.app = app
        self.results = results
        self.settings = settings
        self.pending: dict[Key, tuple[GroupTask, Any]] = {}
        self.unrun: list[GroupTask] = []
        self._state_poll = state_poll
        self._last_state_check = 0.0

    def submit(self, tasks: list[GroupTask], queue: str, limits: tuple[float, float]) -> None:
        """Send one Celery task carrying ``tasks`` (groups run in order on one device)."""
        soft, hard = limits
        first = tasks[0]
        handle = self.app.send_task(
            GROUP_TASK, args=[[t.to_dict() for t in tasks]], queue=queue, soft_time_limit=soft, time_limit=hard,
            task_id=f"{first.run}.{first.problem_id}.{first.group}.x{len(tasks)}.{time.time_ns()}",
            # The name Flower and its metrics show (the worker still runs GROUP_TASK): split by operation.
            shadow=f"{GROUP_TASK}:{first.operation}" if len({t.operation for t in tasks}) == 1 else GROUP_TASK,
        )
        for task in tasks:
            self.pending[task_key(task)] = (task, handle)

    def take_unrun(self) -> list[GroupTask]:
        """Groups whose batch finished without running them (stopped after a hung candidate): send again."""
        unrun, self.unrun = self.unrun, []
        return unrun

    def collect(self, wait: float = 0.0) -> list[GroupResult]:
        """Results that completed since the last call. Blocks up to ``wait`` seconds for a completion notice
        from a worker, then reads every pending result at once; tasks Celery failed are checked every second."""
        if not self.pending:
            return []
        if wait > 0:
            self.results.wait(sorted({k[0] for k in self.pending}), wait)
        keys = list(self.pending)
        done: list[GroupResult] = []
        for key, result in zip(keys, self.results.get_many(keys), strict=True):
            if result is not None:
                done.append(result)
                del self.pending[key]
        now = time.monotonic()
        if self.pending and now - self._last_state_check >= self._state_poll:
            self._last_state_check = now
            states: dict[str, str] = {}
            for key, (task, handle) in list(self.pending.items()):
                state = states.setdefault(handle.id, handle.state)
                if state in ("FAILURE", "REVOKED"):
                    error = f"task {state.lower()}: {handle.result!r}"
                    done.append(self.results.put_if_absent(GroupResult.failed(task, error)))
                    del self.pending[key]
                elif state == "SUCCESS":
                    late = self.results.get(*key)  # stored just after the read above?
                    if late is not None:
                        done.append(late)
                    else:
                        self.unrun.append(task)
                    del self.pending[key]
        return done

    def close(self) -> None:
        self.pending.clear()


class LocalDispatcher:
    """Runs tasks one at a time in this process through ``execute(task, queue) -> result``."""

    def __init__(self, execute: Callable[[GroupTask, str], GroupResult]) -> None:
        self.execute = execute
        self.queue: deque[tuple[GroupTask, str]] = deque()

    @property
    def pending(self) -> dict[Key, tuple[GroupTask, str]]:
        return {task_key(t): (t, q) for t, q in self.queue}

    def submit(self, tasks: list[GroupTask], queue: str, limits: tuple[float, float]) -> None:
        self.queue.extend((task, queue) for task in tasks)

    def take_unrun(self) -> list[GroupTask]:
        return []

    def collect(self, wait: float = 0.0) -> list[GroupResult]:
        if not self.queue:
            return []
        return [self.execute(*self.queue.popleft())]

    def close(self) -> None:
        self.queue.clear()
