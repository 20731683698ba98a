"""The search seam: which candidates of a problem are sent next, as a pure step from (plan, results so far).

A :class:`Strategy` is asked, round after round, for the next groups of one problem: given the problem's frozen
plan, the group results told so far and the groups still in flight, it names at most ``capacity`` groups, each a
group name and its candidates as (name, revision) pairs (:class:`Ask`). The results of the groups it asked for are
its tells: they come back in the next ask's ``results``. The search ends when the strategy proposes nothing while
nothing is in flight, or when the budget runs out.

:func:`next_tasks` is the pure planning step around a strategy: it turns the asks into group tasks of the
problem's round, gives each the budget the results so far left of the problem's budget (the first asks carry none:
the whole budget, charging the reference's timing, as in-process), and answers every ask made after the budget is
spent with a NOT_TRIED result without sending it. It mutates nothing: the caller applies what it returns through
the board's transitions (``Board.asked``).

Contract of a strategy (what makes a restarted coordinator resume without re-running finished work):

- ``propose`` depends only on its arguments. A coordinator killed and restarted reloads the results stored under
  the problem's round and asks again: the same results give the same asks, so finished groups are reused.
- It never proposes a group that has a result or is in flight (such asks are dropped), nor more than
  ``capacity`` asks (the first ``capacity`` of the others are kept); a group name is unique within the problem
  and never ``"confirm"`` (the confirmation's group).
- It proposes finitely many groups: once the budget is spent every ask is answered NOT_TRIED at once, and the
  step asks again until the strategy proposes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from farm.search import budget_note
from farm_coordinator.machine import Candidates, ProblemState
from farm_coordinator.plan import PlannedProblem
from farm_fleet.protocol import GroupResult, GroupTask


@dataclass(frozen=True)
class Ask:
    """One group a strategy wants timed: its name (unique in the problem) and candidates (name, revision).
    A race's group names its ``incumbent`` (name, revision) and the ``noise`` it carries (``GroupTask``);
    ``whole_budget``: the race winner's final trials, sent even after the budget is spent and carrying the whole
    budget (in-process, the winner's full verdict too is one candidate's trials more, ``farm.racing``)."""

    group: str
    candidates: Candidates
    incumbent: tuple[str, str] | None = None
    noise: tuple[float, ...] = ()
    whole_budget: bool = False


class Strategy(Protocol):
    """Names the next candidates of a problem to send; see the module's docstring for the contract."""

    def propose(self, plan: PlannedProblem, results: Mapping[str, GroupResult], in_flight: Collection[str],
                capacity: int) -> Sequence[Ask]:
        """At most ``capacity`` (>= 1) new groups to send now, in the order they should run; none to wait for
        the groups in flight, or, with none in flight, to end the search."""
        ...


class PriorityGroups:
    """The plan's priority groups one after the other: the next group without a result, once none is in flight
    (each then carries what the earlier groups left of the budget)."""

    def propose(self, plan: PlannedProblem, results: Mapping[str, GroupResult], in_flight: Collection[str],
                capacity: int) -> Sequence[Ask]:
        if in_flight:
            return ()
        for task in plan.tasks:
            if task.group not in results:
                return (Ask(task.group, task.candidates),)
        return ()


PRIORITY_GROUPS = PriorityGroups()


def next_tasks(plan: PlannedProblem, state: ProblemState, budget: float, strategy: Strategy = PRIORITY_GROUPS,
               capacity: int = 1) -> tuple[list[GroupTask], list[GroupResult]]:
    """The group tasks to send now and the NOT_TRIED results of the groups asked for after the problem's
    ``budget`` (seconds) was spent; ``capacity``: how many tasks may be proposed now (the live devices of the
    problem's fingerprint). Pure: ``state`` is read, never changed."""
    results = dict(state.results)
    in_flight = set(state.in_flight)
    tasks: list[GroupTask] = []
    not_tried: list[GroupResult] = []
    while len(tasks) < capacity:
        room = capacity - len(tasks)
        asks = [a for a in strategy.propose(plan, results, frozenset(in_flight), room)
                if a.group not in results and a.group not in in_flight][:room]
        if not asks:
            break
        spent = sum(r.search_seconds for r in results.values())
        left = None if not results else budget - spent
        for ask in asks:
            task = _task(plan, state.run, ask)
            if left is not None and left <= 0 and not ask.whole_budget:
                results[ask.group] = result = GroupResult.not_tried(task, budget_note(budget))
                not_tried.append(result)
                continue
            in_flight.add(ask.group)
            tasks.append(dataclasses.replace(task, budget=None if ask.whole_budget else left))
    return tasks, not_tried


def _task(plan: PlannedProblem, round_id: str | None, ask: Ask) -> GroupTask:
    """The task of an ask, under the problem's round (the plan's run before a claim gives it one)."""
    planned = plan.task(ask.group) or plan.tasks[0]
    return dataclasses.replace(planned, run=round_id or planned.run, group=ask.group, candidates=ask.candidates,
                               incumbent=ask.incumbent, noise=ask.noise)
