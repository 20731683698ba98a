"""How a run ends early: its timeout passes (:func:`expire`) or the operator presses Ctrl-C (:func:`interrupt`)."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable

from farm.policy import StackPolicy
from farm_coordinator.aggregate import unconfirmed
from farm_coordinator.claims import Claims
from farm_coordinator.dispatch import Dispatcher
from farm_coordinator.machine import ACTIVE, Board, State
from farm_coordinator.ports import Leases, RunSummary, run_interrupted
from farm_coordinator.publish import Publisher
from farm_coordinator.settle import Settlement, quietly
from farm_fleet.protocol import GroupTask

__all__ = ["expire", "interrupt", "quietly"]


def expire(board: Board, claims: Claims, publisher: Publisher, settle: Settlement, dispatcher: Dispatcher,
           policy: StackPolicy, queue: deque[tuple[GroupTask, str]], drain: Callable[[], None]) -> None:
    """The run's timeout passed: a problem still waiting for a confirmation is published unconfirmed; every
    other unfinished problem fails (none is published with a group missing). ``drain`` handles what arrived."""
    quietly(drain)
    quietly(lambda: publisher.publish(flush=True))
    queue.clear()
    quietly(dispatcher.cancel)
    for t in board.members(State.CONFIRMING):
        assert t.state.confirming is not None
        publisher.conclude(unconfirmed(t.state.confirming, policy, "unconfirmed: no confirmation before the timeout"))
    for pid, target, workload in claims.rest():  # never taken: failed without being made into problems
        settle.not_started(pid, target, workload, "not started before the timeout")
    for t in board.members(State.WAITING):
        held = t.pid in claims.elsewhere
        settle.failed(t, "held by another coordinator until the timeout" if held else "not started before the timeout")
    for t in board.members(State.QUEUED, State.RUNNING):
        if t.state.aggregate is not None:  # decided, but the store did not answer
            settle.failed(t, "decided, but not published before the run's timeout (the store did not answer)")
            continue
        missing = [task.group for task in t.plan.tasks if task.group not in t.state.results]
        settle.failed(t, f"no result before the run's timeout for groups {', '.join(missing)}")
    quietly(lambda: publisher.publish(flush=True))


def interrupt(board: Board, claims: Claims, publisher: Publisher, dispatcher: Dispatcher, leases: Leases,
              summary: RunSummary, record: Callable[[str], None]) -> None:
    """Ctrl-C: revoke what is queued or running, release our leases, record the run (``record(state)``), and say
    how to resume (raises RunInterrupted)."""
    quietly(lambda: publisher.publish(flush=True))  # decided before Ctrl-C: kept
    remaining = board.unfinished + claims.left
    quietly(dispatcher.cancel)
    for t in list(board.members(*ACTIVE)):
        if t.state.lease is not None:
            quietly(functools.partial(leases.release, t.pid, t.state.lease))
    quietly(lambda: record("interrupted"))
    raise run_interrupted(summary, remaining)
