"""Publication of a run's decisions: in batches (one sink call, each publication still atomic and fenced by its
own lease) of up to ``PUBLISH_BATCH`` or ``PUBLISH_WAIT`` seconds. A complete space search's decision is
indexed under its family's id too, and every spaced decision under its family's id across fingerprints (fleet
priors) (:func:`family_alias`), in the same transaction."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from farm.stores.base import Publication
from farm_coordinator.aggregate import Aggregate, trial_rows
from farm_coordinator.claims import Claims
from farm_coordinator.machine import ACTIVE, Board, Tracked
from farm_coordinator.ports import Leases
from farm_coordinator.settle import Settlement
from farm_coordinator.sinks import Sink

PUBLISH_BATCH = 256  # decisions per sink call at most (fewer commits, or round trips, per decision)...
PUBLISH_WAIT = 0.2  # ...and seconds the first of them waits at most (it never waits when nothing else is running)


class Publisher:
    """The decisions of a run waiting for their publication. ``busy()``: whether other work is under way (a
    decision waits for company only then)."""

    def __init__(self, board: Board, leases: Leases, sink: Sink, settle: Settlement, claims: Claims,
                 busy: Callable[[], bool]) -> None:
        self.board, self.leases, self.sink, self.settle, self.claims = board, leases, sink, settle, claims
        self.busy = busy
        self.waiting: deque[Aggregate] = deque()  # decided, publication not yet acknowledged by the store
        self.since = 0.0  # when the oldest of them was decided

    def conclude(self, agg: Aggregate) -> None:
        """A problem is decided: publish it (with the next batch, or once the store answers again). The first
        verdict of a claim stands: a later one (a confirmation given up on meanwhile) is ignored."""
        t = self.board[agg.problem.problem_id]
        if t.state.aggregate is not None:
            return
        if agg.record is None:
            self.settle.failed(t, agg.error or "nothing to publish", agg)
            return
        self.board.decided(t.pid, agg)
        if not self.waiting:
            self.since = time.monotonic()
        self.waiting.append(agg)

    def publish(self, flush: bool = False) -> None:
        """Publish the decisions waiting, in one sink call, once there are ``PUBLISH_BATCH`` of them, the oldest
        waited ``PUBLISH_WAIT`` seconds, nothing else is under way, or ``flush``. Each publication is atomic and
        fenced by its own lease; a problem whose claim ended meanwhile is left out."""
        if not self.waiting or not (flush or len(self.waiting) >= PUBLISH_BATCH or not self.busy()
                                    or time.monotonic() - self.since >= PUBLISH_WAIT):
            return
        batch: list[tuple[Aggregate, Tracked, tuple[str, str] | None]] = []
        publications = []
        for agg in self.waiting:
            t = self.board.get(agg.problem.problem_id)
            if t is None or t.state.aggregate is not agg or t.stage not in ACTIVE or t.state.lease is None:
                continue
            assert agg.record is not None
            fence = self.leases.fence(t.pid, t.state.lease)
            batch.append((agg, t, fence))
            publications.append(Publication(agg.record, agg.problem.target.fingerprint, t.pid,
                                            tuple(trial_rows(agg)), fence=fence, aliases=family_alias(agg)))
        replies = self.sink.publish_many(publications) if publications else []
        self.waiting.clear()
        for (agg, t, fence), (_, reason) in zip(batch, replies, strict=True):
            if reason.startswith("refused"):
                if t.pid in self.claims.decided([t.plan]):  # theirs (or ours, its reply lost and the call retried)
                    self.settle.elsewhere(t)
                else:
                    self.claims.lose(t)
                continue
            self.settle.published(t, agg, reason, release=fence is None)


def family_alias(agg: Aggregate) -> tuple[str, ...]:
    """The ids a spaced decision is indexed under as well (``Publication.aliases``): its family's id when its search
    was complete (what a grown space's next run looks up, ``farm_coordinator.plan``) and its family's id across
    fingerprints when it keeps a ranking (what another fingerprint's run looks up for priors,
    ``farm_coordinator.priors``); none for any other decision."""
    family, record = agg.problem.family, agg.record
    if family is None or record is None:
        return ()
    complete = bool(family.problem_id) and record.meta.get("covered") is not None
    fleet = bool(family.fleet_id) and bool(record.meta.get("ranked"))
    return (*((family.problem_id,) if complete else ()), *((family.fleet_id,) if fleet else ()))
