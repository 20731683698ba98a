"""Regression windows: the last live (selected / reference) ratios of each stored decision the application ran.

``record_comparison`` (farm.engine) feeds one correctness-checked observation at a time; a full window whose
median exceeds the policy's ``regression_ratio`` invalidates the decision (docs/contract.md, invalidation).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque


class RegressionWindows:
    """At most ``capacity`` windows of ``pairs`` ratios each, the least recently created dropped first. Not
    thread-safe: the engine calls it under its lock."""

    def __init__(self, pairs: int, capacity: int) -> None:
        self.pairs, self.capacity = pairs, capacity
        self._windows: OrderedDict[str, deque[float]] = OrderedDict()

    def observe(self, key: str, ratio: float) -> float:
        """Add one ratio to ``key``'s window; return its median once the window is full, else 0.0."""
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = deque(maxlen=self.pairs)
            if len(self._windows) > self.capacity:
                self._windows.popitem(last=False)
        window.append(ratio)
        return statistics.median(window) if len(window) == self.pairs else 0.0

    def forget(self, key: str) -> None:
        self._windows.pop(key, None)
