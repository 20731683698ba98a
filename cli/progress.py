"""Progress of a tuning run: a live bar on a terminal, periodic one-line log records otherwise.

Both count what the run's summary counts: problems published, failed and reused (already decided), plus trials.
They are the run's observer (``farm_coordinator.ports.RunObserver``, given as ``Parts.observer``): ``started``
once, ``group_done`` per finished candidate group, ``problem_done`` per settled problem (with its aggregate when
the run decided it), ``finished`` (or ``stopped``) once; the run's notes go to the stderr console.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only
    from farm_coordinator.aggregate import Aggregate
    from farm_coordinator.ports import RunEvent

log = logging.getLogger("farm.coordinator")

PUBLISHED, FAILED, REUSED = "published", "failed", "reused"


@dataclass
class Counts:
    run: str = ""
    problems: int = 0
    trials_total: int = 0
    trials: int = 0
    groups: int = 0
    settled: dict[str, int] = field(default_factory=lambda: {PUBLISHED: 0, FAILED: 0, REUSED: 0})
    started: float = field(default_factory=time.monotonic)
    not_tried: int = 0  # groups the budget left out (the coordinator recorded them "not tried")

    @property
    def done(self) -> int:
        return sum(self.settled.values())

    def line(self) -> str:
        s = self.settled
        return (f"run {self.run}: {self.done}/{self.problems} problems ({s[PUBLISHED]} published, {s[FAILED]} failed, "
                f"{s[REUSED]} reused), {self.trials}/{self.trials_total} trials, "
                f"{time.monotonic() - self.started:.0f}s elapsed")

    def count(self, aggregate: Aggregate | None) -> None:
        """Note the groups of a decided problem that were not tried (its budget ran out before their turn)."""
        from farm_fleet.protocol import STATUS_NOT_TRIED

        if aggregate is not None:
            self.not_tried += sum(1 for r in aggregate.results.values() if r.status == STATUS_NOT_TRIED)

    def why_fewer(self) -> str:
        """At the end of a run whose trials fall short of the plan: why (``""`` when they do not)."""
        missing = self.trials_total - self.trials
        if missing <= 0 or self.done < self.problems:
            return ""
        if self.not_tried:
            groups = "1 group's turn" if self.not_tried == 1 else f"{self.not_tried} groups' turns"
            return f"; {missing} planned trials not run: the budget ran out before {groups} (verdict: not tried)"
        return f"; {missing} planned trials not run: their problems were decided or failed without them"

    def fields(self) -> dict[str, Any]:
        return {"run": self.run, "problems": self.problems, "done": self.done, "published": self.settled[PUBLISHED],
                "failed": self.settled[FAILED], "reused": self.settled[REUSED], "trials": self.trials,
                "trials_total": self.trials_total, "groups_not_tried": self.not_tried}


class LogProgress:
    """One INFO record at the start, then at most one every ``every`` seconds, and one at the end."""

    def __init__(self, every: float = 10.0, console: Any = None) -> None:
        self.counts = Counts()
        self.every = every
        self._last = 0.0
        self.console = console  # where notes go (None: a stderr console, made at the first note)

    def started(self, run: str, problems: int, reused: int, trials: int) -> None:
        self.counts = Counts(run, problems, trials)
        self.counts.settled[REUSED] = reused
        log.info("%s", self.counts.line(), extra={"progress": self.counts.fields()})
        self._last = time.monotonic()

    def group_done(self, trials: int) -> None:
        self.counts.trials += trials
        self.counts.groups += 1
        self._maybe_log()

    def problem_done(self, outcome: str, aggregate: Aggregate | None = None) -> None:
        self.counts.settled[outcome] = self.counts.settled.get(outcome, 0) + 1
        self.counts.count(aggregate)
        self._maybe_log()

    def compiled(self, seconds: float) -> None:
        """Nothing to show: the compile stage's notes are on the console, its seconds in the closing summary."""

    def event(self, event: RunEvent) -> None:
        """Nothing to show: the counts above are what a display shows."""

    def note(self, message: str) -> None:
        """A line for the operator (the compile stage's notes, an outage), on the stderr console."""
        if self.console is None:
            from rich.console import Console

            self.console = Console(stderr=True)
        self.console.log(message, markup=False)

    def planned(self, trials: int) -> None:
        """The search planned ``trials`` more (a space strategy's own groups, asked as it goes)."""
        self.counts.trials_total += trials

    def finished(self) -> None:
        log.info("%s (finished%s)", self.counts.line(), self.counts.why_fewer(),
                 extra={"progress": self.counts.fields()})

    def stopped(self) -> None:
        """The run ended early (Ctrl-C): the counts so far, never "finished" (the resume advice is the CLI's)."""
        log.info("%s (stopped)", self.counts.line(), extra={"progress": self.counts.fields()})

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            log.info("%s", self.counts.line(), extra={"progress": self.counts.fields()})


class TerminalProgress(LogProgress):
    """A rich bar of problems settled out of all problems, with the counts and trials beside it."""

    def __init__(self, console: Any) -> None:
        super().__init__(console=console)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("problems  {task.fields[detail]}"), TimeElapsedColumn(), console=console,
                            transient=False)
        self.task: Any = None

    def started(self, run: str, problems: int, reused: int, trials: int) -> None:
        self.counts = Counts(run, problems, trials)
        self.counts.settled[REUSED] = reused
        self.bar.start()
        from rich.markup import escape  # a --run name is not markup

        self.task = self.bar.add_task(escape(f"run {run}"), total=problems, completed=reused, detail=self._detail())

    def group_done(self, trials: int) -> None:
        self.counts.trials += trials
        self.counts.groups += 1
        self._refresh()

    def problem_done(self, outcome: str, aggregate: Aggregate | None = None) -> None:
        self.counts.settled[outcome] = self.counts.settled.get(outcome, 0) + 1
        self.counts.count(aggregate)
        self._refresh()

    def stopped(self) -> None:
        self._refresh()
        self.bar.stop()

    def finished(self) -> None:
        self._refresh()
        self.bar.stop()
        why = self.counts.why_fewer()
        if why:
            self.bar.console.print(why[2:], markup=False)

    def _detail(self) -> str:
        s = self.counts.settled
        return (f"{s[PUBLISHED]} published, {s[FAILED]} failed, {s[REUSED]} reused; "
                f"{self.counts.trials}/{self.counts.trials_total} trials")

    def _refresh(self) -> None:
        if self.task is not None:
            self.bar.update(self.task, completed=self.counts.done, detail=self._detail())
