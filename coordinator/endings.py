"""How a run ends early: its timeout passes (:func:`expire`) or the operator presses Ctrl-C (:func:`interrupt`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from farm_coordinator.aggregate import unconfirmed
from farm_coordinator.machine import ACTIVE, State
from farm_coordinator.ports import run_interrupted
from farm_fleet.errors import StoreUnavailable
from farm_fleet.retry import transient

if TYPE_CHECKING:
    from farm_coordinator.ports import RunState


def quietly(call: Callable[[], Any]) -> None:
    """Run ``call``; an unreachable Redis or broker is ignored (the caller has a fallback or is ending)."""
    try:
        call()
    except Exception as e:
        if not (isinstance(e, StoreUnavailable) or transient(e)):
            raise


def expire(run: RunState) -> None:
    """The run's timeout passed: a problem still waiting for a confirmation is published unconfirmed; every
    other unfinished problem fails (none is published with a group missing)."""
    quietly(run.drain)
    quietly(lambda: run.publish_pending(flush=True))
    run.queue.clear()
    quietly(run.dispatcher.cancel)
    for t in run.board.members(State.CONFIRMING):
        run.conclude(unconfirmed(t.problem.confirmation, run.policy, "unconfirmed: no confirmation before the timeout"))
    for pid, target, workload in run.claims.rest():  # never taken: failed without being made into problems
        run.summary.not_started(pid, target, workload, "not started before the timeout")
        run.settled("failed")
    for t in run.board.members(State.WAITING):
        held = t.pid in run.claims.elsewhere
        run.fail(t, "held by another coordinator until the timeout" if held else "not started before the timeout")
    for t in run.board.members(State.QUEUED, State.RUNNING):
        if t.verdict is not None:  # decided, but the store did not answer
            run.fail(t, "decided, but not published before the run's timeout (the store did not answer)")
            continue
        missing = [task.group for task in t.problem.tasks if task.group not in t.problem.results]
        run.fail(t, f"no result before the run's timeout for groups {', '.join(missing)}")
    quietly(lambda: run.publish_pending(flush=True))


def interrupt(run: RunState) -> None:
    """Ctrl-C: revoke what is queued or running, release our leases, record the run, and say how to resume."""
    quietly(lambda: run.publish_pending(flush=True))  # decided before Ctrl-C: kept
    remaining = run.board.unfinished + run.claims.left
    quietly(run.dispatcher.cancel)
    for t in list(run.board.members(*ACTIVE)):
        if t.lease is not None:
            quietly(functools.partial(run.leases.release, t.pid, t.lease))
    quietly(lambda: run.runlog.update(run.run, run.groups_done, run.summary.published, state="interrupted"))
    raise run_interrupted(run.summary, remaining)
