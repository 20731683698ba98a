"""What a run shows and the confirmation task it builds: the progress bars, the summary table, and the
helper that turns a winner into a confirmation task."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from farm_coordinator.aggregate import Aggregate
from farm_coordinator.catalog import workload_label
from farm_coordinator.plan import PlannedProblem
from farm_fleet.protocol import GroupTask

if TYPE_CHECKING:
    from farm_coordinator.ports import ProgressHook, RunSummary

CONFIRM_GROUP = "confirm"


def confirm_task(problem: PlannedProblem, round_id: str, agg: Aggregate) -> GroupTask:
    """The task that re-times ``agg``'s winner on a second device (group ``confirm`` of the problem's round
    ``round_id``), naming it by name and revision as every task does."""
    assert agg.record is not None
    base = problem.tasks[0]
    winner = (agg.record.name, _revision(problem, agg))
    return GroupTask(round_id, base.problem_id, CONFIRM_GROUP, base.operation, base.device_kind, base.spec, (winner,),
                     base.policy, base.fingerprint, base.kernels, confirm_of=agg.record.name, expects=base.expects)


def _revision(problem: PlannedProblem, agg: Aggregate) -> str:
    """The winner's revision, as the plan or the strategy's asks named it."""
    assert agg.record is not None
    try:
        return problem.revision(agg.record.name)
    except KeyError:
        result = next(r for r in agg.results.values() if any(o.name == agg.record.name for o in r.outcomes))
        return next(o.revision for o in result.outcomes if o.name == agg.record.name)


@contextmanager
def progress(console: Console, totals: dict[str, int]) -> Iterator[Callable[[str, int], None]]:
    """One bar per fingerprint (``totals``: digest -> trials), in trials; yields ``advance(digest, trials)``."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("trials"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as bars_view:
        bars = {digest: bars_view.add_task(f"fingerprint {digest[:8]}", total=total) for digest, total in totals.items()}

        def advance(digest: str, trials: int) -> None:
            bars_view.advance(bars[digest], trials)

        yield advance


@contextmanager
def hooked(hook: ProgressHook, run: str, problems: int, reused: int, trials: int) -> Iterator[Callable[[str, int], None]]:
    """A progress hook in place of the bars: problems (with the ``reused`` already decided) and trials."""
    hook.started(run, problems, reused, trials)
    try:
        yield lambda digest, trials: hook.group_done(trials)
    finally:
        hook.finished()


def summary_table(summary: RunSummary) -> Table:
    """The decisions of a run as a table: one row per problem whose aggregate the summary kept."""
    table = Table(title=escape(f"run {summary.run}: {summary.published} decisions, {summary.decided_before} already "
                        f"decided, {summary.failures} failed; group results: {summary.ran} ran, "
                        f"{summary.reused} reused"))
    for column in ("fingerprint", "operation", "workload", "winner", "ratio", "verified", "confirmation", "lost"):
        table.add_column(column, no_wrap=column != "workload")
    for agg in sorted(summary.aggregates, key=lambda a: (a.problem.target.digest, a.problem.workload.where)):
        r = agg.record
        workload = workload_label(agg.problem.workload.operation, agg.problem.workload.spec)
        row = [escape(v) for v in (agg.problem.target.digest[:8], agg.problem.workload.operation, workload)]
        if r is None:
            table.add_row(*row, "-", "-", "-", "-", escape(agg.error or ""))
            continue
        lost = sum(1 for c in r.meta.get("candidates", []) if c["name"] != r.name)
        confirmation = str(r.meta.get("confirmation") or "-").split(":")[0]
        table.add_row(*row, escape(r.name), f"{r.ratio:.3f}", "yes" if r.verified else "no", escape(confirmation),
                      str(lost))
    return table
