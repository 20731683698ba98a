"""Borrowed decisions: a miss served by the stored decision of the nearest workload of its family, validated once
on the live workload first (SEMANTICS.md, "Nearest is borrowed, never stored").

When a miss borrows, what is usable and what a validation's verdict does: docs/nearest.md, "Borrowing".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Container, Sequence

from farm.decisions import Decision, DecisionSource, NearestDecision, Request, refusal, validate_stored
from farm.nearest import NearestHit, nearest_first, query_of
from farm.policy import StackPolicy
from farm.runner import TrialRunner, Validation
from farm.stores.base import DecisionStore

log = logging.getLogger(__name__)


class Borrowing:
    """The borrowed decisions of one controller (at most ``capacity``, oldest out first) and the keys whose
    borrowed winner failed validation; callers of :meth:`held` and :meth:`forget` hold the shared ``lock``."""

    def __init__(self, capacity: int, lock: threading.Lock, counters: dict[str, int]) -> None:
        self.capacity = capacity
        self._lock, self._counters = lock, counters
        self._held: OrderedDict[str, tuple[Decision, float]] = OrderedDict()  # key -> (decision, expiry time)
        self._refused: OrderedDict[str, str] = OrderedDict()  # live key -> the origin key that failed there

    def held(self, key: str) -> Decision | None:
        """The borrowed decision held for ``key`` unless expired (its origin's ttl), counted as a hit."""
        found = self._held.get(key)
        if found is None or time.time() > found[1]:
            self._held.pop(key, None)
            return None
        self._counters["nearest_hits"] += 1
        return found[0]

    def forget(self, key: str) -> None:
        self._held.pop(key, None)

    def borrow(self, req: Request, runner: TrialRunner, policy: StackPolicy, stores: Sequence[DecisionStore | None],
               banned: Container[tuple[str, str]]) -> NearestDecision | None:
        """Serve ``req`` from the nearest usable decision of the ``stores``, or None (refused, none near, or
        it failed its validation). A DEVICE failure or a busy device during the validation propagates.
        ``banned`` holds the controller's (key, candidate name) bans."""
        if not (policy.nearest and req.nearest and req.problem.persistent) or req.key in self._refused:
            return None
        query = query_of(req.key)
        if query is None:
            return None
        hits: list[NearestHit] = []
        for store in stores:  # the tiers with a nearest-decision index (the local cache, Redis, archives)
            try:
                nearest = getattr(store, "nearest", None)
                if nearest is not None:
                    hits += nearest(query, policy.max_distance)
            except Exception as e:  # a failing tier is no answer (its exact read already counted it)
                log.warning("nearest lookup failed in %s: %s: %s", type(store).__name__, type(e).__name__, e)
        now = time.time()
        usable = (hit for hit in nearest_first(hits)
                  if refusal(hit.record, req.key, req.candidates, req.reference, policy, banned, now) is None)
        candidate = next(usable, None)
        if candidate is None:
            return None
        record = candidate.record
        verdict = validate_stored(runner, req.reference, record.index, policy)
        if verdict is None:  # a wrong output or an error on the live workload: refused
            with self._lock:
                self._refused[req.key] = record.cache_key
                if len(self._refused) > 4 * self.capacity:
                    self._refused.popitem(last=False)
                self._counters["nearest_refused"] += 1
            return None
        decision = NearestDecision(
            Decision(record.index, record.reference_index, record.name, DecisionSource.NEAREST,
                     verdict is Validation.PASSED, record.ratio, req.key), candidate.workload, candidate.distance,
            record.cache_key)
        with self._lock:
            self._held[req.key] = (decision, record.created + policy.ttl)
            if len(self._held) > self.capacity:
                self._held.popitem(last=False)
            self._counters["nearest_hits"] += 1
        return decision

