"""The coordinator's problems as an explicit state machine.

Each problem of a run is in exactly one state; events (a lease taken or lost, a group result, a decision, a
confirmation, a publication, a timeout) move it along the allowed transitions below, in O(1) per event. The
board keeps each state's members as an insertion-ordered set, so upkeep visits only the problems in the states
it cares about (never every problem of the run).

::

    waiting ──lease──> queued ──first group sent──> running ──all groups back──> confirming ──> published
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
from typing import Any

from farm_coordinator.aggregate import Aggregate
from farm_coordinator.plan import Problem
from farm_fleet.errors import IllegalTransition


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


@dataclass
class Tracked:
    """A problem and what the coordinator knows about it now."""

    problem: Problem
    state: State = State.WAITING
    lease: str | None = None  # the lease value (holder#token) while this coordinator holds it
    round: str | None = None  # the round its group results live under
    confirmer: tuple[str, str] | None = None  # (worker id, incarnation) re-timing the winner
    sends: dict[str, int] = field(default_factory=dict)  # group -> times the coordinator sent it in this run
    lost: dict[str, int] = field(default_factory=dict)  # group -> times it started and never came back
    note: str = ""  # why it failed, or how it was published
    verdict: Aggregate | None = None  # its decision while the publication is pending (farm_coordinator.run)

    @property
    def pid(self) -> str:
        pid: str = self.problem.problem_id
        return pid


class Board:
    """The problems of a run by state. ``on_move(tracked, old, new)`` is called after each transition.

    A run adds problems as it takes them (:meth:`add`) and, with ``keep_final`` false, a problem leaves the board
    once it is final (published or failed): the board holds what the run works on, never every problem it ran.
    ``finished`` counts the problems that left."""

    def __init__(self, problems: list[Problem], on_move: Callable[[Tracked, State, State], Any] | None = None,
                 keep_final: bool = True) -> None:
        self.items: dict[str, Tracked] = {}
        self._members: dict[State, dict[str, None]] = {s: {} for s in State}
        self.on_move = on_move
        self.keep_final = keep_final
        self.finished = 0
        self.add(problems)

    def add(self, problems: list[Problem]) -> list[Tracked]:
        """Put problems on the board, waiting; a problem already on it is left as it is."""
        added = [Tracked(p) for p in problems if p.problem_id not in self.items]
        for t in added:
            self.items[t.pid] = t
            self._members[State.WAITING][t.pid] = None
        return added

    def __getitem__(self, pid: str) -> Tracked:
        return self.items[pid]

    def get(self, pid: str) -> Tracked | None:
        return self.items.get(pid)

    def move(self, pid: str, new: State, note: str = "") -> Tracked:
        tracked = self.items[pid]
        old = tracked.state
        if old is new:
            return tracked
        if new not in ALLOWED[old]:
            raise IllegalTransition(f"problem {pid}: {old.value} -> {new.value}")
        del self._members[old][pid]
        self._members[new][pid] = None
        tracked.state = new
        if note:
            tracked.note = note
        if new not in ACTIVE:
            tracked.lease = None
            tracked.verdict = None
        if new in FINAL and not self.keep_final:
            del self.items[pid], self._members[new][pid]
            self.finished += 1
        if self.on_move is not None:
            self.on_move(tracked, old, new)
        return tracked

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
