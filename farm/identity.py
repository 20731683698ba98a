"""Problem identity: what a decision is about, and the cache key that names it exactly."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from farm.errors import TuneFailure
from farm.policy import StackPolicy

KEY_VERSION = "farm-stack-key-v1"
MAX_CANDIDATES = 4096
MAX_NAME_BYTES = 4096
MAX_KEY_BYTES = 384 << 10
DEFAULT_CONTEXT = "isolated-single-device"


class Scope(enum.Enum):
    """The size of the unit being tuned: one operator, a fused graph, or a whole pipeline."""

    OPERATOR = "operator"
    GRAPH = "graph"
    PIPELINE = "pipeline"


@dataclass(frozen=True)
class Problem:
    """One exact tuning problem: an operation's workload on an environment, in an execution context.

    ``workload`` is exact (dtype, shape, strides, parameters), never bucketed. ``persistent`` permits the disk and
    fleet tiers; a session-only environment keeps decisions in memory only.
    """

    scope: Scope
    operation: str
    environment: str
    workload: str
    execution_context: str = DEFAULT_CONTEXT
    persistent: bool = False


@dataclass(frozen=True)
class Candidate:
    """One implementation as the controller sees it: its identity, not its code."""

    name: str
    revision: str = "1"
    workspace_bytes: int | None = None
    eligible: bool = True


def fields(parts: Iterable[str]) -> str:
    """Length-delimited encoding ``<len>:<text>`` per part, so ("ab", "c") and ("a", "bc") differ.

    The length counts UTF-8 bytes, so the encoding is unambiguous for any text.
    """
    return "".join(f"{len(p.encode())}:{p}" for p in parts)


def split_fields(text: str) -> list[str]:
    """Invert :func:`fields`. Raises ValueError for text that is not a length-delimited encoding."""
    data = text.encode()
    parts: list[str] = []
    at = 0
    while at < len(data):
        colon = data.index(b":", at)
        length = int(data[at:colon])
        start = colon + 1
        if length < 0 or start + length > len(data):
            raise ValueError(f"field at byte {at} runs past the end")
        parts.append(data[start : start + length].decode())
        at = start + length
    return parts


def key_environment(key: str) -> str:
    """The environment fingerprint inside a cache key made by :func:`cache_key`."""
    return split_fields(key)[3]


def manifest(candidates: Sequence[Candidate]) -> str:
    """The ordered candidate manifest: name, revision, workspace estimate and eligibility of each."""
    return fields(
        fields([c.name, c.revision, "-" if c.workspace_bytes is None else str(c.workspace_bytes), str(c.eligible)])
        for c in candidates
    )


def fits_workspace(candidate: Candidate, policy: StackPolicy) -> bool:
    """Whether the candidate's workspace fits the policy; an unknown estimate never fits an enabled limit."""
    if policy.workspace_limit is None:
        return True
    return candidate.workspace_bytes is not None and candidate.workspace_bytes <= policy.workspace_limit


def check_request(problem: Problem, candidates: Sequence[Candidate], reference: int, policy: StackPolicy) -> None:
    """Reject malformed selection input with INVALID_INPUT naming the field and value (selection step 1)."""
    if not isinstance(problem.scope, Scope):
        raise TuneFailure.invalid(f"problem.scope must be a Scope, got {problem.scope!r}")
    for name in ("operation", "environment", "workload", "execution_context"):
        value = getattr(problem, name)
        if not isinstance(value, str) or not value:
            raise TuneFailure.invalid(f"problem.{name} must be a non-empty string, got {value!r}")
    if not candidates:
        raise TuneFailure.invalid("candidates must not be empty")
    if len(candidates) > MAX_CANDIDATES:
        raise TuneFailure.invalid(f"candidates: {len(candidates)} exceeds the limit of {MAX_CANDIDATES}")
    if isinstance(reference, bool) or not isinstance(reference, int) or not 0 <= reference < len(candidates):
        raise TuneFailure.invalid(f"reference index {reference!r} is out of range for {len(candidates)} candidates")
    seen: set[str] = set()
    for i, c in enumerate(candidates):
        if not isinstance(c.name, str) or not c.name:
            raise TuneFailure.invalid(f"candidates[{i}].name must be a non-empty string, got {c.name!r}")
        if len(c.name.encode()) > MAX_NAME_BYTES:
            raise TuneFailure.invalid(f"candidates[{i}].name is longer than {MAX_NAME_BYTES} bytes")
        if c.name in seen:
            raise TuneFailure.invalid(f"candidates[{i}].name {c.name!r} is a duplicate")
        seen.add(c.name)
        if not isinstance(c.revision, str) or not c.revision:
            raise TuneFailure.invalid(f"candidates[{i}].revision must be a non-empty string, got {c.revision!r}")
        if c.workspace_bytes is not None and (not isinstance(c.workspace_bytes, int) or c.workspace_bytes < 0):
            raise TuneFailure.invalid(f"candidates[{i}].workspace_bytes must be None or >= 0, got {c.workspace_bytes!r}")
    ref = candidates[reference]
    if not ref.eligible:
        raise TuneFailure.invalid(f"reference {ref.name!r} is not eligible")
    if not fits_workspace(ref, policy):
        raise TuneFailure.invalid(
            f"reference {ref.name!r} workspace {ref.workspace_bytes!r} does not fit policy.workspace_limit "
            f"{policy.workspace_limit}"
        )


def cache_key(problem: Problem, candidates: Sequence[Candidate], reference: int, policy: StackPolicy) -> str:
    """The exact key of a decision: every field that can make a stored decision wrong or stale.

    Raises INVALID_INPUT for malformed input or a key above 384 KiB.
    """
    check_request(problem, candidates, reference, policy)
    key = fields(
        [
            KEY_VERSION,
            problem.scope.value,
            problem.operation,
            problem.environment,
            problem.workload,
            problem.execution_context,
            str(reference),
            manifest(candidates),
            policy.accuracy_key(),
        ]
    )
    if len(key.encode()) > MAX_KEY_BYTES:
        raise TuneFailure.invalid(f"cache key is {len(key.encode())} bytes, above the limit of {MAX_KEY_BYTES}")
    return key
