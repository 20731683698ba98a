"""Tunable sets: an operation's candidates, its reference, and how to describe and rebuild its inputs.

Inputs are a tuple of positional arguments; each candidate is called as ``fn(*inputs)`` and returns an array
or a tuple of arrays (README.md, "Using the controller in an application", declares and calls a set).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import threading
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar, overload

from farm.arrays import array_key, array_signature, clone
from farm.codetext import code_text
from farm.errors import TuneFailure
from farm.identity import Candidate, fields
from farm.policy import Tolerance
from farm.restrict import Value
from farm.roster import Roster, Segment
from farm.space import Restriction, Space

Inputs = tuple[Any, ...]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Implementation:
    """One candidate implementation. ``identity`` adds code the Python source does not show: a CUDA source,
    compile options, a launch configuration. It is part of the set's checksum, hence of the cache key."""

    name: str
    fn: Callable[..., Any]
    revision: str = "1"
    group: int = 0
    workspace_bytes: int | None = None
    eligible: bool = True
    identity: str = ""

    def candidate(self) -> Candidate:
        return Candidate(self.name, self.revision, self.workspace_bytes, self.eligible)

    def code_identity(self) -> str:
        return fields([code_text(self.fn), self.identity])


class TunableSet:
    """An operation's candidates with an explicit reference.

    - ``signature(*inputs) -> str``: the exact workload (dtype, shape, strides, parameters); required.
    - ``generate(*inputs) -> Inputs``: fresh, isolated inputs for a trial (default: layout-preserving copies of
      every array), so trials never share writable buffers with each other or with the live request.
    - ``key(*inputs) -> Hashable``: the memo key of a workload; it must separate every pair of inputs the
      signature separates (default: the signature, or a cheaper equivalent for ``array_signature``).
    - ``tolerance(*inputs) -> Tolerance | None``: a per-workload tolerance (e.g. by dtype) that replaces the
      policy's for validation; its source is part of the checksum.
    - ``nearest``: False: a miss never borrows another workload's decision (farm.nearest)."""

    def __init__(self, name: str, *, signature: Callable[..., str] | None,
                 generate: Callable[..., Inputs] | None = None, key: Callable[..., Hashable] | None = None,
                 tolerance: Callable[..., Tolerance | None] | None = None, nearest: bool = True) -> None:
        if not isinstance(name, str) or not name:
            raise TuneFailure.invalid(f"tunable set name must be a non-empty string, got {name!r}")
        if not isinstance(nearest, bool):
            raise TuneFailure.invalid(f"{name}: nearest must be a bool, got {nearest!r}")
        self.name, self.nearest = name, nearest
        self._signature, self._generate, self._key, self._tolerance = signature, generate, key, tolerance
        self._impls: list[Implementation] = []
        self._spaces: list[Space] = []
        self._reference: int | None = None
        self._checksum: str | None = None
        self.prepared: dict[Hashable, Any] = {}  # farm.adapter.Prepared by workload (it imports this module)
        self.prepared_lock = threading.Lock()
        # inputs -> workload spec (set by farm_kernels.Operation): farm.feedback reports a miss with it
        self.spec_from_inputs: Callable[[Inputs], dict[str, Any] | None] | None = None

    def add(self, fn: Callable[..., Any], *, name: str | None = None, revision: str = "1", group: int = 0,
            workspace_bytes: int | None = None, eligible: bool = True, identity: str = "",
            reference: bool = False) -> Implementation:
        """Register a candidate (or the reference). Raises INVALID_INPUT for a duplicate name or second reference."""
        impl_name = name or getattr(fn, "__name__", "")
        if not impl_name:
            raise TuneFailure.invalid(f"{self.name}: a candidate needs a name")
        if any(i.name == impl_name for i in self._impls):
            raise TuneFailure.invalid(f"{self.name}: candidate name {impl_name!r} is a duplicate")
        if reference and self._reference is not None:
            was = self._impls[self._reference].name
            raise TuneFailure.invalid(f"{self.name}: reference is already {was!r}, cannot add {impl_name!r}")
        self._check_group(f"candidate {impl_name!r}", group)
        impl = Implementation(impl_name, fn, revision, group, workspace_bytes, eligible, identity)
        self._impls.append(impl)
        if reference:
            self._reference = len(self._impls) - 1
        self._changed()
        return impl

    def _check_group(self, what: str, group: object) -> None:
        if isinstance(group, bool) or not isinstance(group, int):
            raise TuneFailure.invalid(f"{self.name}: {what} group must be an integer, got {group!r}")

    def _changed(self) -> None:
        self._checksum = None
        with self.prepared_lock:
            self.prepared.clear()

    @overload
    def candidate(self, fn: F) -> F: ...

    @overload
    def candidate(self, fn: None = None, **options: Any) -> Callable[[F], F]: ...

    def candidate(self, fn: Any = None, **options: Any) -> Any:
        """Decorator: ``@set.candidate`` or ``@set.candidate(group=1, revision="2")``."""
        def register(f: F) -> F:
            self.add(f, **options)
            return f

        return register(fn) if fn is not None else register

    def space(self, *, name: str | None = None, group: int = 0, revision: str = "1",
              workspace_bytes: int | None = None, eligible: bool = True, identity: str = "",
              restrict: Restriction | list[Restriction] | None = None,
              **params: list[Value] | tuple[Value, ...]) -> Callable[[F], F]:
        """Decorator registering a tuning space: ``@set.space(group=0, block=[16, 32], restrict="block <= 32")``.
        Each config is a candidate named ``fn[block=16]``, called as ``fn(*inputs, **config)`` (farm.space).
        Raises INVALID_INPUT for a bad parameter list or restriction, or a name clash."""
        def register(f: F) -> F:
            self.add_space(Space(name or str(getattr(f, "__name__", "")), f, params, restrict, revision=revision,
                                 group=group, workspace_bytes=workspace_bytes, eligible=eligible, identity=identity))
            return f

        return register

    def add_space(self, space: Space) -> Space:
        """Register a :class:`Space` (what :meth:`space` does)."""
        self._check_group(f"space {space.name!r}", space.group)
        if any(i.name == space.name for i in self._impls) or any(s.name == space.name for s in self._spaces):
            raise TuneFailure.invalid(f"{self.name}: space name {space.name!r} is a duplicate")
        self._spaces.append(space)
        self._changed()
        return space

    @property
    def spaces(self) -> tuple[Space, ...]:
        return tuple(self._spaces)

    def roster(self) -> Roster:
        """The controller's candidate list, lazily: the reference, then each group's eligible plain candidates and
        spaces (farm.roster). For a set without spaces it lists exactly :meth:`search_order`."""
        reference = self._required_reference()
        segments = [Segment(0, 1, reference)]
        for index, space in itertools.chain.from_iterable(self._grouped()):
            if space is not None or index != reference:
                size = 1 if space is None else space.size
                segments.append(Segment(segments[-1].start + segments[-1].size, size, index, space))
        return Roster(segments, self.__getitem__, self.checksum())

    def _required_reference(self) -> int:
        if self._reference is None:
            raise TuneFailure.invalid(f"{self.name}: no explicit reference was registered")
        return self._reference

    def _space_bases(self) -> list[int]:  # the set index of each space's rank 0
        return list(itertools.accumulate((s.size for s in self._spaces), initial=len(self._impls)))[:-1]

    def _grouped(self) -> Iterator[list[tuple[int, Space | None]]]:
        """Per priority group, lowest first: its eligible plain candidates (set index, None), then its
        eligible spaces (set index of rank 0, space), each in registration order."""
        bases = self._space_bases()
        for group in sorted({i.group for i in self._impls} | {s.group for s in self._spaces}):
            plain = [(n, None) for n, impl in enumerate(self._impls) if impl.group == group and impl.eligible]
            spaced = zip(bases, self._spaces, strict=True)
            yield [*plain, *((b, s) for b, s in spaced if s.group == group and s.eligible)]

    def reference(self, fn: Any = None, **options: Any) -> Any:
        """Decorator registering the reference (the trusted implementation every candidate is checked against)."""
        return self.candidate(fn, **{**options, "reference": True})

    def __len__(self) -> int:
        """Plain candidates plus every config of every space (a space's configs follow the plain ones)."""
        return len(self._impls) + sum(s.size for s in self._spaces)

    def __getitem__(self, index: int) -> Implementation:
        """The implementation at ``index``; a space config's is built on demand, the config as keywords."""
        if index < len(self._impls) or not self._spaces:
            return self._impls[index]
        for space, base in zip(self._spaces, self._space_bases(), strict=True):
            if base <= index < base + space.size:
                config = space.config(index - base)
                return Implementation(space.config_name(config), functools.partial(space.fn, **config),
                                      space.revision, space.group, space.workspace_bytes,
                                      space.eligible and space.feasible(config), space.identity)
        raise IndexError(f"{self.name}: candidate index {index} is out of range")

    @property
    def implementations(self) -> tuple[Implementation, ...]:
        return tuple(self._impls)

    def stack_reference(self) -> int | None:
        return self._reference

    def has_signature(self) -> bool:
        return self._signature is not None

    def stack_workload(self, inputs: Inputs) -> str:
        """The exact workload signature; INVALID_INPUT when the set has none or it is empty."""
        if self._signature is None:
            raise TuneFailure.invalid(f"{self.name}: no exact workload signature was registered")
        try:
            workload = self._signature(*inputs)
        except TypeError as e:  # an argument the signature cannot describe exactly
            raise TuneFailure.invalid(f"{self.name}: workload signature failed: {e}") from e
        if not isinstance(workload, str) or not workload:
            raise TuneFailure.invalid(f"{self.name}: workload signature must be a non-empty string, got {workload!r}")
        return workload

    def generate_key(self, inputs: Inputs) -> Hashable:
        if self._key is not None:
            return self._key(*inputs)
        if self._signature is array_signature:
            return array_key(*inputs)  # same partition as the signature, ten times cheaper
        return self.stack_workload(inputs)

    def generate_inputs(self, inputs: Inputs) -> Inputs:
        return tuple(self._generate(*inputs) if self._generate is not None else clone(list(inputs)))

    def tolerance_for(self, inputs: Inputs, default: Tolerance) -> Tolerance:
        """The set's tolerance for this workload, with the policy's ``max_bytes``; else the policy's."""
        own = self._tolerance(*inputs) if self._tolerance is not None else None
        return default if own is None else replace(own, max_bytes=default.max_bytes)

    def plan(self) -> Iterator[list[int]]:
        """Every eligible priority group, lowest first, each space's feasible configs listed one by one (the
        farm planner's full list; an in-process search walks :meth:`roster` lazily instead)."""
        for members in self._grouped():
            batch: list[int] = []
            for index, space in members:
                batch.extend([index] if space is None else (index + rank for rank in space.feasible_ranks()))
            if batch:
                yield batch

    def search_order(self) -> list[int]:
        """The reference first, then every planned candidate once (what ``try_execute_stack`` tunes)."""
        order = [self._required_reference()]
        for batch in self.plan():
            order.extend(i for i in batch if i not in order)
        return order

    def checksum(self) -> str:
        """sha256 over the manifest and each candidate's code; any change to either changes the cache key."""
        if self._checksum is None:
            parts = [self.name, str(self._reference)]
            parts.extend(fields([impl.name, *_impl_fields(impl)]) for impl in self._impls)
            if self._tolerance is not None:
                parts.append(code_text(self._tolerance))
            # A space's value lists are in the cache key's manifest, not here: a grown space keeps the operation.
            parts.extend(fields(["space", *_space_fields(s)]) for s in self._spaces)
            self._checksum = hashlib.sha256(fields(parts).encode()).hexdigest()
        return self._checksum

    def parts(self) -> dict[str, str]:
        """What :meth:`checksum` and a space's descriptor cover, part by part, so two processes can say which
        part of a set differs: ``reference``, ``candidate NAME``, ``space NAME`` (digests of the manifest
        entry and code), ``values NAME`` (a space's descriptor), ``tolerance``."""
        def digest(text: str) -> str:
            return hashlib.sha256(text.encode()).hexdigest()[:16]

        found = {"reference": self._impls[self._reference].name if self._reference is not None else ""}
        for impl in self._impls:
            found[f"candidate {impl.name}"] = digest(fields(_impl_fields(impl)))
        for s in self._spaces:
            found[f"space {s.name}"] = digest(fields(_space_fields(s)))
            found[f"values {s.name}"] = s.descriptor()
        if self._tolerance is not None:
            found["tolerance"] = digest(code_text(self._tolerance))
        return found


def _impl_fields(impl: Implementation) -> list[str]:
    code = impl.code_identity()
    return [impl.revision, str(impl.group), str(impl.workspace_bytes), str(impl.eligible), code]


def _space_fields(space: Space) -> list[str]:
    return [str(space.group), str(space.workspace_bytes), str(space.eligible), space.family()]
