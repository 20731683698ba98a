"""Borrowed decisions: a miss served by the stored decision of the nearest workload of its family, validated once
on the live workload first (SEMANTICS.md, "Nearest is borrowed, never stored").

On a miss that every stored tier answered with nothing (and when the policy's ``nearest`` and the request's allow
it), the controller asks each tier that has a nearest-decision index (the local cache, Redis, archives: their
``nearest(query, max_distance)``) for the family's nearest decisions (farm.nearest). The nearest usable one (fresh,
verified unless validation is off, its winner present, eligible, fitting the workspace limit and not banned for
the live key) is validated once against the reference on the live workload, as a stored record is:

- passed (or the reference itself): the decision is served with source NEAREST, its origin workload and the
  distance, and held here, in memory only, for later calls of that key (until the origin record's ttl ends). It never becomes the key's stored record,
  in memory or any tier, and the miss is still reported to the fleet, marked served-nearest.
- failed: the key is remembered as refused (this process never borrows for it again) and the miss goes on as
  before: CACHE_ONLY runs the reference, EXPLORE searches.

:class:`Borrowing` is the one owner of the held decisions and the refusals.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Container, Sequence
from typing import Protocol, runtime_checkable

from farm.decisions import Decision, DecisionSource, NearestDecision, Request, refusal, validate_stored
from farm.nearest import NearestHit, NearestQuery, nearest_first, query_of
from farm.policy import StackPolicy
from farm.runner import TrialRunner, Validation
from farm.stores.base import DecisionStore

log = logging.getLogger(__name__)


class Borrowing:
    """The borrowed decisions of one controller (at most ``capacity``, oldest first out) and the keys whose
    borrowed winner failed its validation."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held: OrderedDict[str, tuple[Decision, float]] = OrderedDict()  # key -> (decision, expiry time)
        self._refused: OrderedDict[str, str] = OrderedDict()  # live key -> the origin key that failed there
        self._lock = threading.Lock()
        self._counts = {"nearest_hits": 0, "nearest_refused": 0}

    def held(self, key: str) -> Decision | None:
        """The borrowed decision held for ``key``, if any and not expired (its origin record's ttl): a later
        call's hit, counted."""
        found = self._held.get(key)
        if found is None:
            return None
        if time.time() > found[1]:
            self.forget(key)
            return None
        self._count("nearest_hits")
        return found[0]

    def counts(self) -> dict[str, int]:
        """The controller's counters this owner keeps: ``nearest_hits`` and ``nearest_refused`` (farm.Stats)."""
        with self._lock:
            return dict(self._counts)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def forget(self, key: str) -> None:
        with self._lock:
            self._held.pop(key, None)

    def refused(self, key: str) -> str | None:
        """The origin key whose winner failed on ``key``, when one did."""
        return self._refused.get(key)

    def borrow(self, req: Request, runner: TrialRunner, policy: StackPolicy, stores: Sequence[DecisionStore | None],
               banned: Container[tuple[str, str]]) -> NearestDecision | None:
        """Serve ``req`` from the nearest usable decision of ``stores`` (None entries and stores without a
        nearest-decision index are skipped); None when the policy or the request refuses nearest decisions, the
        problem is not persistent, none is near, or the one found failed its validation. A DEVICE failure or a busy
        device during the validation propagates. ``banned`` holds the controller's (key, candidate name) bans. The
        caller marks a served decision on its fleet feedback (the miss it reports next says ``served: nearest``)."""
        if not (policy.nearest and req.nearest and req.problem.persistent) or req.key in self._refused:
            return None
        query = query_of(req.key)
        if query is None:
            return None
        indexes: list[NearestIndex] = []
        for store in stores:
            if isinstance(store, NearestIndex):
                indexes.append(store)
        candidate = _nearest_usable(req, query, policy, indexes, banned)
        if candidate is None:
            return None
        record = candidate.record
        verdict = validate_stored(runner, req.reference, record.index, policy)
        if verdict is None:  # a wrong output or an error on the live workload: refused
            with self._lock:
                self._refused[req.key] = record.cache_key
                if len(self._refused) > 4 * self.capacity:
                    self._refused.popitem(last=False)
                self._counts["nearest_refused"] += 1
            return None
        decision = NearestDecision(
            Decision(record.index, record.reference_index, record.name, DecisionSource.NEAREST,
                     verdict is Validation.PASSED, record.ratio, req.key), candidate.workload, candidate.distance,
            record.cache_key)
        with self._lock:
            self._held[req.key] = (decision, record.created + policy.ttl)
            if len(self._held) > self.capacity:
                self._held.popitem(last=False)
            self._counts["nearest_hits"] += 1
        return decision


@runtime_checkable
class NearestIndex(Protocol):
    """A tier with a nearest-decision index (the local cache, Redis, archives)."""

    def nearest(self, query: NearestQuery, max_distance: float) -> list[NearestHit]: ...


def _nearest_usable(req: Request, query: NearestQuery, policy: StackPolicy, stores: Sequence[NearestIndex],
                    banned: Container[tuple[str, str]]) -> NearestHit | None:
    hits: list[NearestHit] = []
    for store in stores:
        try:
            hits += store.nearest(query, policy.max_distance)
        except Exception as e:  # a failing tier is no answer (its exact read on this miss already counted it)
            log.warning("nearest lookup failed in %s: %s: %s", type(store).__name__, type(e).__name__, e)
    now = time.time()
    for candidate in nearest_first(hits):
        if refusal(candidate.record, req.key, req.candidates, req.reference, policy, banned, now) is None:
            return candidate
    return None
