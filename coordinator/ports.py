"""The run's ports (what the coordinator needs from the fleet, leases, results and run log, and the observer it
reports to), the :class:`Parts` a run is given and its :class:`RunOptions`, and its records (events for progress
displays, the summary, the interruption)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from farm_coordinator.aggregate import Aggregate
from farm_coordinator.catalog import Workload, parse_run_budget
from farm_coordinator.partial import is_partial
from farm_coordinator.plan import PlannedProblem, Target
from farm_fleet.errors import RunInterrupted
from farm_fleet.protocol import GroupKey, GroupResult

if TYPE_CHECKING:  # types only: the parts are built by their callers (farm_cli.parts)
    from farm_coordinator.dispatch import Dispatcher
    from farm_coordinator.precompile import Precompiler
    from farm_coordinator.sinks import Sink


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

    def update(self, run: str, done: int, published: int, state: str = "running", groups: int | None = None,
               partial: int | None = None) -> None:
        """Progress so far; ``groups``: the group tasks the run planned by now (a strategy plans more as its
        search goes), ``partial``: how many of the published decisions the budget cut (``farm_coordinator.partial``)."""
        ...


class RunObserver(Protocol):
    """The one observer of a run (``Parts.observer``): what the summary counts, as it happens, every
    :class:`RunEvent`, and the run's notes. ``farm_coordinator.runview.ConsoleObserver`` is the default (notes on
    stderr, a bar on a terminal); ``farm_cli.progress`` has the CLI's."""

    def started(self, run: str, problems: int, reused: int, trials: int) -> None:
        """Once, before any group is sent: ``problems`` (``reused`` of them decided before) and planned trials."""
        ...

    def planned(self, trials: int) -> None:
        """The search planned ``trials`` more (a space strategy's own groups, asked as it goes)."""
        ...

    def group_done(self, trials: int) -> None: ...

    def problem_done(self, outcome: str, aggregate: Aggregate | None = None) -> None:
        """A problem settled: ``outcome`` "published", "failed" or "reused" (its aggregate when the run decided it)."""
        ...

    def compiled(self, seconds: float) -> None:
        """The run's compile stage charged ``seconds`` (before any group is sent; once per run)."""
        ...

    def event(self, event: RunEvent) -> None:
        """Every state change and group result (:class:`RunEvent`)."""
        ...

    def note(self, message: str) -> None:
        """A line for the operator (the compile stage's notes, an outage, a lost lease); plain text, not markup."""
        ...

    def finished(self) -> None: ...

    def stopped(self) -> None:
        """The run ended by an exception (Ctrl-C) instead of finishing."""
        ...


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


@dataclass(frozen=True)
class Parts:
    """What :func:`farm_coordinator.run.tune` runs on besides the catalog and the settings (built by
    ``farm_cli.parts``). A Celery fleet has every part; the embedded farm has no leases, shared results, run log or
    bans (None: a run uses local leases and no run log). ``sink``: the decision store itself (``RedisDecisions``,
    ``LocalStore``). ``precompile``: the compile stage run before any group is sent, None for none.
    ``observer``: the run's one observer, None for ``farm_coordinator.runview.ConsoleObserver()``."""

    fleet: Fleet
    dispatcher: Dispatcher
    sink: Sink
    leases: Leases | None = None
    results: Results | None = None
    runlog: RunLog | None = None
    bans: Bans | None = None
    precompile: Precompiler | None = None
    observer: RunObserver | None = None


@dataclass(frozen=True)
class RunOptions:
    """How :func:`farm_coordinator.run.tune` runs. ``run``: the run id (None: a new one); ``force``: re-tune decided
    problems; ``fingerprint``: only the targets whose digest starts with it (or whose fingerprint is it);
    ``timeout``: seconds before the run gives up on what is left; ``poll``: seconds one collect waits;
    ``keep_aggregates``: how many full aggregates the summary keeps (the first decided); ``priors``: seed space
    searches from other fingerprints' decisions, found in the sink and ``prior_archives`` (``farm tune
    --no-priors``, ``--priors-from``); ``budget_device_seconds``: the run's budget in device seconds, in place of the
    catalog's ``run_budget`` (``farm tune --budget-device-seconds``; None: the catalog's)."""

    run: str | None = None
    force: bool = False
    fingerprint: str | None = None
    timeout: float | None = None
    poll: float = 0.5
    keep_aggregates: int = 1000
    priors: bool = True
    prior_archives: Sequence[str] = ()
    budget_device_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.budget_device_seconds is not None:
            parse_run_budget(self.budget_device_seconds, "RunOptions", "budget_device_seconds")


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
    partial: int = 0  # published decisions whose search the budget cut (farm_coordinator.partial): a rerun continues
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
    budget: object | None = None  # what the run's budget bought (farm_coordinator.runbudget.Spent); None: no budget

    def decided(self, agg: Aggregate, error: str | None = None) -> None:
        """A problem this run decided: published (``agg.record``) or failed with ``error``."""
        p = agg.problem
        self.problems.append(Settled(p.problem_id, p.target, p.workload, RAN, error))
        self.trial_seconds += agg.trial_seconds
        self.device_seconds += agg.device_seconds
        if error is None:
            self.published += 1
            self.partial += agg.record is not None and is_partial(agg.record.meta)
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
    headline = f"run {summary.run} interrupted with {remaining} problems unfinished"
    error = RunInterrupted(f"{headline}; run the same command again to resume (finished groups are reused, "
                           f"published problems skipped)")
    error.summary = summary
    error.headline = headline  # what a caller with its own resume advice prints (the advice once, `farm tune`)
    return error
