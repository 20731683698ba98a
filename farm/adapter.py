"""The runtime adapter: one process-wide controller and ``try_execute_stack``, the seed's full-stack path.

A memory hit costs a signature, two dict lookups and the call: no synchronization, readback or retiming. A miss
tunes through :class:`RuntimeTrials` (fenced, exclusive, fresh inputs per trial). The live request then runs
ONCE (docs/contract.md, "Execution and invalidation").
"""

from __future__ import annotations

import functools
import gc
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from farm.arrays import OutputCheck, compare_outputs
from farm.engine import Request, StackTuner, Validation, tuning_scope
from farm.environment import runtime_environment
from farm.errors import TuneFailure
from farm.feedback import FleetReporter
from farm.identity import Candidate, OperationKey, Problem, Scope
from farm.interference import nvml_throttle_probe
from farm.policy import MemoryEviction, StackPolicy, Timing, Tolerance
from farm.runtimes.base import ComputeClient
from farm.stores.base import DecisionStore
from farm.tunable import Inputs, TunableSet

_global: StackTuner | None = None
_global_lock = threading.Lock()


def enable_stack_autotune(policy: StackPolicy, cache_directory: Path | str | None = None,
                          memory_eviction: MemoryEviction = MemoryEviction.FIFO,
                          fleet: Sequence[DecisionStore | str | Path] = (), fleet_write_through: bool = True,
                          report_to: str | None = None) -> StackTuner:
    """Install the process's controller, once, before worker threads start. A second call is INVALID_INPUT.

    The other arguments are :class:`StackTuner`'s; ``report_to``: a Redis URL (the write-only ``reporter``
    user) to report fleet misses and regressions to (farm.feedback; off by default)."""
    global _global
    with _global_lock:
        if _global is not None:
            raise TuneFailure.invalid("stack autotuning was already configured")
        tuner = StackTuner(policy, cache_directory, memory_eviction, fleet, fleet_write_through)
        if report_to is not None:
            tuner.feedback = FleetReporter(report_to)
        _global = tuner
        return tuner


def stack_autotuner() -> StackTuner | None:
    """The installed controller, or None. Querying never creates one, reads files or runs trials."""
    return _global


def stored_tiers(tuner: StackTuner) -> tuple[DecisionStore, ...]:
    """A controller's persistent tiers in lookup order, disk then fleet (for farm_triton: no trials)."""
    disk = tuner._disk  # the controller's own stores: read-only use, same package
    return ((disk,) if disk is not None else ()) + tuner._fleet


def _uninstall_for_tests() -> None:
    global _global
    with _global_lock:
        _global = None


def complete(client: ComputeClient) -> None:
    """The fence: flush then synchronize. A sync failure is DEVICE; a submission error after a clean fence is
    REJECTED (never demoted: a completion error never becomes a failed candidate followed by another launch)."""
    submitted: Exception | None = None
    try:
        client.flush()
    except Exception as e:
        submitted = e
    try:
        client.sync()
    except TuneFailure:
        raise
    except Exception as e:
        raise TuneFailure.device(f"autotune synchronization failed: {e}") from e
    if submitted is not None:
        raise TuneFailure.rejected(f"candidate submission failed after a successful completion fence: {submitted}") from submitted


class RuntimeTrials:
    """A :class:`~farm.runner.TrialRunner` over a tunable set on a real client, with both optional capabilities
    (``farm.runner``). ``indices`` maps the controller's candidate positions to the set's implementations."""

    def __init__(self, client: ComputeClient, tunable: TunableSet, inputs: Inputs, indices: Sequence[int],
                 timing: Timing) -> None:
        self.client = client
        self.tunable = tunable
        self.inputs = inputs
        self.indices = indices
        self.timing = timing
        self.last_check: OutputCheck | None = None
        self.device_seconds = 0.0  # every run on the device so far (validation, warm-ups, timed runs)
        self._expected: tuple[int, Any] | None = None  # the reference's output: computed once, compared many times
        # The rest is worked out on the first trial: a memory hit builds this runner and never runs one.

    @functools.cached_property
    def throttle_probe(self) -> Callable[[], bool] | None:
        """NVML's throttle probe of a CUDA client, or None (``farm.runner.ProbesThrottle``)."""
        return nvml_throttle_probe(self.client)

    @functools.cached_property
    def simulated(self) -> bool:
        """A simulated device (farm.replay): END_TO_END is its profile too; no context switch disturbs it."""
        return bool(getattr(self.client, "simulated", False))

    def _run(self, index: int, inputs: Inputs, fn: Callable[..., Any] | None = None) -> Any:
        fn = self.tunable[index].fn if fn is None else fn

        def call() -> Any:
            with self.client.activate():
                return fn(*inputs)

        try:
            if self.timing is Timing.DEVICE or self.simulated:
                out, elapsed = self.client.profile(call)
            else:
                start = time.perf_counter()
                out = call()
                elapsed = time.perf_counter() - start
        except TuneFailure:
            raise
        except Exception as e:
            complete(self.client)
            raise TuneFailure.rejected(f"candidate {self.tunable[index].name!r} raised {type(e).__name__}: {e}") from e
        complete(self.client)
        self.device_seconds += elapsed
        return out

    @property
    def compile_seconds(self) -> float:
        """Seconds the client spent compiling the configs it ran (a client that compiles says so; else 0)."""
        return float(getattr(self.client, "compile_seconds", 0.0))

    def _fresh_inputs(self) -> Inputs:  # on the client's stream: ordered before the candidate, fenced after
        with self.client.activate():
            return self.tunable.generate_inputs(self.inputs)

    def validate(self, reference: int, candidate: int, tolerance: Tolerance) -> Validation:
        """Compare a fresh run of ``candidate`` with the reference's output (computed once per runner) for the
        same inputs, regenerated from the same values each time."""
        b = self._fresh_inputs()
        a = self._fresh_inputs() if self._expected is None or self._expected[0] != reference else None
        complete(self.client)
        with self.client.activate():
            tolerance = self.tunable.tolerance_for(self.inputs, tolerance)
        with self.client.exclusive(), tuning_scope():
            if a is not None:
                self._expected = (reference, self._run(self.indices[reference], a))
            assert self._expected is not None
            check = compare_outputs(self._expected[1], self._run(self.indices[candidate], b), tolerance)
            # Readback can launch kernels too: fence before accepting a verdict or freeing trial state.
            complete(self.client)
        self.last_check = check
        if not check.supported:
            return Validation.UNSUPPORTED
        if check.problem is not None:
            raise TuneFailure.rejected(f"wrong output: {check.problem}")
        return Validation.PASSED

    def measure(self, candidate: int) -> float:
        inputs = self._fresh_inputs()
        complete(self.client)
        index = self.indices[candidate]
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            with self.client.exclusive(), tuning_scope():
                complete(self.client)
                before = self.device_seconds
                fn = self.tunable[index].fn  # a space config's function is built here, outside the timed call
                start = time.perf_counter()
                out = self._run(index, inputs, fn)
                if not (self.timing is Timing.DEVICE or self.simulated):  # END_TO_END: the fence is timed too
                    self.device_seconds = before + time.perf_counter() - start
                elapsed = self.device_seconds - before
                del out  # freed once the clock has stopped, inside the exclusive scope
        finally:
            if gc_was_enabled:
                gc.enable()
        return elapsed


class Prepared(NamedTuple):
    """What a workload needs on every call, computed once: the validated request and the candidate mapping."""

    request: Request
    indices: Sequence[int]
    fns: Sequence[Callable[..., Any]] | Mapping[int, Callable[..., Any]]  # by candidate position
    calls: list[int]  # item 0 counts this workload's calls: the fleet reporter's counter (farm.feedback)


def problem_for(name: str, device_id: str, client: ComputeClient, tunable: TunableSet, inputs: Inputs) -> Problem:
    """The problem ``try_execute_stack`` tunes: a name with "fusion" is a GRAPH; the operation is name + device
    kind + the set's checksum (a device class, never an index)."""
    env = runtime_environment(client)
    return Problem(scope=Scope.GRAPH if "fusion" in name else Scope.OPERATOR,
                   operation=OperationKey(name, device_id.partition(":")[0], tunable.checksum()).encode(),
                   environment=env.fingerprint, workload=tunable.stack_workload(inputs),
                   execution_context=env.execution_context, persistent=env.persistent)


def stack_request(name: str, device_id: str, client: ComputeClient, tunable: TunableSet,
                  inputs: Inputs) -> tuple[Problem, Sequence[Candidate], Sequence[int]]:
    """The problem, the candidate list (reference first, then every planned group) and the implementation index
    of each candidate: exactly what ``try_execute_stack`` tunes, so farm workers compute the same cache key.
    A set with spaces gives its lazy :class:`farm.roster.Roster` and the roster's lazy indices."""
    reference = tunable.stack_reference()
    if reference is None or not 0 <= reference < len(tunable):
        raise TuneFailure.invalid(f"{name}: no explicit reference was registered")
    problem = problem_for(name, device_id, client, tunable, inputs)
    if tunable.spaces:
        roster = tunable.roster()
        return problem, roster, roster.indices
    order = tunable.search_order()
    return problem, [tunable[i].candidate() for i in order], order


def prepare(tuner: StackTuner, name: str, device_id: str, client: ComputeClient, tunable: TunableSet, inputs: Inputs) -> Prepared:
    """Build (and memoize on the set, bounded) the request for this workload on this client."""
    memo = (tuner, name, device_id, client, tunable.generate_key(inputs))  # not id(): ids are reused
    found: Prepared | None = tunable.prepared.get(memo)
    if found is not None:
        return found
    problem, candidates, order = stack_request(name, device_id, client, tunable, inputs)
    request = tuner.request(problem, candidates, 0, device=client.device_id)
    if not tunable.nearest:  # the operation refuses borrowed decisions (farm.borrowing)
        request = request._replace(nearest=False)
    calls = [0, 0]
    if tuner.feedback is not None:  # once per workload, off the hit path: what a fleet report says this key is
        try:  # the workload spec of live inputs (the inverse of build); None: reported by signature
            spec = None if tunable.spec_from_inputs is None else tunable.spec_from_inputs(inputs)
        except Exception:
            spec = None
        tuner.feedback.describe(problem, request.key, name, client.device_kind, spec)
        counter = getattr(tuner.feedback, "counter", None)  # FleetReporter: this workload's calls, for weights
        if counter is not None:
            calls = counter(request.key)
    fns = _Functions(tunable, order) if tunable.spaces else tuple(tunable[i].fn for i in order)
    built = Prepared(request, order, fns, calls)
    with tunable.prepared_lock:
        if len(tunable.prepared) >= 4096:
            tunable.prepared.pop(next(iter(tunable.prepared)))
        tunable.prepared[memo] = built
    return built


def try_execute_stack(name: str, device_id: str, client: ComputeClient, tunable_set: TunableSet, inputs: Any) -> Any:
    """Select (tuning on a miss) and run the candidate for ``inputs`` once; return its output.

    Requires an installed controller (else UNAVAILABLE), an explicit reference and a workload signature (else
    INVALID_INPUT, before any execution). A live failure invalidates the decision, bans the candidate for this
    key, and re-raises the candidate's own exception.
    """
    tuner = _global
    if tuner is None:
        raise TuneFailure.unavailable(f"{name}: stack autotuning is not enabled")
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    prepared = prepare(tuner, name, device_id, client, tunable_set, args)
    prepared.calls[0] += 1  # the fleet's call count of this workload (weights): one list item, no lock
    runner = RuntimeTrials(client, tunable_set, args, prepared.indices, tuner.policy.timing)
    decision = tuner.select_request(prepared.request, runner)
    try:
        return prepared.fns[decision.index](*args)
    except Exception:
        tuner.invalidate(decision, True)
        raise


class _Functions(dict[int, Callable[..., Any]]):
    """The function of each candidate position of a set with spaces, built on first use (at most 256 kept)."""

    def __init__(self, tunable: TunableSet, indices: Sequence[int]) -> None:
        self._tunable, self._indices = tunable, indices

    def __missing__(self, position: int) -> Callable[..., Any]:
        if len(self) >= 256:
            self.clear()
        fn = self[position] = self._tunable[self._indices[position]].fn
        return fn
