"""Which problems a run holds: leases taken in a window, renewed, lost, and problems held elsewhere.

A run leases at most ``window`` problems at a time (refilled as they finish), so renewing its leases costs the
same at 1,000 or 100,000 problems; the problems themselves are made from the catalog as the window takes them
(``farm_coordinator.plan.Planner``), after one pass that counts them and skips those already decided. A problem
another coordinator holds is checked again with back-off (0.5 s doubling to ``lease_ttl / 3``): decided there, or
taken over when that coordinator's lease expires.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from farm_coordinator.aggregate import unconfirmed
from farm_coordinator.catalog import Workload
from farm_coordinator.dispatch import task_key
from farm_coordinator.machine import ACTIVE, State, Tracked
from farm_coordinator.plan import Planner, Problem, Target
from farm_coordinator.ports import REUSED, Settled
from farm_coordinator.runview import CONFIRM_GROUP
from farm_fleet.protocol import GroupKey
from farm_fleet.results import reusable

if TYPE_CHECKING:
    from farm_coordinator.ports import RunState


SURVEY_CHUNK = 1000  # problem ids per read of the sink's problem index while counting


@dataclass
class Survey:
    """What the counting pass found: problems to run (``problems``, ``tasks``, trials per fingerprint digest) and
    the ids of those already decided (skipped, unless the run is forced)."""

    problems: int = 0
    tasks: int = 0
    trials: dict[str, int] = field(default_factory=dict)
    decided: set[str] = field(default_factory=set)


class Claims:
    def __init__(self, run: RunState) -> None:
        self.run = run
        self.planner: Planner | None = None
        self.backlog: Iterator[tuple[str, Target, Workload]] = iter(())  # never tried yet, in plan order
        self.left = 0  # problems the backlog still holds
        self.elsewhere: dict[str, None] = {}  # tried: held by another coordinator
        self.window = max(256, 4 * run.settings.max_in_flight)
        self.wait_interval = 0.5

    def survey(self, planner: Planner, force: bool) -> Survey:
        """Count the run's problems in one pass (chunked reads of the sink's problem index), record those already
        decided in the summary, and start the backlog over the others; no problem is built here."""
        found = Survey()
        pairs = planner.pairs()
        while chunk := [(planner.problem_id(t, w), t, w) for t, w in itertools.islice(pairs, SURVEY_CHUNK)]:
            decided = set() if force else self._decided_ids(chunk)
            for pid, target, workload in chunk:
                if pid in decided:
                    found.decided.add(pid)
                    self.run.summary.decided_elsewhere(Settled(pid, target, workload, REUSED))
                    continue
                groups = planner.groups(target, workload)
                found.problems += 1
                found.tasks += len(groups.groups)
                found.trials[target.digest] = found.trials.get(target.digest, 0) + groups.trials
        self.planner, self.left = planner, found.problems
        self.backlog = ((pid, t, w) for t, w in planner.pairs()
                        if (pid := planner.problem_id(t, w)) not in found.decided)
        return found

    def decided(self, problems: list[Problem]) -> set[str]:
        """Which of ``problems`` have a published decision (one read per fingerprint)."""
        return self._decided_ids([(p.problem_id, p.target, p.workload) for p in problems])

    def _decided_ids(self, problems: list[tuple[str, Target, Workload]]) -> set[str]:
        by_digest: dict[str, list[str]] = {}
        for pid, target, _ in problems:
            by_digest.setdefault(target.digest, []).append(pid)
        found: set[str] = set()
        for digest, pids in by_digest.items():
            found |= self.run.sink.decided(digest, pids)
        return found

    def rest(self) -> Iterator[tuple[str, Target, Workload]]:
        """Empty the backlog: the problems never taken (the run's timeout), one at a time."""
        for item in self.backlog:
            self.left -= 1
            yield item
        self.left = 0

    def refill(self) -> None:
        """Lease more problems from the backlog once fewer than half the window are held."""
        active = self.run.board.count(*ACTIVE)
        if not self.left or active > self.window // 2:
            return
        assert self.planner is not None
        take = list(itertools.islice(self.backlog, min(self.left, self.window - active)))
        self.left = self.left - len(take) if take else 0
        self.claim(self.run.board.add([self.planner.problem(t, w, pid) for pid, t, w in take]))

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
            t.verdict = None
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
                    run.summary.decided_elsewhere(t.problem)
                    run.board.move(t.pid, State.PUBLISHED, "decided by another coordinator")
                    run.settled("reused")
            before = len(self.elsewhere)
            self.claim([t for t in waiting if t.state is State.WAITING])
            progressed = len(self.elsewhere) < before or decided
            self.wait_interval = 0.5 if progressed else min(self.wait_interval * 2, max(0.5, run.settings.lease_ttl / 3))
        for t in run.board.members(State.CONFIRMING):
            if t.confirmer is not None and not run.fleet.alive(*t.confirmer):
                run.dispatcher.forget([GroupKey(t.round or "", t.pid, CONFIRM_GROUP)])
                run.conclude(unconfirmed(t.problem.confirmation, run.policy,
                                         f"unconfirmed: confirming worker {t.confirmer[0]} went away"))

    def lose(self, t: Tracked) -> None:
        """Another coordinator holds the problem now: stop working on it (its queued tasks are skipped)."""
        self.run.console.log(f"lost the lease of problem {t.pid}; stopped working on it")
        self.run.dispatcher.forget([task_key(task) for task in t.problem.tasks]
                                   + [GroupKey(t.round or "", t.pid, CONFIRM_GROUP)])
        self.run.board.move(t.pid, State.WAITING, "lease lost")
        self.elsewhere[t.pid] = None
