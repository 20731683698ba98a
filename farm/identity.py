"""Problem identity: what a decision is about, and the cache key that names it exactly."""

from __future__ import annotations

import enum
import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from farm.encoding import fields, split_fields
from farm.errors import TuneFailure
from farm.policy import AccuracyKey, StackPolicy

__all__ = [
    "DEFAULT_CONTEXT", "KEY_VERSION", "MAX_CANDIDATES", "MAX_KEY_BYTES", "MAX_NAME_BYTES", "CacheKey", "Candidate",
    "OperationKey", "Problem", "Scope", "cache_key", "check_request", "fields", "fits_workspace",
    "key_environment", "manifest", "split_fields",
]

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
    ``workload`` is exact (dtype, shape, strides, parameters), never bucketed; ``persistent`` permits the disk
    and fleet tiers."""

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


def manifest(candidates: Sequence[Candidate]) -> str:
    """The ordered candidate manifest: name, revision, workspace estimate and eligibility of each."""
    return fields(fields([c.name, c.revision, "-" if c.workspace_bytes is None else str(c.workspace_bytes),
                          str(c.eligible)]) for c in candidates)


def decode_manifest(text: str) -> tuple[Candidate, ...]:
    """The candidates of an encoded manifest (:func:`manifest`); ValueError for a malformed one."""
    candidates = []
    for entry in split_fields(text):
        parts = split_fields(entry)
        if len(parts) != 4 or parts[3] not in ("True", "False"):
            raise ValueError(f"manifest entry {entry!r} is not (name, revision, workspace, eligible)")
        workspace = None if parts[2] == "-" else int(parts[2])
        candidates.append(Candidate(parts[0], parts[1], workspace, parts[3] == "True"))
    return tuple(candidates)


@dataclass(frozen=True)
class CacheKey:
    """A decision's cache key with named parts. :meth:`encode` gives the stored text (length-delimited fields in
    this order, byte-identical to every key written so far); :meth:`decode` reads it back. Nothing else in the
    farm splits a key: read a part by name, change one with :meth:`replace`."""

    scope: str
    operation: str
    environment: str
    workload: str
    execution_context: str
    reference: int
    candidates: tuple[Candidate, ...]
    accuracy: AccuracyKey
    version: str = KEY_VERSION

    @classmethod
    def of(cls, problem: Problem, candidates: Sequence[Candidate], reference: int, policy: StackPolicy) -> CacheKey:
        return cls(problem.scope.value, problem.operation, problem.environment, problem.workload,
                   problem.execution_context, reference, tuple(candidates), AccuracyKey.of(policy))

    def encode(self) -> str:
        return fields([self.version, self.scope, self.operation, self.environment, self.workload,
                       self.execution_context, str(self.reference), manifest(self.candidates),
                       self.accuracy.encode()])

    @classmethod
    def decode(cls, text: str) -> CacheKey:
        """Read an encoded key; ValueError says which part is malformed (any key version is read, so a caller
        can refuse other versions with its own message)."""
        parts = split_fields(text)
        if len(parts) != 9:
            raise ValueError(f"cache key has {len(parts)} parts, expected 9")
        version, scope, operation, environment, workload, context, reference, entries, accuracy = parts
        if not reference.isdigit():
            raise ValueError(f"cache key reference {reference!r} is not an index")
        key = cls(scope, operation, environment, workload, context, int(reference),
                  decode_manifest(entries), AccuracyKey.decode(accuracy), version)
        if key.encode() != text:
            raise ValueError("cache key is not in canonical form")
        return key

    def replace(self, **changes: object) -> CacheKey:
        """A copy with the named parts changed (e.g. ``environment=`` to move a decision to another fingerprint)."""
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def names(self) -> tuple[str, ...]:
        """The candidate names in key order (the decision's ``index`` points into them)."""
        return tuple(c.name for c in self.candidates)


@dataclass(frozen=True)
class OperationKey:
    """The operation part of a runtime adapter's problem: the operation's name, the device kind and the candidate
    set's checksum (a device class, never an index). Other callers may use any non-empty operation text."""

    name: str
    device_kind: str
    checksum: str

    def encode(self) -> str:
        return fields([self.name, self.device_kind, self.checksum])

    @classmethod
    def decode(cls, text: str) -> OperationKey | None:
        """The parts of an adapter's operation text, or None for operation text of another form."""
        try:
            parts = split_fields(text)
        except ValueError:
            return None
        return cls(*parts) if len(parts) == 3 and all(parts) else None


@functools.lru_cache(maxsize=4096)  # callers without the environment at hand ask it per lookup
def key_environment(key: str) -> str:
    """The environment fingerprint inside an encoded cache key."""
    return CacheKey.decode(key).environment


def fits_workspace(candidate: Candidate, policy: StackPolicy) -> bool:
    """Whether the candidate's workspace fits the policy; an unknown estimate never fits an enabled limit."""
    limit = policy.workspace_limit
    return limit is None or (candidate.workspace_bytes is not None and candidate.workspace_bytes <= limit)


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
        raise TuneFailure.invalid(f"reference {ref.name!r} workspace {ref.workspace_bytes!r} does not fit "
                                  f"policy.workspace_limit {policy.workspace_limit}")


def cache_key(problem: Problem, candidates: Sequence[Candidate], reference: int, policy: StackPolicy) -> str:
    """The exact key of a decision: every field that can make a stored decision wrong or stale. Raises
    INVALID_INPUT for malformed input or a key above 384 KiB. A farm.roster.Roster is keyed by its
    ``key_entries`` (a space by its descriptor)."""
    listed: Sequence[Candidate] = getattr(candidates, "key_entries", candidates)
    check_request(problem, listed, reference, policy)
    key = CacheKey.of(problem, listed, reference, policy).encode()
    if len(key.encode()) > MAX_KEY_BYTES:
        raise TuneFailure.invalid(f"cache key is {len(key.encode())} bytes, above the limit of {MAX_KEY_BYTES}")
    return key
