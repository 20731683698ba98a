"""A run's budget in device seconds on the coordinator (``farm tune --budget-device-seconds N``, ``[policy]
run_budget = N``): which problem's next group gets a free device, what each result charged, when the budget is
spent, and what it bought.

The run (``farm_coordinator.run``) sends through a :class:`BudgetGate`, a dispatcher in front of the real one
(:func:`budgeted`). The gate holds the groups the run sends, per problem, and whenever a device of a queue is free
(at most two groups per device in flight, one running and one waiting) it passes on the next group of the problem
the allocator (``farm_coordinator.budget``) ranks first among those holding one for that queue; once a problem had
its first round, only while its expected rate is at least ``RATE_FLOOR`` of the best problem at work (a GPU
model's devices serve only its problems: the budget is not spent on a poor problem because its device is free;
an idle device costs the budget nothing). Every group result charges its problem: the seconds it ran on its device (``GroupResult.device_seconds``; a confirmation's
too), the reference's seconds per call, the best ratio it showed (a full verdict's decided win, or a raced config
promoted against an incumbent whose estimate is known) and the share of its search left (its space's configs, or
``max_configs``).

Once the charges reach the budget nothing new reaches the devices: every group held, and every group sent after,
is answered NOT_TRIED with the note ``the run's budget of N device seconds was spent``, except a race winner's
final verdict against the reference (``final.<position>``), which is sent as under the per-problem budget. So every
problem the run touched ends its search and is decided and published through the usual aggregation (the best
decided winner, marked partial: ``farm_coordinator.partial``); a problem it never started fails, saying why. The
per-problem ``budget`` (seconds of search) still bounds each search. The groups in flight when the budget is spent
finish and are charged: a run may pass its budget by what they ran.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from farm.policy import StackPolicy
from farm.scoring import judge
from farm_coordinator.budget import Allocator, Bought, bought, expected_rate
from farm_coordinator.catalog import Catalog, workload_label
from farm_coordinator.dispatch import Dispatcher
from farm_coordinator.plan import Target, searches_spaces
from farm_coordinator.ports import RunSummary
from farm_coordinator.racing import PROMOTED, parse_final
from farm_coordinator.runview import CONFIRM_GROUP
from farm_fleet.protocol import STATUS_OK, GroupKey, GroupResult, GroupTask

PER_DEVICE = 2
"""Groups per device the gate lets through at once: one running, one waiting behind it."""
RATE_FLOOR = 0.5
"""A warm problem's group is sent only while its expected rate is at least this share of the best one at work."""


def spent_note(budget: float) -> str:
    """Why a group was not tried: ``the run's budget of 60 device seconds was spent``."""
    return f"the run's budget of {budget:g} device seconds was spent"


@dataclass(frozen=True)
class Spent:
    """What a run's budget bought (``RunSummary.budget``): the ``budget`` (device seconds), what the allocator
    charged and bought (``farm_coordinator.budget.Bought``) and each problem's label (problem id -> its
    fingerprint's digest prefix, operation and workload)."""

    budget: float
    bought: Bought
    labels: dict[str, str]

    def lines(self, most: int = 5) -> list[str]:
        """The report: how much was spent and the fleet time saved, then the problems that got the most device
        seconds (at most ``most``)."""
        b = self.bought
        share = f", {b.share:.0%} of the achievable (estimated)" if b.share is not None else ""
        out = [f"budget: {b.spent:,.1f} of {self.budget:g} device s spent on {len(b.problems)} problems; fleet time "
               f"saved {b.saved:,.4g} per hour (weighted){share}"]
        out += [f"  {seconds:,.1f} device s: {self.labels.get(pid, pid)} (saves {saved:,.4g} per hour)"
                for pid, seconds, saved in b.problems[:most]]
        if len(b.problems) > most:
            out.append(f"  ... and {len(b.problems) - most:,} more problems")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``farm tune --json``'s ``budget``)."""
        b = self.bought
        return {"budget": self.budget, "spent": b.spent, "saved_per_hour": b.saved, "achievable_per_hour": b.achievable,
                "share": b.share, "problems": [{"problem_id": pid, "problem": self.labels.get(pid, pid),
                                                "device_seconds": s, "saved_per_hour": v} for pid, s, v in b.problems]}


@dataclass
class _Held:
    """A group the gate holds: the task, its queue and the time limits it was sent with."""

    task: GroupTask
    queue: str
    limits: tuple[float, float]


class BudgetGate:
    """A :class:`~farm_coordinator.dispatch.Dispatcher` that spends a run's budget of device seconds in front of
    ``inner`` (see the module docstring), judging verdicts under ``policy``. Per group task: ``weights``, its
    problem's weight; ``configs``, the space configs its search may evaluate (0: none or unknown); ``label``, how
    the report names its problem. ``capacity``: queue -> the groups it may have in flight."""

    def __init__(self, inner: Dispatcher, budget: float, policy: StackPolicy, weights: Callable[[GroupTask], float],
                 capacity: Callable[[str], int], configs: Callable[[GroupTask], int],
                 label: Callable[[GroupTask], str]) -> None:
        self.inner, self.budget, self.policy = inner, budget, policy
        self.weights, self.capacity, self.configs, self.label = weights, capacity, configs, label
        self.allocator = Allocator()
        self.held: dict[str, deque[_Held]] = {}
        self.answered: deque[GroupResult] = deque()  # NOT_TRIED answers, returned by the next collect
        self.passed: dict[GroupKey, str] = {}  # groups passed on, not answered yet -> their queue
        self.estimates: dict[str, dict[str, float]] = {}  # problem id -> candidate -> its estimated ratio
        self.reference: dict[str, str] = {}  # problem id -> its reference's name
        self.results: dict[str, int] = {}  # problem id -> results charged
        self.totals: dict[str, int] = {}  # problem id -> the groups its search may take (0: unknown)
        self.labels: dict[str, str] = {}
        self.cut: set[str] = set()  # problems with groups answered NOT_TRIED
        self.told: set[str] = set()  # problems whose results the last collect returned: still at work

    @property
    def exhausted(self) -> bool:
        """Whether the charges reached the budget: nothing new is sent."""
        return self.allocator.spent >= self.budget

    # -- the Dispatcher port ---------------------------------------------------------------------------------

    def submit(self, tasks: list[GroupTask], queue: str, limits: tuple[float, float]) -> None:
        for task in tasks:
            pid = task.problem_id
            if pid not in self.allocator:
                self.allocator.add(pid, self.weights(task))
                self.reference[pid] = task.candidates[0][0] if task.candidates else ""
                self.totals[pid] = self.configs(task)
                self.labels[pid] = self.label(task)
            if task.group == CONFIRM_GROUP or (self.exhausted and parse_final(task.group) is not None):
                self._pass(_Held(task, queue, limits))
            elif self.exhausted:
                self._not_tried(task)
            else:
                self.held.setdefault(pid, deque()).append(_Held(task, queue, limits))
        self._release()

    def collect(self, wait: float = 0.0) -> list[GroupResult]:
        self.told.clear()  # the run has handled the last results: their problems sent their next groups, or ended
        self._release()
        got = self.inner.collect(wait=0.0 if self.answered else wait) if self.inner.in_flight() else []
        for result in got:
            self.passed.pop(GroupKey(result.run, result.problem_id, result.group), None)
            self.told.add(result.problem_id)
            self._charge(result)
        if self.exhausted:
            for pid in list(self.held):
                for held in self.held.pop(pid):
                    self._not_tried(held.task)
        answered = list(self.answered)
        self.answered.clear()
        return answered + got

    def lost(self) -> list[GroupTask]:
        tasks = self.inner.lost()
        for task in tasks:  # the run sends a lost group again: it comes back through submit
            self.passed.pop(task.key, None)
        return tasks

    def forget(self, keys: list[GroupKey]) -> None:
        self.inner.forget(keys)
        drop = set(keys)
        for key in drop:
            self.passed.pop(key, None)
        for pid in list(self.held):
            kept = deque(h for h in self.held[pid] if h.task.key not in drop)
            if kept:
                self.held[pid] = kept
            else:
                del self.held[pid]

    def in_flight(self) -> int:
        """What the run waits on: the groups passed on, the answers not yet collected, and one for the groups
        held (the run sends every group it has at once: the allocator picks among all of them)."""
        return self.inner.in_flight() + len(self.answered) + (1 if self.held else 0)

    def cancel(self) -> list[GroupTask]:
        tasks = self.inner.cancel() + [h.task for held in self.held.values() for h in held]
        self.held.clear()
        self.passed.clear()
        return tasks

    # -- spending ----------------------------------------------------------------------------------------------

    def _pass(self, held: _Held) -> None:
        self.inner.submit([held.task], held.queue, held.limits)
        self.passed[held.task.key] = held.queue

    def _not_tried(self, task: GroupTask) -> None:
        self.cut.add(task.problem_id)
        self.answered.append(GroupResult.not_tried(task, spent_note(self.budget)))

    def _release(self) -> None:
        """Pass on held groups while their queues have room, the allocator's choice first. A warm problem's group
        waits while a problem at work elsewhere (holding, running or just told groups) is expected to buy more than
        ``1 / RATE_FLOOR`` times as much per device-second: an idle device costs the budget nothing."""
        while self.held and not self.exhausted:
            busy = Counter(self.passed.values())
            ready = [pid for pid, held in self.held.items() if busy[held[0].queue] < self.capacity(held[0].queue)]
            pid = self.allocator.next(ready)
            if pid is None:
                return
            if self.allocator[pid].warm:
                working = set(self.held) | self.told | {key.problem_id for key in self.passed}
                top = max(expected_rate(self.allocator[p]) for p in working if p in self.allocator)
                if expected_rate(self.allocator[pid]) < RATE_FLOOR * top:
                    return
            held = self.held[pid]
            self._pass(held.popleft())
            if not held:
                del self.held[pid]

    def _charge(self, result: GroupResult) -> None:
        pid = result.problem_id
        if pid not in self.allocator:
            return
        done = self.results[pid] = self.results.get(pid, 0) + 1
        total = self.totals.get(pid, 0)
        times = [s for s in result.reference_times if s > 0]
        self.allocator.observe(pid, result.device_seconds,
                               reference_seconds=statistics.median(times) if times else None,
                               ratio=self._ratio(pid, result), left=1.0 - done / total if total else None)

    def _ratio(self, pid: str, result: GroupResult) -> float | None:
        """The best ratio to the reference ``result`` shows: a full verdict's decided win, or a raced config
        promoted against an incumbent whose estimate is known (its fastest run over the incumbent's, times it)."""
        if result.status != STATUS_OK or result.group == CONFIRM_GROUP:
            return None
        known = self.estimates.setdefault(pid, {})
        best: float | None = None
        for o in result.outcomes:
            if o.failure is not None or not o.pairs:
                continue
            estimate: float | None = None
            if result.incumbent is None:
                verdict = judge(o.pairs, self.policy)
                estimate = verdict.ratio if verdict.wins else None
            elif result.standings.get(o.name) == PROMOTED:
                base = known.get(result.incumbent, 1.0 if result.incumbent == self.reference.get(pid) else None)
                if base is not None:
                    estimate = min(c for _, c in o.pairs) / min(i for i, _ in o.pairs) * base
            if estimate is not None:
                known[o.name] = estimate
                best = estimate if best is None else min(best, estimate)
        return best

    def report(self) -> Spent:
        """What the budget bought: a problem the gate never cut counts as finished (its search ended)."""
        standings = [s if s.key in self.cut else dataclasses.replace(s, finished=True)
                     for s in self.allocator.standings()]
        return Spent(self.budget, bought(standings), dict(self.labels))


def budgeted(dispatcher: Dispatcher, fleet: Any, catalog: Catalog) -> Dispatcher:
    """``dispatcher`` behind a :class:`BudgetGate` when the catalog has a run budget (``catalog.run_budget``),
    else ``dispatcher`` itself. ``fleet``: the run's fleet (its targets' devices size each queue's room)."""
    budget = getattr(catalog, "run_budget", None)
    if budget is None:
        return dispatcher
    from farm.decisions import canonical_json

    policy = catalog.policy
    weights = {(w.operation, canonical_json(w.normalized)): float(getattr(w, "weight", 1.0))
               for w in catalog.workloads}
    rooms: dict[str, int] = {}

    def capacity(queue: str) -> int:
        if not rooms:
            targets: list[Target] = fleet.targets()
            for target in targets:
                rooms[fleet.queue(target)] = PER_DEVICE * max(1, len(target.workers))
        return rooms.get(queue, PER_DEVICE)

    def configs(task: GroupTask) -> int:
        if not searches_spaces(policy):
            return 0
        size = _space_size(task.operation, task.device_kind)
        return min(size, policy.max_configs) if policy.max_configs is not None else size

    return BudgetGate(dispatcher, float(budget), policy,
                      lambda task: weights.get((task.operation, canonical_json(task.spec)), 1.0), capacity,
                      configs, lambda task: f"{task.fingerprint[:8]} {task.operation} "
                                            f"{workload_label(task.operation, task.spec)}")


def bought_by(dispatcher: Dispatcher, summary: RunSummary) -> RunSummary:
    """``summary`` with what the run budget bought (``summary.budget``) when ``dispatcher`` is a gate."""
    if isinstance(dispatcher, BudgetGate):
        summary.budget = dispatcher.report()
    return summary


@functools.lru_cache(maxsize=64)
def _space_size(operation: str, device_kind: str) -> int:
    """How many configs an operation's spaces declare on a device kind (0 without spaces)."""
    from farm.strategies import space_size
    from farm_kernels import recorded

    tunable = recorded.tunable(operation, device_kind)
    return space_size(tunable.roster()) if tunable.spaces else 0
