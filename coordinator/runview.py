"""What a run shows and the confirmation task it builds: the progress bars, the summary table, and the
helpers that turn a winner into a confirmation task or an unconfirmed decision."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from farm.stores.base import DecisionRecord
from farm_coordinator.aggregate import Aggregate
from farm_coordinator.plan import Problem
from farm_fleet.protocol import GroupTask

if TYPE_CHECKING:
    from farm_coordinator.run import RunSummary

CONFIRM_GROUP = "confirm"


def confirm_task(problem: Problem, agg: Aggregate) -> GroupTask:
    """The task that re-times ``agg``'s winner on a second device (group ``confirm`` of the problem's round)."""
    assert agg.record is not None
    base = problem.tasks[0]
    from farm_kernels import registry

    tunable = registry.get(base.operation).tunable(base.device_kind)
    impl = next(i for i, impl in enumerate(tunable.implementations) if impl.name == agg.record.name)
    return GroupTask(base.run, base.problem_id, CONFIRM_GROUP, base.operation, base.device_kind, base.spec, (impl,),
                     base.policy, base.fingerprint, base.kernels, confirm_of=agg.record.name)


def unconfirmed(agg: Aggregate, reason: str = "unconfirmed: no second device of this fingerprint online") -> Aggregate:
    """``agg`` with its record marked unconfirmed for ``reason``."""
    assert agg.record is not None
    r = agg.record
    meta = dict(r.meta, confirmation=reason)
    return Aggregate(agg.problem, DecisionRecord(r.cache_key, r.index, r.reference_index, r.name, r.verified, r.ratio,
                                                 r.created, meta),
                     agg.judged, agg.winner, agg.ratio, agg.error, agg.trial_seconds, agg.winner_worker)


@contextmanager
def progress(console: Console, problems: list[Problem]) -> Iterator[Callable[[str, int], None]]:
    """One bar per fingerprint, in trials; yields ``advance(digest, trials)``."""
    totals: dict[str, int] = {}
    for p in problems:
        totals[p.target.digest] = totals.get(p.target.digest, 0) + sum(len(t.indices) for t in p.tasks)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("trials"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as bars_view:
        bars = {digest: bars_view.add_task(f"fingerprint {digest[:8]}", total=total) for digest, total in totals.items()}

        def advance(digest: str, trials: int) -> None:
            bars_view.advance(bars[digest], trials)

        yield advance


def summary_table(summary: RunSummary) -> Table:
    """The decisions of a run as a table: one row per problem."""
    from farm_kernels import registry

    table = Table(title=f"run {summary.run}: {summary.published} decisions, {len(summary.already_decided)} already "
                        f"decided, {len(summary.failed)} failed; group results: {summary.ran} ran, "
                        f"{summary.reused} reused")
    for column in ("fingerprint", "operation", "workload", "winner", "ratio", "verified", "confirmation", "lost"):
        table.add_column(column, no_wrap=column != "workload")
    for agg in sorted(summary.aggregates, key=lambda a: (a.problem.target.digest, a.problem.workload.where)):
        r = agg.record
        workload = registry.get(agg.problem.workload.operation).label(agg.problem.workload.spec)
        row = [agg.problem.target.digest[:8], agg.problem.workload.operation, workload]
        if r is None:
            table.add_row(*row, "-", "-", "-", "-", agg.error or "")
            continue
        lost = sum(1 for c in r.meta.get("candidates", []) if not str(c["note"]).startswith("selected"))
        confirmation = str(r.meta.get("confirmation") or "-").split(":")[0]
        table.add_row(*row, r.name, f"{r.ratio:.3f}", "yes" if r.verified else "no", confirmation, str(lost))
    return table
