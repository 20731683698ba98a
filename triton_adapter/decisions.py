"""The application side: find the farm's decision for a launch, without running anything.

:func:`configure` says where decisions are (the disk cache a farm publishes to, fleet tiers: Redis URLs or archive
directories) and where misses go (``report_to``, the fleet's feedback stream). A lookup computes the cache key the
farm's workers computed (the same operation identity, environment fingerprint, workload and candidates) and reads
the tiers in order; the farm validated its decision on this SKU, so a hit is served as it is: no trial, no
benchmark. Each (kernel, key) is looked up once per process: Triton's autotuner caches what it was given.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Container, Mapping, Sequence
from pathlib import Path
from typing import Any

from farm.adapter import stack_autotuner, stored_tiers
from farm.decisions import DecisionRecord, refusal
from farm.engine import StackTuner
from farm.environment import RuntimeEnvironment, runtime_environment
from farm.feedback import FleetReporter
from farm.identity import Candidate, OperationKey, Problem, Scope, cache_key
from farm.policy import Mode, StackPolicy
from farm.runtimes import ComputeClient, client_for
from farm.stores import DecisionStore, LocalStore, open_fleet_source
from farm.stores.base import read_record
from farm_triton import identity
from farm_triton.deps import import_torch, interpreted
from farm_triton.operation import spec_from, spec_from_key
from farm_triton.registry import Kernel

log = logging.getLogger("farm_triton")


class Found:
    """The outcome of one lookup: the winning candidate's index (None on a miss) and what names the problem."""

    __slots__ = ("index", "key", "problem", "source")

    def __init__(self, index: int | None, key: str, problem: Problem, source: str) -> None:
        self.index, self.key, self.problem, self.source = index, key, problem, source


class Decisions:
    """Read-only access to the farm's decisions for Triton kernels, and the miss reports.

    ``policy`` must be the farm's (its accuracy settings are in the cache key; the default matches a catalog
    without a ``[policy]`` table). ``cache_directory``: a farm cache directory (``farm tune --cache-dir``);
    ``fleet``: further tiers (Redis URLs, archive directories, stores); ``report_to``: a Redis URL for miss
    reports (``farm tune --from-fleet`` tunes them; default: the reporter of ``farm.enable_stack_autotune``'s
    ``report_to`` when one is installed); ``device``: the client whose fingerprint applies (default:
    ``cpu:0`` under ``TRITON_INTERPRET=1``, else torch's current CUDA device)."""

    def __init__(self, policy: StackPolicy | None = None, cache_directory: Path | str | None = None,
                 fleet: Sequence[DecisionStore | str | Path] = (), report_to: str | None = None,
                 device: str | None = None) -> None:
        self.policy = policy if policy is not None else StackPolicy()
        self.policy.validate()
        stores: list[DecisionStore] = []
        if cache_directory is not None:
            stores.append(LocalStore(cache_directory, self.policy.capacity, self.policy.ttl))
        stores.extend(open_fleet_source(f) for f in fleet)
        self.stores = tuple(stores)
        self.reporter = FleetReporter(report_to) if report_to is not None else _installed_reporter()
        self._device = device
        self._client: ComputeClient | None = None
        self._checksums: dict[tuple[str, int, int], tuple[str, Any, Any]] = {}
        self._lock = threading.Lock()
        self.counts = {"hits": 0, "misses": 0}
        self.tuner: StackTuner | None = None  # the controller these decisions were derived from (current())

    # -- identity ---------------------------------------------------------------------------------------------

    def client(self) -> ComputeClient:
        """The compute client whose environment fingerprint names decisions here (created once)."""
        if self._client is None:
            device = self._device
            if device is None:
                device = "cpu:0" if interpreted() else f"cuda:{import_torch().cuda.current_device()}"
            self._client = client_for(device)
        return self._client

    def environment(self) -> RuntimeEnvironment:
        """The environment of :meth:`client` (its fingerprint is in every key)."""
        return runtime_environment(self.client())

    def operation_key(self, kernel: Kernel) -> str:
        """The encoded operation of ``kernel`` on this process's device kind (memoized per config list)."""
        memo = (kernel.name, id(kernel.fn), id(kernel.configs))
        with self._lock:
            found = self._checksums.get(memo)
        if found is not None and found[1] is kernel.fn and found[2] is kernel.configs:
            return found[0]
        checksum = identity.checksum(kernel.name, kernel.fn, kernel.configs)
        encoded = OperationKey(kernel.name, self.client().device_kind, checksum).encode()
        with self._lock:
            self._checksums[memo] = (encoded, kernel.fn, kernel.configs)
        return encoded

    def problem(self, kernel: Kernel, named: Mapping[str, Any]) -> Problem:
        """The problem a farm worker tuned for this launch of ``kernel`` (arguments by name)."""
        return self.problem_for_key(kernel, identity.tuning_key(kernel.keys, kernel.arg_names, named))

    def problem_for_key(self, kernel: Kernel, key: tuple[Any, ...]) -> Problem:
        """The problem of ``kernel`` for Triton's own tuning key ``key`` (what its autotuning listener gets)."""
        env = self.environment()
        return Problem(
            scope=Scope.GRAPH if "fusion" in kernel.name else Scope.OPERATOR,
            operation=self.operation_key(kernel), environment=env.fingerprint, workload=identity.workload(key),
            execution_context=env.execution_context, persistent=env.persistent,
        )

    # -- lookup -----------------------------------------------------------------------------------------------

    def lookup(self, kernel: Kernel, named: Mapping[str, Any]) -> Found:
        """The farm's decision for this launch: the candidate index (:func:`farm_triton.identity.served` says
        which config it is) or None. A tier that fails is a logged miss, never an error for the launch."""
        problem = self.problem(kernel, named)
        cands = identity.candidates(kernel.configs, kernel.reference)
        key = self.key_of(problem, kernel)
        if self.policy.mode is not Mode.DISABLED and problem.persistent:
            found = self.stored(problem, key, cands)
            if found is not None:
                self._count("hits")
                return Found(found[0].index, key, problem, type(found[1]).__name__)
        self._count("misses")
        return Found(None, key, problem, "miss")

    def stored(self, problem: Problem, key: str, cands: Sequence[Candidate]) -> tuple[DecisionRecord, DecisionStore] | None:
        """The first tier's record for ``key`` that may be served (``farm.decisions.refusal``: fresh, reference 0 as
        in every Triton key, its winner the candidate of that index and name, verified, not banned by the
        process's controller, eligible) with its store, else None. A tier that fails is a logged miss."""
        banned = self.banned()
        for store in self.stores:
            try:
                record = read_record(store, problem.environment, key)
            except Exception as e:
                log.warning("farm_triton: decision tier %s failed: %s: %s", type(store).__name__, type(e).__name__, e)
                continue
            if record is not None and refusal(record, key, cands, 0, self.policy, banned, time.time()) is None:
                return record, store
        return None

    def banned(self) -> Container[tuple[str, str]]:
        """The (key, candidate name) bans of the controller these decisions follow (:attr:`tuner`, else the
        process's ``farm.enable_stack_autotune`` one): a winner it banned is not served to Triton either."""
        tuner = self.tuner if self.tuner is not None else stack_autotuner()
        return tuner.banned() if tuner is not None else ()

    def _count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def key_of(self, problem: Problem, kernel: Kernel) -> str:
        """The cache key of ``problem`` with ``kernel``'s candidates, as a farm worker computes it."""
        return cache_key(problem, identity.candidates(kernel.configs, kernel.reference), 0, self.policy)

    def report_miss(self, kernel: Kernel, found: Found, named: Mapping[str, Any] | None,
                    key: tuple[Any, ...] = ()) -> None:
        """Queue a miss report: the operation, the key values and dtypes (the spec ``farm tune --from-fleet``
        tunes, from the arguments by name or else from Triton's tuning ``key``); never blocks, never raises."""
        reporter = self.reporter
        if reporter is None:
            return
        try:
            spec = spec_from(kernel.keys, named) if named is not None else spec_from_key(kernel.keys, key)
            reporter.describe(found.problem, found.key, kernel.name, self.client().device_kind, spec)
            reporter("miss", found.key, found.problem, ())
        except Exception as e:  # feedback never fails a launch
            log.debug("farm_triton: miss not reported: %s", e)


def _installed_reporter() -> FleetReporter | None:
    """The fleet reporter of the process's controller (``farm.enable_stack_autotune(report_to=...)``), if any:
    one stream and one sender thread for the farm's own misses and Triton's."""
    tuner = stack_autotuner()
    feedback = tuner.feedback if tuner is not None else None
    return feedback if isinstance(feedback, FleetReporter) else None


_current: Decisions | None = None
_current_lock = threading.Lock()


def configure(policy: StackPolicy | None = None, cache_directory: Path | str | None = None,
              fleet: Sequence[DecisionStore | str | Path] = (), report_to: str | None = None,
              device: str | None = None) -> Decisions:
    """Say where this process finds the farm's decisions (see :class:`Decisions`); replaces an earlier call.
    Call it before the first launch: kernels already decided keep their config (Triton caches it)."""
    global _current
    built = Decisions(policy, cache_directory, fleet, report_to, device)
    with _current_lock:
        _current = built
    return built


_derived: Decisions | None = None  # without configure(): from the installed controller, or no tiers


def current() -> Decisions:
    """The configured decisions. Without :func:`configure`: the tiers, policy and reporter of the process's farm
    controller (``farm.enable_stack_autotune``) when one is installed, else none (every launch is a miss)."""
    global _derived
    tuner = stack_autotuner()
    with _current_lock:
        if _current is not None:
            return _current
        if _derived is None or _derived.tuner is not tuner:
            if tuner is None:
                log.info("farm_triton: not configured (farm_triton.configure): every kernel falls back to Triton")
                _derived = Decisions()
            else:
                _derived = Decisions(tuner.policy, fleet=stored_tiers(tuner))
            _derived.tuner = tuner
        return _derived

