"""The coordinator's problems as an explicit state machine, and the board that owns their state.

Each problem of a run is a frozen plan (``farm_coordinator.plan.PlannedProblem``) and one :class:`ProblemState`
that only the :class:`Board`'s named transitions change; everything else reads it. Each problem is in exactly one
stage; events (a lease taken or lost, a group result, a decision, a confirmation, a publication, a timeout) move
it along the allowed transitions below, in O(1) per event. The board keeps each stage's members as an
insertion-ordered set, so upkeep visits only the problems in the stages it cares about (never every problem).

::

    waiting ──lease──> queued ──first group sent──> running ──search ended──> confirming ──> published
       ^  │                │                            │                            │
       │  └─decided elsewhere / timeout──> published | failed <──────────────────────┘
       └──────────── lease lost (another coordinator holds the problem now) ───────────┘

``waiting``: not leased by this coordinator (free, or held by another one). ``queued``: leased, its groups
wait to be sent. ``running``: some group is in flight. ``confirming``: a winner is being re-timed on a second
device. ``published``: its decision is stored (or another coordinator's is). ``failed``: nothing can be
published (every group failed, validation unavailable, the run's timeout, a group never came back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from farm_coordinator.aggregate import Aggregate
from farm_coordinator.plan import PlannedProblem
from farm_fleet.errors import IllegalTransition
from farm_fleet.protocol import GroupResult, GroupTask


class State(StrEnum):
    WAITING = "waiting"
    QUEUED = "queued"
    RUNNING = "running"
    CONFIRMING = "confirming"
    PUBLISHED = "published"
    FAILED = "failed"


FINAL = frozenset({State.PUBLISHED, State.FAILED})
ACTIVE = (State.QUEUED, State.RUNNING, State.CONFIRMING)  # leased by this coordinator

ALLOWED: dict[State, frozenset[State]] = {
    State.WAITING: frozenset({State.QUEUED, State.PUBLISHED, State.FAILED}),
    State.QUEUED: frozenset({State.RUNNING, State.CONFIRMING, State.PUBLISHED, State.FAILED, State.WAITING}),
    State.RUNNING: frozenset({State.CONFIRMING, State.PUBLISHED, State.FAILED, State.WAITING, State.QUEUED}),
    State.CONFIRMING: frozenset({State.PUBLISHED, State.FAILED, State.WAITING}),
    State.PUBLISHED: frozenset(),
    State.FAILED: frozenset(),
}


Candidates = tuple[tuple[str, str], ...]


@dataclass
class ProblemState:
    """What a run knows about one problem now. The board owns it: only its transitions change it, everything
    else reads it. ``results``: the group results so far (sent, reused, or NOT_TRIED when the budget was spent),
    in the order they arrived; ``in_flight``: groups asked and not answered; ``asked``: the candidates of every
    group the strategy asked for in this claim; ``ended``: the strategy proposed nothing more while nothing was in
    flight (the search is over: the problem can be decided); ``confirming``: the aggregate whose winner a second
    device re-times; ``aggregate``: the decision waiting for its publication. ``run``: the run id its group results
    live under (the claim's namespace, ``GroupTask.run``; stored as the problem's ``round`` key in Redis,
    ``farm_coordinator.leases``), not a search round."""

    stage: State = State.WAITING
    lease: str | None = None  # the lease value (holder#token) while this coordinator holds it
    run: str | None = None  # the run id its group results live under (its claim's namespace)
    confirmer: tuple[str, str] | None = None  # (worker id, incarnation) re-timing the winner
    sends: dict[str, int] = field(default_factory=dict)  # group -> times the coordinator sent it in this claim
    lost: dict[str, int] = field(default_factory=dict)  # group -> times it started and never came back
    note: str = ""  # why it failed, or how it was published
    results: dict[str, GroupResult] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    asked: dict[str, Candidates] = field(default_factory=dict)
    ended: bool = False
    confirming: Aggregate | None = None
    aggregate: Aggregate | None = None


@dataclass(frozen=True)
class Tracked:
    """One problem on the board: its frozen plan and its state (which only the board's transitions change)."""

    plan: PlannedProblem
    state: ProblemState

    @property
    def pid(self) -> str:
        return self.plan.problem_id

    @property
    def stage(self) -> State:
        return self.state.stage


class Board:
    """The problems of a run by stage, and the one owner of their state. ``on_move(tracked, old, new)`` is called
    after each change of stage.

    A run adds problems as it takes them (:meth:`add`) and, with ``keep_final`` false, a problem leaves the board
    once it is final (published or failed): the board holds what the run works on, never every problem it ran.
    ``finished`` counts the problems that left."""

    def __init__(self, problems: list[PlannedProblem],
                 on_move: Callable[[Tracked, State, State], object] | None = None, keep_final: bool = True) -> None:
        self.items: dict[str, Tracked] = {}
        self._members: dict[State, dict[str, None]] = {s: {} for s in State}
        self.on_move = on_move
        self.keep_final = keep_final
        self.finished = 0
        self.add(problems)

    def add(self, problems: list[PlannedProblem]) -> list[Tracked]:
        """Put problems on the board, waiting; a problem already on it is left as it is."""
        added = [Tracked(p, ProblemState()) for p in problems if p.problem_id not in self.items]
        for t in added:
            self.items[t.pid] = t
            self._members[State.WAITING][t.pid] = None
        return added

    def __getitem__(self, pid: str) -> Tracked:
        return self.items[pid]

    def get(self, pid: str) -> Tracked | None:
        return self.items.get(pid)

    # -- transitions -----------------------------------------------------------------------------------------

    def move(self, pid: str, new: State, note: str = "") -> Tracked:
        """Change a problem's stage along :data:`ALLOWED` (IllegalTransition otherwise). Leaving the active
        stages drops its lease and pending verdict."""
        tracked = self.items[pid]
        state = tracked.state
        old = state.stage
        if old is new:
            return tracked
        if new not in ALLOWED[old]:
            raise IllegalTransition(f"problem {pid}: {old.value} -> {new.value}")
        del self._members[old][pid]
        self._members[new][pid] = None
        state.stage = new
        if note:
            state.note = note
        if new not in ACTIVE:
            state.lease = None
            state.aggregate = None
        if new in FINAL and not self.keep_final:
            del self.items[pid], self._members[new][pid]
            self.finished += 1
        if self.on_move is not None:
            self.on_move(tracked, old, new)
        return tracked

    def claimed(self, pid: str, lease: str, run: str) -> Tracked:
        """This coordinator holds the problem under ``lease``; its results live under ``run``. Nothing of an
        earlier claim carries over (none of it is in flight for us any more): it is queued afresh."""
        state = self.items[pid].state
        state.lease, state.run, state.confirmer = lease, run, None
        for kept in (state.sends, state.lost, state.results, state.in_flight, state.asked):
            kept.clear()
        state.ended, state.confirming, state.aggregate = False, None, None
        return self.move(pid, State.QUEUED)

    def asked(self, pid: str, tasks: list[GroupTask], not_tried: list[GroupResult]) -> bool:
        """Apply a planning step (``farm_coordinator.strategy.next_tasks``): ``tasks`` go in flight, ``not_tried``
        become results. Returns whether the search has ended (nothing proposed, nothing in flight)."""
        state = self.items[pid].state
        for task in tasks:
            state.in_flight.add(task.group)
            state.asked[task.group] = task.candidates
        for result in not_tried:
            state.results[result.group] = result
        state.ended = not tasks and not state.in_flight
        return state.ended

    def sent(self, pid: str, group: str) -> None:
        """A group task of the problem left for the devices (again, when it was lost)."""
        state = self.items[pid].state
        state.sends[group] = state.sends.get(group, 0) + 1
        if state.stage is State.QUEUED:
            self.move(pid, State.RUNNING)

    def result(self, pid: str, result: GroupResult) -> bool:
        """A group result arrived (or was reused); False when the group had one already (a duplicate)."""
        state = self.items[pid].state
        if result.group in state.results:
            return False
        state.results[result.group] = result
        state.in_flight.discard(result.group)
        return True

    def lost(self, pid: str, group: str) -> int:
        """A group in flight will not come back as sent; returns how often that happened in this claim."""
        state = self.items[pid].state
        state.lost[group] = lost = state.lost.get(group, 0) + 1
        return lost

    def confirming(self, pid: str, aggregate: Aggregate, confirmer: tuple[str, str]) -> Tracked:
        """``aggregate``'s winner is re-timed by ``confirmer`` (worker id, incarnation)."""
        state = self.items[pid].state
        state.confirming, state.confirmer = aggregate, confirmer
        return self.move(pid, State.CONFIRMING)

    def decided(self, pid: str, aggregate: Aggregate) -> None:
        """The problem's decision, waiting for its publication."""
        self.items[pid].state.aggregate = aggregate

    # -- reads -----------------------------------------------------------------------------------------------

    def count(self, *states: State) -> int:
        return sum(len(self._members[s]) for s in states)

    def members(self, *states: State) -> Iterator[Tracked]:
        """The problems in ``states`` (a snapshot: moving them while iterating is safe)."""
        for state in states:
            for pid in list(self._members[state]):
                yield self.items[pid]

    @property
    def unfinished(self) -> int:
        return len(self.items) - self.count(*FINAL)
