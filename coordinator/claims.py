"""Which problems a run holds: leases taken in a window, renewed, lost, and problems held elsewhere.

A run leases at most ``window`` problems at a time (refilled as they finish), so renewing its leases costs the
same at 1,000 or 100,000 problems. A problem another coordinator holds is checked again with back-off (0.5 s
doubling to ``lease_ttl / 3``): decided there, or taken over when that coordinator's lease expires.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import TYPE_CHECKING

from farm_coordinator.aggregate import unconfirmed
from farm_coordinator.dispatch import task_key
from farm_coordinator.machine import ACTIVE, State, Tracked
from farm_coordinator.plan import Problem
from farm_coordinator.runview import CONFIRM_GROUP
from farm_fleet.results import reusable

if TYPE_CHECKING:
    from farm_coordinator.ports import RunState


class Claims:
    def __init__(self, run: RunState, pids: list[str]) -> None:
        self.run = run
        self.backlog: deque[str] = deque(pids)  # never tried yet, in catalog order
        self.elsewhere: dict[str, None] = {}  # tried: held by another coordinator
        self.window = max(256, 4 * run.settings.max_in_flight)
        self.wait_interval = 0.5

    def decided(self, problems: list[Problem]) -> set[str]:
        """Which of ``problems`` have a published decision (one read per fingerprint)."""
        by_digest: dict[str, list[str]] = {}
        for p in problems:
            by_digest.setdefault(p.target.digest, []).append(p.problem_id)
        found: set[str] = set()
        for digest, pids in by_digest.items():
            found |= self.run.sink.decided(digest, pids)
        return found

    def refill(self) -> None:
        """Lease more problems from the backlog once fewer than half the window are held."""
        active = self.run.board.count(*ACTIVE)
        if not self.backlog or active > self.window // 2:
            return
        take = [self.backlog.popleft() for _ in range(min(len(self.backlog), self.window - active))]
        self.claim([self.run.board[pid] for pid in take])

    def claim(self, candidates: list[Tracked]) -> None:
        """Lease what is free, give each leased problem its round, reuse the successful results stored under it
        (failed ones are discarded: they run again), queue the rest. The others are held elsewhere."""
        run = self.run
        if not candidates:
            return
        held = run.leases.acquire([t.pid for t in candidates], run.run)
        for t in candidates:
            if t.pid in held:
                self.elsewhere.pop(t.pid, None)
            else:
                self.elsewhere[t.pid] = None
        mine = [t for t in candidates if t.pid in held]
        if not mine:
            return
        rounds = run.leases.rounds([t.pid for t in mine], run.run, fresh=run.force)
        for t in mine:
            t.lease, t.round = held[t.pid], rounds[t.pid]
            t.problem.tasks = [dataclasses.replace(task, run=t.round) for task in t.problem.tasks]
            t.problem.results.clear()
            t.problem.sent.clear()  # nothing of an earlier claim is in flight for us any more: send again
            t.problem.confirmation = t.problem.confirmation_result = None
            t.sends.clear()
            t.lost.clear()
            run.board.move(t.pid, State.QUEUED)
        if run.results is not None:
            keys = [task_key(task) for t in mine for task in t.problem.tasks]
            stale = []
            for key, found in zip(keys, run.results.get_many(keys), strict=True):
                if reusable(found):
                    assert found is not None
                    run.on_result(found, reused=True)
                elif found is not None:
                    stale.append(key)
            if stale:
                run.results.discard(stale)
        for t in mine:
            if t.state is State.QUEUED:
                run.queue_next(t)

    def upkeep(self) -> None:
        """Renew our leases (stop working on lost ones), settle problems others decided, take over problems whose
        holder went away, and give up on confirmations whose worker (incarnation) went away."""
        run = self.run
        run.runlog.update(run.run, run.groups_done, run.summary.published)
        active = {t.pid: t.lease for t in run.board.members(*ACTIVE) if t.lease is not None}
        for pid in run.leases.renew(active) if active else set():
            self.lose(run.board[pid])
        waiting = [run.board[pid] for pid in self.elsewhere]
        if waiting:
            decided = set() if run.force else self.decided([t.problem for t in waiting])
            for t in waiting:
                if t.pid in decided:
                    self.elsewhere.pop(t.pid, None)
                    run.summary.already_decided.append(t.problem)
                    run.board.move(t.pid, State.PUBLISHED, "decided by another coordinator")
                    run.settled("reused")
            before = len(self.elsewhere)
            self.claim([t for t in waiting if t.state is State.WAITING])
            progressed = len(self.elsewhere) < before or decided
            self.wait_interval = 0.5 if progressed else min(self.wait_interval * 2, max(0.5, run.settings.lease_ttl / 3))
        for t in run.board.members(State.CONFIRMING):
            if t.confirmer is not None and not run.fleet.alive(*t.confirmer):
                run.dispatcher.forget([(t.round or "", t.pid, CONFIRM_GROUP)])
                run.conclude(unconfirmed(t.problem.confirmation, run.policy,
                                         f"unconfirmed: confirming worker {t.confirmer[0]} went away"))

    def lose(self, t: Tracked) -> None:
        """Another coordinator holds the problem now: stop working on it (its queued tasks are skipped)."""
        self.run.console.log(f"lost the lease of problem {t.pid}; stopped working on it")
        self.run.dispatcher.forget([task_key(task) for task in t.problem.tasks]
                                   + [(t.round or "", t.pid, CONFIRM_GROUP)])
        self.run.board.move(t.pid, State.WAITING, "lease lost")
        self.elsewhere[t.pid] = None
