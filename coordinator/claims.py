"""Which problems a run holds: leases taken in a window, renewed, lost, and problems held elsewhere.

A run leases at most ``window`` problems at a time (refilled as they finish), so renewing its leases costs the
same at 1,000 or 100,000 problems; the problems themselves are made from the catalog as the window takes them
(``farm_coordinator.plan.Planner``), after one pass that counts them and skips those already decided. A problem
another coordinator holds is checked again with back-off (0.5 s doubling to ``lease_ttl / 3``): decided there, or
taken over when that coordinator's lease expires.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from farm_coordinator.catalog import Workload
from farm_coordinator.dispatch import Dispatcher
from farm_coordinator.machine import ACTIVE, Board, State, Tracked
from farm_coordinator.partial import continuation_round, is_partial
from farm_coordinator.plan import PlannedProblem, Planner, Target
from farm_coordinator.ports import REUSED, Fleet, Leases, Results, Settled
from farm_coordinator.runview import CONFIRM_GROUP
from farm_coordinator.settle import Settlement
from farm_coordinator.sinks import Sink
from farm_fleet.protocol import GroupKey, GroupResult
from farm_fleet.results import reusable
from farm_fleet.settings import Settings

SURVEY_CHUNK = 1000  # problem ids per read of the sink's problem index while counting


@dataclass
class Survey:
    """What the counting pass found: problems to run (``problems``, ``tasks``, trials per fingerprint digest) and
    the ids of those already decided (skipped, unless the run is forced)."""

    problems: int = 0
    tasks: int = 0
    trials: dict[str, int] = field(default_factory=dict)
    decided: set[str] = field(default_factory=set)


@dataclass
class Taken:
    """What a claim or upkeep step leaves the run to do: the problems newly leased (queued, in claim order), the
    successful results stored under their rounds (to reuse), and confirmations given up on (with the reason)."""

    mine: list[Tracked] = field(default_factory=list)
    reused: list[GroupResult] = field(default_factory=list)
    gave_up: list[tuple[Tracked, str]] = field(default_factory=list)
    # (digest, tasks, trials) the problems made now plan beyond the survey's count (a continued partial decision
    # plans fewer, a ban or a grown space's family other ones): the run's totals follow what is really planned
    replanned: list[tuple[str, int, int]] = field(default_factory=list)


class Claims:
    """The leases of one run (``run``: its id, the leases' holder) over the problems of its ``board``."""

    def __init__(self, run: str, board: Board, leases: Leases, sink: Sink, settle: Settlement, settings: Settings,
                 note: Callable[[str], None], dispatcher: Dispatcher, results: Results | None = None,
                 force: bool = False) -> None:
        self.run, self.board, self.leases, self.sink, self.settle = run, board, leases, sink, settle
        self.settings, self.note, self.results, self.force = settings, note, results, force
        self.dispatcher = dispatcher
        self.planner: Planner | None = None
        self.backlog: Iterator[tuple[str, Target, Workload]] = iter(())  # never tried yet, in plan order
        self.left = 0  # problems the backlog still holds
        self.elsewhere: dict[str, None] = {}  # tried: held by another coordinator
        self.window = max(256, 4 * settings.max_in_flight)
        self.wait_interval = 0.5

    def survey(self, planner: Planner) -> Survey:
        """Count the run's problems in one pass (chunked reads of the sink's problem index), record those already
        decided in the summary, and start the backlog over the others; no problem is built here."""
        found = Survey()
        pairs = planner.pairs()
        while chunk := [(planner.problem_id(t, w), t, w) for t, w in itertools.islice(pairs, SURVEY_CHUNK)]:
            decided = set() if self.force else self._decided_ids(chunk, final_only=True)
            for pid, target, workload in chunk:
                if pid in decided:
                    found.decided.add(pid)
                    self.settle.summary.decided_elsewhere(Settled(pid, target, workload, REUSED))
                    continue
                groups = planner.groups(target, workload)
                found.problems += 1
                found.tasks += len(groups.groups)
                found.trials[target.digest] = found.trials.get(target.digest, 0) + groups.trials
        self.planner, self.left = planner, found.problems
        self.backlog = ((pid, t, w) for t, w in planner.pairs()
                        if (pid := planner.problem_id(t, w)) not in found.decided)
        return found

    def decided(self, problems: list[PlannedProblem]) -> set[str]:
        """Which of ``problems`` have a published decision (one read per fingerprint): during a run, a partial one
        another coordinator published counts too (that run's continuation is the next run's, not this one's)."""
        return self._decided_ids([(p.problem_id, p.target, p.workload) for p in problems])

    def _decided_ids(self, problems: list[tuple[str, Target, Workload]], final_only: bool = False) -> set[str]:
        """The decided ids of ``problems``; ``final_only``: not the partial decisions (read back to tell,
        ``farm_coordinator.partial``): what a run's survey skips, the partial ones it continues."""
        by_digest: dict[str, list[str]] = {}
        for pid, target, _ in problems:
            by_digest.setdefault(target.digest, []).append(pid)
        found: set[str] = set()
        for digest, pids in by_digest.items():
            decided = self.sink.decided(digest, pids)
            if decided and final_only:  # a partial decision (the budget cut its search) is not final: continued
                records = self.sink.problem_records(digest, sorted(decided))
                decided -= {pid for pid, record in records.items() if is_partial(record.meta)}
            found |= decided
        return found

    def rest(self) -> Iterator[tuple[str, Target, Workload]]:
        """Empty the backlog: the problems never taken (the run's timeout), one at a time."""
        for item in self.backlog:
            self.left -= 1
            yield item
        self.left = 0

    def refill(self) -> Taken:
        """Lease more problems from the backlog once fewer than half the window are held."""
        active = self.board.count(*ACTIVE)
        if not self.left or active > self.window // 2:
            return Taken()
        assert self.planner is not None
        take = list(itertools.islice(self.backlog, min(self.left, self.window - active)))
        self.left = self.left - len(take) if take else 0
        made = self.planner.problems(take)
        taken = Taken()
        for plan in made:
            counted = self.planner.groups(plan.target, plan.workload)
            tasks, trials = len(plan.tasks) - len(counted.groups), sum(len(t.candidates) for t in plan.tasks) - counted.trials
            if tasks or trials:
                taken.replanned.append((plan.target.digest, tasks, trials))
        return self.claim(self.board.add(made), taken)

    def claim(self, candidates: list[Tracked], taken: Taken | None = None) -> Taken:
        """Lease what is free, give each leased problem the run its results live under (the stored ``round`` of
        ``farm_coordinator.leases``), find the successful results stored under it
        (failed ones are discarded: they run again). The others are held elsewhere."""
        taken = taken or Taken()
        if not candidates:
            return taken
        held = self.leases.acquire([t.pid for t in candidates], self.run)
        for t in candidates:
            if t.pid in held:
                self.elsewhere.pop(t.pid, None)
            else:
                self.elsewhere[t.pid] = None
        mine = [t for t in candidates if t.pid in held]
        if not mine:
            return taken
        runs = self.leases.rounds([t.pid for t in mine], self.run, fresh=self.force)
        for t in mine:
            if t.plan.continues is not None:  # the stored run's results are the partial decision's: a run of its own
                runs[t.pid] = continuation_round(t.plan.continues)
            self.board.claimed(t.pid, held[t.pid], runs[t.pid])
        taken.mine.extend(mine)
        if self.results is not None:
            keys = [task.key for t in mine for task in t.plan.in_round(runs[t.pid])]
            stale = []
            for key, found in zip(keys, self.results.get_many(keys), strict=True):
                if reusable(found):
                    assert found is not None
                    taken.reused.append(found)
                elif found is not None:
                    stale.append(key)
            if stale:
                self.results.discard(stale)
        return taken

    def upkeep(self, fleet: Fleet) -> Taken:
        """Renew our leases (stop working on lost ones), settle problems others decided, take over problems whose
        holder went away, and give up on confirmations whose worker (incarnation) went away."""
        taken = Taken()
        active = {t.pid: t.state.lease for t in self.board.members(*ACTIVE) if t.state.lease is not None}
        for pid in self.leases.renew(active) if active else set():
            self.lose(self.board[pid])
        waiting = [self.board[pid] for pid in self.elsewhere]
        if waiting:
            decided = set() if self.force else self.decided([t.plan for t in waiting])
            for t in waiting:
                if t.pid in decided:
                    self.elsewhere.pop(t.pid, None)
                    self.settle.elsewhere(t)
            before = len(self.elsewhere)
            self.claim([t for t in waiting if t.stage is State.WAITING], taken)
            progressed = len(self.elsewhere) < before or decided
            self.wait_interval = 0.5 if progressed else min(self.wait_interval * 2, max(0.5, self.settings.lease_ttl / 3))
        for t in self.board.members(State.CONFIRMING):
            confirmer = t.state.confirmer
            if confirmer is not None and not fleet.alive(*confirmer):
                self.dispatcher.forget([GroupKey(t.state.run or "", t.pid, CONFIRM_GROUP)])
                taken.gave_up.append((t, f"unconfirmed: confirming worker {confirmer[0]} went away"))
        return taken

    def lose(self, t: Tracked) -> None:
        """Another coordinator holds the problem now: stop working on it (its queued tasks are skipped)."""
        run_id = t.state.run or ""
        self.note(f"lost the lease of problem {t.pid}; stopped working on it")
        self.dispatcher.forget([task.key for task in t.plan.in_round(run_id)] + [GroupKey(run_id, t.pid, CONFIRM_GROUP)])
        self.board.move(t.pid, State.WAITING, "lease lost")
        self.elsewhere[t.pid] = None
