"""What crosses the wire between coordinator and workers: JSON messages with a schema version.

A :class:`GroupTask` asks a worker to run ONE priority group of ONE problem on its device, naming its candidates
(name and revision) and the budget the group may spend; a :class:`GroupResult` brings back, per candidate, its
name, revision, position in the cache key's candidate list, typed verdict (``farm.trials.TrialVerdict``), note,
timing pairs and observed errors, plus the seconds charged to the budget and provenance. Both are frozen
dataclasses with ``to_dict``/``from_dict``: plain JSON, never a binary object format. Version 2 replaced
implementation indices by candidate names and verdict-prefixed notes by a verdict and a note.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from farm.decisions import canonical_json
from farm.errors import ProtocolError
from farm.identity import fields
from farm.trials import Outcome

__all__ = [
    "COMPILE_NODE", "COMPILE_QUEUE", "COMPILE_TASK", "GROUP_TASK", "PING_TASK", "PROTOCOL_VERSION", "REFERENCE_GROUP", "STATUS_FAILED", "STATUS_NOT_TRIED", "STATUS_OK",
    "SET_DIFFERS", "STATUS_VALIDATION_UNAVAILABLE", "GroupKey", "GroupResult", "GroupTask", "ProtocolError", "problem_id",
]

PROTOCOL_VERSION = 2
GROUP_TASK = "farm.run_groups"
PING_TASK = "farm.ping"
# The fleet's compile queue (``farm worker --compile`` serves it, ``farm_coordinator.compilefleet`` sends to it).
COMPILE_TASK = "farm.compile_kernels"
COMPILE_QUEUE = "farm.compile"
COMPILE_NODE = "compile@"  # the node name prefix of a compile worker
REFERENCE_GROUP = "reference"


def problem_id(fingerprint_digest: str, operation: str, device_kind: str, checksum: str, spec: dict[str, Any], accuracy: str) -> str:
    """A stable id for (fingerprint, operation, workload spec, candidate set, accuracy settings)."""
    text = fields([fingerprint_digest, operation, device_kind, checksum, canonical_json(spec), accuracy])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class GroupKey:
    """Which group of which problem of which run: what a group's result, attempts, start mark and run claim are
    stored under, and how the coordinator tracks what it sent. ``str(key)`` is its form in Redis key names
    (``run:problem:group``), and :meth:`parse` reads it back: a run id (``--run``) may hold colons, problem ids
    and group names do not."""

    run: str
    problem_id: str
    group: str

    @classmethod
    def of(cls, message: Mapping[str, Any]) -> GroupKey:
        """The key a group task or result message names (KeyError for a message without one)."""
        return cls(str(message["run"]), str(message["problem_id"]), str(message["group"]))

    @classmethod
    def parse(cls, text: str) -> GroupKey | None:
        """The key whose :func:`str` is ``text``, or None when ``text`` is not one."""
        parts = text.rsplit(":", 2)
        return cls(parts[0], parts[1], parts[2]) if len(parts) == 3 else None

    def __str__(self) -> str:
        return f"{self.run}:{self.problem_id}:{self.group}"


def _require(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in data:
        raise ProtocolError(f"message field {name!r} is missing")
    value = data[name]
    if not isinstance(value, kind):
        raise ProtocolError(f"message field {name!r} = {value!r} has the wrong type")
    return value


_Owner = TypeVar("_Owner")  # the class a from_dict builds
_Parsed = TypeVar("_Parsed")  # what it returns


def _malformed(what: str) -> Callable[[Callable[[_Owner, Any], _Parsed]], Callable[[_Owner, Any], _Parsed]]:
    """A ``from_dict`` whose every failure on a malformed message is a ProtocolError (found by tests/test_fuzz.py)."""

    def wrap(parse: Callable[[_Owner, Any], _Parsed]) -> Callable[[_Owner, Any], _Parsed]:
        @functools.wraps(parse)
        def checked(cls: _Owner, data: Any) -> _Parsed:
            try:
                return parse(cls, data)
            except ProtocolError:
                raise
            except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError, RecursionError) as e:
                raise ProtocolError(f"malformed {what}: {type(e).__name__}: {e}") from e

        return checked

    return wrap


def _check_version(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError(f"message is a {type(data).__name__}, not an object")
    if data.get("protocol") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {data.get('protocol')!r} != {PROTOCOL_VERSION}")
    return data


def _candidate(entry: Any) -> tuple[str, str]:
    if not isinstance(entry, dict):
        raise ProtocolError(f"message field 'candidates' holds {entry!r}, not an object")
    return (_require(entry, "name", str), _require(entry, "revision", str))


def _parts(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ProtocolError(f"expects must map part names to strings, got {value!r}")
    return dict(value)


def _budget(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"message field 'budget' = {value!r} has the wrong type")
    return float(value)


@dataclass(frozen=True)
class GroupTask:
    """Run the reference and ``candidates`` ((name, revision) of implementations of the operation's tunable set
    for ``device_kind``) on one device of fingerprint ``fingerprint``. ``group`` names the group in results.
    ``budget``: the seconds this group may spend (None: the policy's whole budget, charging the reference's timing
    like the first search of a problem; a number: what the problem's earlier groups left, see ``farm.search``).
    ``incumbent`` (name, revision): a race's group (``screening = "race"``, ``farm_workers.racing``): each config is
    validated against the reference, then paired against the incumbent on this device; ``noise``: the relative
    excesses of the reference's and the incumbent's runs the coordinator has seen (``farm.racing.excesses``).
    ``expects``: the coordinator's tunable set, part by part (``TunableSet.parts``); a worker whose set differs
    refuses the task, naming what differs (None: a coordinator that predates the check)."""

    run: str
    problem_id: str
    group: str
    operation: str
    device_kind: str
    spec: dict[str, Any]
    candidates: tuple[tuple[str, str], ...]
    policy: dict[str, Any]
    fingerprint: str
    kernels: tuple[str, ...] = ()
    confirm_of: str | None = None
    budget: float | None = None
    incumbent: tuple[str, str] | None = None
    noise: tuple[float, ...] = ()
    expects: dict[str, str] | None = None

    @property
    def key(self) -> GroupKey:
        return GroupKey(self.run, self.problem_id, self.group)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.candidates)

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "run": self.run,
            "problem_id": self.problem_id,
            "group": self.group,
            "operation": self.operation,
            "device_kind": self.device_kind,
            "spec": self.spec,
            "candidates": [{"name": n, "revision": r} for n, r in self.candidates],
            "policy": self.policy,
            "fingerprint": self.fingerprint,
            "kernels": list(self.kernels),
            "confirm_of": self.confirm_of,
            "budget": self.budget,
            **({"incumbent": {"name": self.incumbent[0], "revision": self.incumbent[1]},
                "noise": list(self.noise)} if self.incumbent is not None else {}),
            **({"expects": dict(self.expects)} if self.expects is not None else {}),
        }

    @classmethod
    @_malformed("group task")
    def from_dict(cls, data: Any) -> GroupTask:
        d = _check_version(data)
        return cls(
            run=_require(d, "run", str),
            problem_id=_require(d, "problem_id", str),
            group=_require(d, "group", str),
            operation=_require(d, "operation", str),
            device_kind=_require(d, "device_kind", str),
            spec=_require(d, "spec", dict),
            candidates=tuple(_candidate(c) for c in _require(d, "candidates", list)),
            policy=_require(d, "policy", dict),
            fingerprint=_require(d, "fingerprint", str),
            kernels=tuple(str(k) for k in d.get("kernels", [])),
            confirm_of=d.get("confirm_of"),
            budget=_budget(d.get("budget")),
            incumbent=_candidate(d["incumbent"]) if d.get("incumbent") is not None else None,
            noise=tuple(_seconds(x, "noise") for x in d.get("noise", [])),
            expects=_parts(d["expects"]) if d.get("expects") is not None else None,
        )


STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUS_VALIDATION_UNAVAILABLE = "validation_unavailable"
STATUS_NOT_TRIED = "not_tried"  # made by the coordinator, never sent: the budget ran out before the group's turn


@dataclass(frozen=True)
class GroupResult:
    """The trials of one group. ``status`` ok: ``outcomes`` hold every candidate of the group; failed: ``error``
    says why (the reference failed, attempts exhausted, time limit, device failure). ``names`` is the cache key's
    candidate list (an outcome's ``index`` points into it). ``search_seconds`` is what the group charged to the
    problem's budget; ``budget_exhausted`` says the budget stopped it. ``device_seconds``: what the group's runs took
    on the device (validation, warm-ups, timed runs; ``farm.runner.runner_cost``), the search's cost; 0 from a
    worker that predates it. ``incumbent``: a race's group (its task's incumbent): the outcomes' pairs are
    (incumbent seconds, config seconds), a config decided slower has verdict ``dropped``, and ``standings`` says
    of each other timed config ``promoted`` (decided faster) or ``contender`` (still close)."""

    run: str
    problem_id: str
    group: str
    status: str
    cache_key: str | None = None
    reference_index: int | None = None
    names: tuple[str, ...] = ()
    reference_times: tuple[float, ...] = ()
    outcomes: tuple[Outcome, ...] = ()
    error: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    trial_seconds: float = 0.0
    search_seconds: float = 0.0
    budget_exhausted: bool = False
    device_seconds: float = 0.0
    incumbent: str | None = None
    standings: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> GroupKey:
        return GroupKey(self.run, self.problem_id, self.group)

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "run": self.run,
            "problem_id": self.problem_id,
            "group": self.group,
            "status": self.status,
            "cache_key": self.cache_key,
            "reference_index": self.reference_index,
            "names": list(self.names),
            "reference_times": list(self.reference_times),
            "outcomes": [o.to_dict() for o in self.outcomes],
            "error": self.error,
            "provenance": self.provenance,
            "trial_seconds": self.trial_seconds,
            "search_seconds": self.search_seconds,
            "budget_exhausted": self.budget_exhausted,
            "device_seconds": self.device_seconds,
            **({"incumbent": self.incumbent, "standings": dict(self.standings)} if self.incumbent is not None else {}),
        }

    @classmethod
    @_malformed("group result")
    def from_dict(cls, data: Any) -> GroupResult:
        d = _check_version(data)
        return cls(
            run=_require(d, "run", str),
            problem_id=_require(d, "problem_id", str),
            group=_require(d, "group", str),
            status=_require(d, "status", str),
            cache_key=d.get("cache_key"),
            reference_index=d.get("reference_index"),
            names=tuple(d.get("names", [])),
            reference_times=tuple(float(t) for t in d.get("reference_times", [])),
            outcomes=_outcomes(d.get("outcomes", [])),
            error=d.get("error"),
            provenance=dict(d.get("provenance", {})),
            trial_seconds=float(d.get("trial_seconds", 0.0)),
            search_seconds=float(d.get("search_seconds", 0.0)),
            budget_exhausted=bool(d.get("budget_exhausted", False)),
            device_seconds=_seconds(d.get("device_seconds", 0.0), "device_seconds"),
            incumbent=_optional_str(d.get("incumbent"), "incumbent"),
            standings={str(k): str(v) for k, v in d.get("standings", {}).items()},
        )

    @classmethod
    def failed(cls, task: GroupTask, error: str, provenance: dict[str, Any] | None = None) -> GroupResult:
        return cls(task.run, task.problem_id, task.group, STATUS_FAILED, error=error, provenance=provenance or {})

    @classmethod
    def not_tried(cls, task: GroupTask, error: str) -> GroupResult:
        """The coordinator's result for a group it did not send because the problem's budget was spent."""
        return cls(task.run, task.problem_id, task.group, STATUS_NOT_TRIED, error=error, budget_exhausted=True)


SET_DIFFERS = "set differs: "
"""How a worker's refusal of a task whose set differs from the coordinator's begins (``set_difference``)."""


def set_difference(operation: str, worker: str, here: Mapping[str, str], expected: Mapping[str, str]) -> str | None:
    """Why ``worker``'s set of ``operation`` (``here``, ``TunableSet.parts``) is not the coordinator's
    (``expected``): one error naming the operation and each part that differs; None when they agree. A worker
    left on an old version of a module would publish under the old set (its own cache key), so it refuses."""
    if dict(here) == dict(expected):
        return None
    differs = []
    for part in sorted(set(here) | set(expected), key=lambda p: (p.split(" ", 1)[-1], p)):
        mine, theirs = here.get(part), expected.get(part)
        if mine == theirs:
            continue
        kind, _, name = part.partition(" ")
        what = f"{kind} {name!r}" if name else kind
        if mine is None:
            differs.append(f"{what} only on the coordinator")
        elif theirs is None:
            differs.append(f"{what} only on this worker")
        elif kind == "values":
            differs.append(f"space {name!r} values {_lists(mine, theirs)} here, {_lists(theirs, mine)} on the "
                           f"coordinator")
        elif kind == "reference":
            differs.append(f"reference {mine!r} here, {theirs!r} on the coordinator")
        else:
            differs.append(f"{what} code or options differ")
    return (f"{SET_DIFFERS}{operation} on worker {worker} differs from the coordinator's ({'; '.join(differs)}): "
            f"restart the worker with the coordinator's version of the module (--kernels)")


def _lists(descriptor: str, other: str) -> str:
    """``descriptor`` without the tail it shares with ``other`` after its value lists (the same restrictions)."""
    same = 0
    while same < min(len(descriptor), len(other)) and descriptor[-1 - same] == other[-1 - same]:
        same += 1
    tail = descriptor[len(descriptor) - same:]
    cut = tail.find("]")
    return descriptor if cut < 0 else descriptor[:len(descriptor) - same + cut + 1]


def _optional_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"message field {name!r} = {value!r} has the wrong type")
    return value


def _seconds(value: Any, name: str) -> float:
    """A count of seconds: a finite number >= 0 (ProtocolError naming the field otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"message field {name!r} = {value!r} has the wrong type")
    seconds = float(value) if abs(value) < 1e300 else math.inf  # a huge int: not a float, and never seconds
    if not math.isfinite(seconds) or seconds < 0:
        raise ProtocolError(f"message field {name!r} = {value!r} is not a finite number of seconds >= 0")
    return seconds


def _outcomes(raw: Any) -> tuple[Outcome, ...]:
    if not isinstance(raw, list):
        raise ProtocolError(f"message field 'outcomes' = {raw!r} has the wrong type")
    try:
        return tuple(Outcome.from_dict(o) for o in raw)
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"message field 'outcomes' holds a malformed outcome: {e!r}") from e
