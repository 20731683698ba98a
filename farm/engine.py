"""The stack tuner: selects, for one exact problem, the fastest candidate proven correct against the reference.

The engine is pure: trials run through an injected :class:`TrialRunner` (a host or CUDA runtime, a Celery task,
or a test fake) and stored decisions come from injected stores. It selects in docs/contract.md's order
("Selection, in order"); a miss may borrow the nearest decision of its family first (farm.borrowing).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from farm.borrowing import Borrowing
from farm.decisions import (
    Decision,
    DecisionRecord,
    DecisionSource,
    Feedback,
    Request,
    Stats,
    TuneReport,
    is_tuning,
    refusal,
    tuning_scope,
    validate_stored,
)
from farm.errors import DeviceBusy, FailureKind, TuneFailure, ValidationUnavailable
from farm.identity import Candidate, Problem, cache_key
from farm.policy import MemoryEviction, Mode, StackPolicy
from farm.roster import Roster
from farm.runner import TrialRunner, Validation, runner_cost
from farm.scoring import valid_seconds
from farm.spacesearch import decided, search_report, searched
from farm.stores import open_fleet_source
from farm.stores.base import DecisionStore, read_record
from farm.stores.local import LocalStore
from farm.stores.memory import MemoryStore
from farm.trials import CandidateReport, decide, reference_noise

log = logging.getLogger(__name__)
_T = TypeVar("_T")

__all__ = [
    "CandidateReport", "Decision", "DecisionSource", "Request", "Stats", "StackTuner", "TrialRunner",
    "TuneReport", "Validation", "is_tuning", "tuning_scope",
]

_STORED_SOURCES = (DecisionSource.TUNED, DecisionSource.MEMORY_CACHE, DecisionSource.DISK_CACHE,
                   DecisionSource.FLEET_CACHE, DecisionSource.NEAREST)


class StackTuner:
    """Thread-safe controller. No lock is held while a trial runs: contenders get the reference at once (BUSY).

    ``cache_directory``: the disk tier (persistent problems only); ``fleet``: read-only tiers after it
    (stores, Redis URLs of a read-only user, archive directories), whose records are validated once per
    process before reuse (docs/farm.md, "Fleet hits"). A failing tier is a warning and a miss."""

    def __init__(self, policy: StackPolicy, cache_directory: Path | str | None = None,
                 memory_eviction: MemoryEviction = MemoryEviction.FIFO,
                 fleet: Sequence[DecisionStore | str | Path] = (), fleet_write_through: bool = True) -> None:
        if not isinstance(policy, StackPolicy):
            raise TuneFailure.invalid(f"policy must be a StackPolicy, got {type(policy).__name__}")
        policy.validate()
        if not isinstance(memory_eviction, MemoryEviction):
            raise TuneFailure.invalid(f"memory_eviction must be a MemoryEviction, got {memory_eviction!r}")
        self._policy = policy
        self._lock = threading.Lock()
        self._memory = MemoryStore(policy.capacity, memory_eviction)
        self._disk = LocalStore(cache_directory, policy.capacity, policy.ttl) if cache_directory is not None else None
        self._fleet = tuple(open_fleet_source(f, policy.trusted_keys) for f in fleet)
        self._write_through = fleet_write_through
        self._requests: OrderedDict[tuple[Problem, tuple[Candidate, ...] | Roster, int, str], Request] = OrderedDict()
        self._counters = dict.fromkeys(Stats.__dataclass_fields__, 0)
        self._banned: set[tuple[str, str]] = set()
        self._validation_unavailable: set[str] = set()
        self._quarantined: set[str] = set()
        self._tuning_keys: set[str] = set()
        self._tuning_lanes: set[str] = set()
        self._windows: OrderedDict[str, deque[float]] = OrderedDict()  # recent live ratios per decision
        self._reports: deque[TuneReport] = deque(maxlen=min(policy.capacity, 128))
        self._hits: dict[str, Decision] = {}  # the MEMORY_CACHE decision of each memory record, built once
        self._borrowing = Borrowing(policy.capacity, self._lock, self._counters)  # nearest decisions
        self.feedback: Feedback | None = None  # told of fleet misses and regressions (farm.feedback)

    @property
    def policy(self) -> StackPolicy:
        return self._policy

    # -- requests -----------------------------------------------------------------------------------------------

    def request(self, problem: Problem, candidates: Sequence[Candidate], reference: int,
                device: str | None = None) -> Request:
        """Validate a selection request and compute its cache key, memoized (bounded) per distinct request."""
        cands = candidates if isinstance(candidates, Roster) else tuple(candidates)
        memo = (problem, cands, reference, device or "")
        with self._lock:
            if (found := self._requests.get(memo)) is not None:
                return found
        key = cache_key(problem, cands, reference, self._policy)
        built = Request(problem, cands, reference, key, device or problem.environment)
        with self._lock:
            self._requests[memo] = built
            if len(self._requests) > 4096:
                self._requests.popitem(last=False)
        return built

    def select(self, problem: Problem, candidates: Sequence[Candidate], reference: int, runner: TrialRunner,
               *, device: str | None = None) -> Decision:
        """Choose the candidate to run; trials are serialized on lane ``device`` (default: the environment).
        Raises TuneFailure INVALID_INPUT, QUARANTINED, DEVICE or REJECTED (the reference itself failed)."""
        return self.select_request(self.request(problem, candidates, reference, device), runner)

    def select_request(self, req: Request, runner: TrialRunner) -> Decision:
        """:meth:`select` for a request built by :meth:`request` (the runtime adapter's hot path)."""
        if req.lane in self._quarantined:
            raise TuneFailure(FailureKind.QUARANTINED, f"device lane {req.lane!r} is quarantined after a device failure")
        policy = self._policy
        if policy.mode is Mode.DISABLED:
            return self._reference(req, DecisionSource.DISABLED)
        key = req.key
        with self._lock:
            record = self._memory.get(key)
            if record is not None:
                if (
                    record.created <= time.time() <= record.created + policy.ttl
                    and (record.verified or not policy.require_validation)
                    and (not self._banned or (key, record.name) not in self._banned)
                ):
                    self._counters["memory_hits"] += 1
                    return self._hits[key]
                self._forget(key)
            if (borrowed := self._borrowing.held(key)) is not None:
                return borrowed
            if key in self._validation_unavailable:
                return self._reference(req, DecisionSource.VALIDATION_UNAVAILABLE)
            if is_tuning():
                return self._reference(req, DecisionSource.NESTED)
            busy = key in self._tuning_keys or req.lane in self._tuning_lanes
            if busy or len(self._tuning_keys) >= policy.max_parallel_tunes:
                self._counters["busy_fallbacks"] += 1
                return self._reference(req, DecisionSource.BUSY)
            self._tuning_keys.add(key)
            self._tuning_lanes.add(req.lane)
        try:
            with tuning_scope():
                return self._miss(req, runner)
        except DeviceBusy:  # the device's lock cannot be taken: the reference, as for any contended device
            self._count("busy_fallbacks")
            return self._reference(req, DecisionSource.BUSY)
        except TuneFailure as e:
            if e.kind is FailureKind.DEVICE:
                with self._lock:
                    self._quarantined.add(req.lane)
                    self._counters["device_failures"] += 1
            raise
        finally:
            with self._lock:
                self._tuning_keys.discard(key)
                self._tuning_lanes.discard(req.lane)

    def _remember(self, record: DecisionRecord) -> None:
        """Put a record in memory with its ready-made hit decision. Caller holds the lock."""
        for evicted in self._memory.put(record):
            self._hits.pop(evicted, None)
        self._hits[record.cache_key] = Decision(record.index, record.reference_index, record.name,
                                                DecisionSource.MEMORY_CACHE, record.verified, record.ratio,
                                                record.cache_key)

    def _forget(self, key: str) -> None:
        """Drop a memory record. Caller holds the lock."""
        self._memory.delete(key)
        self._hits.pop(key, None)

    def _reference(self, req: Request, source: DecisionSource) -> Decision:
        ref = req.reference
        return Decision(ref, ref, req.candidates[ref].name, source, True, 1.0, req.key)

    # -- misses: stored tiers, then search ------------------------------------------------------------------------

    def _miss(self, req: Request, runner: TrialRunner) -> Decision:
        for store in (self._disk, *self._fleet) if req.problem.persistent else ():
            if store is not None and (decision := self._from_store(req, runner, store)) is not None:
                return decision
        self._count("misses")
        borrowed = self._borrowing.borrow(req, runner, self._policy, (self._disk, *self._fleet), self._banned)
        if borrowed is not None:
            decision = borrowed
            self._feedback(lambda f: f.served_nearest(req.key, borrowed.origin, borrowed.distance))
        elif self._policy.mode is Mode.CACHE_ONLY:
            decision = self._reference(req, DecisionSource.CACHE_MISS)
        else:
            decision = self._explore(req, runner)
        if self._fleet and req.problem.persistent:  # the fleet could have served it
            ratios = (decision.ratio,) if decision.source is DecisionSource.TUNED else ()
            self._feedback(lambda f: f("miss", req.key, req.problem, ratios))
        return decision

    def _feedback(self, call: Callable[[Feedback], None]) -> None:
        if self.feedback is not None:
            try:
                call(self.feedback)
            except Exception as e:  # feedback never fails the caller
                log.debug("fleet feedback hook failed: %s", e)

    def _from_store(self, req: Request, runner: TrialRunner, store: DecisionStore) -> Decision | None:
        policy = self._policy
        on_disk = store is self._disk
        source = DecisionSource.DISK_CACHE if on_disk else DecisionSource.FLEET_CACHE
        record = self._tier(f"read {source.value}", read_record, store, req.problem.environment, req.key)
        if record is None:
            return None
        refused = refusal(record, req.key, req.candidates, req.reference, policy, self._banned, time.time())
        if refused is not None:
            if refused.warns:
                self._count("cache_warnings")
            return None
        if validate_stored(runner, req.reference, record.index, policy) is None:
            if on_disk:
                self._tier("delete a stale record from", store.delete, req.key)
            self._count("cache_warnings")
            return None
        if not on_disk and self._write_through and self._disk is not None:
            self._tier("write a fleet hit through to", self._disk.put, record)
        with self._lock:
            self._remember(record)
            self._counters["disk_hits" if on_disk else "fleet_hits"] += 1
            return self._hits[req.key]._replace(source=source)

    def _explore(self, req: Request, runner: TrialRunner) -> Decision:
        policy = self._policy
        started = time.monotonic()
        ref, cands = req.reference, req.candidates
        names = cands.names if isinstance(cands, Roster) else [c.name for c in cands]
        with self._lock:
            banned = {name for key, name in self._banned if key == req.key}
        cost = runner_cost(runner)
        try:  # a set with spaces: farm.spacesearch, which may find a grown space's family record (_family)
            outcomes, reference_times, budget_exhausted, spaced = searched(runner, policy, ref, cands, banned,
                                                                           req.problem, self._family)
        except ValidationUnavailable:
            with self._lock:
                self._validation_unavailable.add(req.key)
            return self._reference(req, DecisionSource.VALIDATION_UNAVAILABLE)
        selection, judged = decide(ref, names, outcomes, policy)
        winner = selection.index
        reports = {j.index: j for j in judged}
        reports[ref] = CandidateReport(names[ref], len(reference_times), 1.0, reference_noise(reference_times), True,
                                       "selected: reference" if winner == ref else "reference", index=ref)
        spent = runner_cost(runner)
        search_cost = {"device_seconds": spent[0] - cost[0], "compile_seconds": spent[1] - cost[1]}
        for record in decided(req.key, req.problem, cands, winner, ref, names[winner], selection.verified,
                              selection.ratio, time.time(), policy, spaced, search_cost):  # + a family record
            with self._lock:
                self._remember(record)
            if req.problem.persistent and self._disk is not None:
                self._tier("write", self._disk.put, record)
        report = search_report(req.problem, names[winner], time.monotonic() - started, budget_exhausted,
                               tuple(reports[i] for i in sorted(reports)), policy, spaced)
        report = dataclasses.replace(report, device_seconds=search_cost["device_seconds"],
                                     compile_seconds=search_cost["compile_seconds"])
        with self._lock:
            self._counters["tunes"] += 1
            self._reports.append(report)
        return Decision(winner, ref, names[winner], DecisionSource.TUNED, selection.verified, selection.ratio, req.key)

    def _family(self, key: str, persistent: bool) -> DecisionRecord | None:  # from memory, else the disk tier
        with self._lock:
            record = self._memory.get(key)
        if record is None and persistent and self._disk is not None:
            return self._tier("read a space family record from", self._disk.get, key)
        return record

    def _tier(self, what: str, call: Callable[..., _T], *args: Any) -> _T | None:
        """Run ``call(*args)``, one cache-tier operation: a failure is a logged warning, counted, and None."""
        try:
            return call(*args)
        except Exception as e:
            log.warning("cache tier failure (%s): %s: %s", what, type(e).__name__, e)
            self._count("cache_warnings")
            return None

    def _count(self, name: str) -> None:
        with self._lock:
            self._counters[name] += 1

    # -- invalidation -----------------------------------------------------------------------------------------

    def invalidate(self, decision: Decision, ban_candidate: bool) -> None:
        """Forget the decision in memory and on disk; with ``ban_candidate`` never pick that winner for the key
        again in this process (the reference is never banned)."""
        with self._lock:
            self._forget(decision.cache_key)
            self._borrowing.forget(decision.cache_key)
            self._windows.pop(decision.cache_key, None)
            if ban_candidate and decision.index != decision.reference_index:
                self._banned.add((decision.cache_key, decision.name))
            self._counters["invalidations"] += 1
        if self._disk is not None:
            self._tier("delete an invalidated record from", self._disk.delete, decision.cache_key)

    def record_comparison(self, decision: Decision, reference_seconds: float, selected_seconds: float,
                          correctness_checked: bool) -> bool:
        """Feed one live observation into the decision's regression window; True when its median regressed:
        the decision is invalidated, its winner banned (docs/contract.md, "Execution and invalidation")."""
        if not (valid_seconds(reference_seconds) and valid_seconds(selected_seconds)):
            raise TuneFailure.invalid(f"record_comparison needs positive finite seconds, "
                                      f"got ({reference_seconds!r}, {selected_seconds!r})")
        if not correctness_checked or decision.index == decision.reference_index or decision.source not in _STORED_SOURCES:
            return False
        pairs = self._policy.regression_pairs
        with self._lock:  # the window: the last ``pairs`` ratios, for at most ``capacity`` decisions
            window = self._windows.get(decision.cache_key)
            if window is None:
                window = self._windows[decision.cache_key] = deque(maxlen=pairs)
                if len(self._windows) > self._policy.capacity:
                    self._windows.popitem(last=False)
            window.append(selected_seconds / reference_seconds)
            median = statistics.median(window) if len(window) == pairs else 0.0
            regressed = median > self._policy.regression_ratio
        if regressed:
            self.invalidate(decision, True)
            if self._fleet:
                self._feedback(lambda f: f("regression", decision.cache_key, None, (median, decision.ratio)))
        return regressed

    def banned(self) -> frozenset[tuple[str, str]]:
        """The (cache key, candidate name) pairs never served again (``invalidate``'s ``ban_candidate``)."""
        with self._lock:
            return frozenset(self._banned)

    def stats(self) -> Stats:
        with self._lock:
            return Stats(**self._counters)

    def reports(self) -> list[TuneReport]:
        with self._lock:
            return list(self._reports)

    def quarantined(self) -> set[str]:
        with self._lock:
            return set(self._quarantined)
