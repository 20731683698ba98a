"""The run's ports (what the coordinator needs from the fleet, leases, results and run log) and its records
(events for progress displays, the summary, the interruption)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from farm_coordinator.aggregate import Aggregate
from farm_coordinator.catalog import Workload
from farm_coordinator.plan import PlannedProblem, Target
from farm_fleet.errors import RunInterrupted
from farm_fleet.protocol import GroupKey, GroupResult


class Fleet(Protocol):
    """Where tasks can run: target fingerprints, their queues, and a second device for confirmations."""

    def targets(self) -> list[Target]: ...

    def queue(self, target: Target) -> str: ...

    def confirmer(self, target: Target, exclude: str | None) -> tuple[str, str, str] | None:
        """(worker id, queue, incarnation) of another healthy device of the target's fingerprint, or None."""
        ...

    def alive(self, worker_id: str, incarnation: str = "") -> bool:
        """Whether that incarnation of a worker still serves (a restarted worker is a new incarnation)."""
        ...


class Bans(Protocol):
    """Candidates the fleet must not choose again for a problem (``coordinator/bans.py``)."""

    def banned(self, digest: str) -> dict[str, set[str]]:
        """Problem id -> the candidates banned for it, on one fingerprint."""
        ...


class Leases(Protocol):
    """Single flight across coordinators, with fencing tokens (see farm_coordinator.leases)."""

    def acquire(self, pids: list[str], holder: str) -> dict[str, str]: ...

    def renew(self, leases: dict[str, str]) -> set[str]: ...

    def release(self, pid: str, lease: str) -> None: ...

    def fence(self, pid: str, lease: str) -> tuple[str, str] | None: ...

    def rounds(self, pids: list[str], run: str, fresh: bool) -> dict[str, str]: ...


class Results(Protocol):
    """Group results stored under their round (``farm_fleet.results``): read back on a claim, stale ones dropped."""

    def get_many(self, keys: list[GroupKey]) -> list[GroupResult | None]: ...

    def discard(self, keys: list[GroupKey]) -> None: ...


class RunLog(Protocol):
    """Where a run records its progress for `farm status` (``farm_coordinator.runlog``)."""

    def start(self, run: str, catalog: str, groups: int) -> None: ...

    def update(self, run: str, done: int, published: int, state: str = "running") -> None: ...


class ProgressHook(Protocol):
    """A display of a run's progress (``farm_cli.progress``): what the summary counts, as it happens."""

    def started(self, run: str, problems: int, reused: int, trials: int) -> None: ...

    def group_done(self, trials: int) -> None: ...

    def problem_done(self, outcome: str, aggregate: Aggregate | None = None) -> None: ...

    def compiled(self, seconds: float) -> None:
        """The run's compile stage charged ``seconds`` (before any group is sent; once per run)."""
        ...

    def finished(self) -> None: ...


@dataclass(frozen=True)
class RunEvent:
    """One step of a run, for progress displays. ``kind``: a problem state ("queued", "running", "confirming",
    "published", "failed", "waiting") when a problem moved, else "group" (a group result arrived), "reused" (a
    stored result was reused), "lost" (a group is sent again), "outage" / "resumed" (Redis or the broker went
    away / came back). Counts are the run's totals so far."""

    kind: str
    problem: PlannedProblem | None
    groups_done: int
    groups_total: int
    published: int
    failed: int
    note: str = ""


RAN, REUSED = "ran", "reused"


@dataclass(frozen=True, slots=True)
class Settled:
    """How one problem left a run, in compact form: ``source`` "ran" (decided by this run: published, or failed
    with ``error``) or "reused" (decided before it, by an earlier run or another coordinator). Its record is read
    back from the sink when wanted (``farm_cli.summary``)."""

    problem_id: str
    target: Target
    workload: Workload
    source: str = RAN
    error: str | None = None


@dataclass
class RunSummary:
    """What a run did: counts, every problem compactly (``problems``), and the full aggregates (verdicts, results,
    records) of the first ``keep`` problems it decided, for callers that inspect them (tests, bench/stability.py)
    at a cost bounded however large the catalog: the records themselves are in the sink."""

    run: str
    keep: int = 1000
    aggregates: list[Aggregate] = field(default_factory=list)
    problems: list[Settled] = field(default_factory=list)
    published: int = 0
    failures: int = 0
    decided_before: int = 0
    trial_seconds: float = 0.0
    wall_seconds: float = 0.0
    tasks: int = 0
    devices: int = 0
    reused: int = 0  # group results reused from an earlier run of the same round
    ran: int = 0  # group results this run received from the fleet
    resent: int = 0  # groups sent again (lost, or their batch stopped early)
    device_seconds: float = 0.0  # what the decided problems' groups ran on their devices (the searches' cost)
    compile_seconds: float = 0.0  # what the run's compile stage charged (farm_coordinator.precompile)

    def decided(self, agg: Aggregate, error: str | None = None) -> None:
        """A problem this run decided: published (``agg.record``) or failed with ``error``."""
        p = agg.problem
        self.problems.append(Settled(p.problem_id, p.target, p.workload, RAN, error))
        self.trial_seconds += agg.trial_seconds
        self.device_seconds += agg.device_seconds
        if error is None:
            self.published += 1
        else:
            self.failures += 1
        if len(self.aggregates) < self.keep:
            self.aggregates.append(agg)

    def not_started(self, pid: str, target: Target, workload: Workload, error: str) -> None:
        """A problem the run never took (its timeout passed first)."""
        self.problems.append(Settled(pid, target, workload, RAN, error))
        self.failures += 1

    def decided_elsewhere(self, problem: PlannedProblem | Settled) -> None:
        """A problem decided before this run took it (an earlier run, another coordinator)."""
        self.problems.append(Settled(problem.problem_id, problem.target, problem.workload, REUSED))
        self.decided_before += 1

    @property
    def already_decided(self) -> list[Settled]:
        return [s for s in self.problems if s.source == REUSED]

    @property
    def failed(self) -> list[tuple[Settled, str]]:
        return [(s, s.error) for s in self.problems if s.error is not None]


def run_interrupted(summary: RunSummary, remaining: int) -> RunInterrupted:
    """The error a run raises on Ctrl-C, carrying its summary so far."""
    error = RunInterrupted(f"run {summary.run} interrupted with {remaining} problems unfinished; run the same "
                           f"command again to resume (finished groups are reused, published problems skipped)")
    error.summary = summary
    return error
