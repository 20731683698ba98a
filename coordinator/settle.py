"""How a problem leaves a run: published, failed, or decided elsewhere, counted in the summary and shown on the
progress display, its lease released."""

from __future__ import annotations

from collections.abc import Callable

from farm_coordinator.aggregate import Aggregate
from farm_coordinator.catalog import Workload
from farm_coordinator.machine import Board, State, Tracked
from farm_coordinator.plan import Target
from farm_coordinator.ports import Leases, RunObserver, RunSummary
from farm_fleet.errors import StoreUnavailable
from farm_fleet.retry import transient

ELSEWHERE = "decided by another coordinator"


def quietly(call: Callable[[], object]) -> None:
    """Run ``call``; an unreachable Redis or broker is ignored (the caller has a fallback or is ending)."""
    try:
        call()
    except Exception as e:
        if not (isinstance(e, StoreUnavailable) or transient(e)):
            raise


class Settlement:
    """Ends problems on the board and records how (``summary``, ``observer``)."""

    def __init__(self, board: Board, leases: Leases, summary: RunSummary, observer: RunObserver) -> None:
        self.board, self.leases, self.summary, self.observer = board, leases, summary, observer

    def _show(self, outcome: str, agg: Aggregate | None = None) -> None:
        self.observer.problem_done(outcome, agg)

    def published(self, t: Tracked, agg: Aggregate, reason: str, release: bool) -> None:
        """``agg`` is stored (``reason`` says how); ``release``: its lease still needs releasing (an unfenced
        publication: the fenced one consumed it)."""
        lease = t.state.lease or ""
        self.summary.decided(agg)
        self.board.move(t.pid, State.PUBLISHED, reason)
        self._show("published", agg)
        if release:
            self.leases.release(t.pid, lease)

    def elsewhere(self, t: Tracked) -> None:
        """Another coordinator (or an earlier run) published the problem's decision."""
        self.summary.decided_elsewhere(t.plan)
        self.board.move(t.pid, State.PUBLISHED, ELSEWHERE)
        self._show("reused")

    def failed(self, t: Tracked, reason: str, agg: Aggregate | None = None) -> None:
        """Nothing will be published for ``t`` in this run (``agg``: the verdict that says why, if any)."""
        agg = agg or Aggregate(t.plan, None, (), None, None, reason, 0.0, results=dict(t.state.results))
        self.summary.decided(agg, reason)
        self._show("failed", agg)
        lease = t.state.lease
        self.board.move(t.pid, State.FAILED, reason)
        if lease is not None:
            quietly(lambda: self.leases.release(t.pid, lease))

    def not_started(self, pid: str, target: Target, workload: Workload, reason: str) -> None:
        """A problem the run never took (never made into a plan)."""
        self.summary.not_started(pid, target, workload, reason)
        self._show("failed")
