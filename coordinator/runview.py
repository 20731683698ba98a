"""What a run shows and the confirmation task it builds: the default observer (:class:`ConsoleObserver`), the
progress it is told (:func:`observed`), and the helper that turns a winner into a confirmation task."""

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
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from farm_coordinator.aggregate import Aggregate
from farm_coordinator.plan import PlannedProblem
from farm_fleet.protocol import GroupTask

if TYPE_CHECKING:
    from farm_coordinator.ports import RunEvent, RunObserver

CONFIRM_GROUP = "confirm"


def confirm_task(problem: PlannedProblem, run: str, agg: Aggregate) -> GroupTask:
    """The task that re-times ``agg``'s winner on a second device (group ``confirm`` under ``run``, the run id the
    problem's results live under), naming it by name and revision as every task does."""
    assert agg.record is not None
    base = problem.tasks[0]
    winner = (agg.record.name, _revision(problem, agg))
    return GroupTask(run=run, problem_id=base.problem_id, group=CONFIRM_GROUP, operation=base.operation,
                     device_kind=base.device_kind, spec=base.spec, candidates=(winner,), policy=base.policy,
                     fingerprint=base.fingerprint, kernels=base.kernels, confirm_of=agg.record.name,
                     expects=base.expects)


def _revision(problem: PlannedProblem, agg: Aggregate) -> str:
    """The winner's revision, as the plan or the strategy's asks named it."""
    assert agg.record is not None
    try:
        return problem.revision(agg.record.name)
    except KeyError:
        result = next(r for r in agg.results.values() if any(o.name == agg.record.name for o in r.outcomes))
        return next(o.revision for o in result.outcomes if o.name == agg.record.name)


class ConsoleObserver:
    """The default observer of a run (``Parts.observer`` None): notes logged on ``console`` (stderr), each
    :class:`RunEvent` passed to ``on_event`` when given, and, on a terminal, one bar of the run's trials. A
    display that wants only some of the hooks subclasses it."""

    def __init__(self, console: Console | None = None, on_event: Callable[[RunEvent], None] | None = None) -> None:
        self.console = console if console is not None else Console(stderr=True)
        self.on_event = on_event
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("trials"),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        self.bars = Progress(*columns, console=self.console, transient=False, disable=not self.console.is_terminal)
        self.bar: TaskID | None = None

    def started(self, run: str, problems: int, reused: int, trials: int) -> None:
        self.bars.start()
        self.bar = self.bars.add_task(escape(f"run {run}"), total=trials)

    def planned(self, trials: int) -> None:
        if self.bar is not None:
            self.bars.update(self.bar, total=(self.bars.tasks[self.bar].total or 0) + trials)

    def group_done(self, trials: int) -> None:
        if self.bar is not None:
            self.bars.advance(self.bar, trials)

    def problem_done(self, outcome: str, aggregate: Aggregate | None = None) -> None:
        """Counted by the bar's trials."""

    def compiled(self, seconds: float) -> None:
        """Its notes are on the console already."""

    def event(self, event: RunEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def note(self, message: str) -> None:
        self.console.log(message, markup=False)  # notes name configs: tiled[block=32] is not markup

    def finished(self) -> None:
        self.bars.stop()

    def stopped(self) -> None:
        self.bars.stop()


@contextmanager
def observed(observer: RunObserver, run: str, problems: int, reused: int,
             trials: int) -> Iterator[Callable[[int, int], None]]:
    """The run's progress on ``observer``: problems (with the ``reused`` already decided) and trials; yields
    ``advance(trials, planned)``: ``trials`` more done, ``planned`` more planned (a strategy's own groups, asked as
    it goes). A run that ends by an exception (Ctrl-C) is not ``finished``: the observer is ``stopped()``."""

    def advance(done: int, planned: int) -> None:
        if planned:
            observer.planned(planned)
        if done or not planned:
            observer.group_done(done)

    try:
        observer.started(run, problems, reused, trials)  # a Ctrl-C right after the first line is a stop too
        yield advance
    except BaseException:
        observer.stopped()
        raise
    observer.finished()
