"""The selection rule, shared by the in-process controller and the farm's aggregation.

A candidate is scored from PAIRS of (reference_seconds, candidate_seconds) timed back to back: the score is the
median of candidate/reference ratios, rejected as noise when the relative median absolute deviation exceeds the
policy's limit. A candidate replaces the current winner only if its ratio beats the winner's AND
``ratio * min_speedup <= 1``; otherwise the reference stays.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from farm.policy import StackPolicy

Pair = tuple[float, float]


def valid_seconds(value: float) -> bool:
    """A usable timing: a finite number of seconds above zero."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def ratio_statistics(pairs: Sequence[Pair]) -> tuple[float, float]:
    """Median candidate/reference ratio and its relative MAD. Raises ValueError for empty or invalid pairs."""
    if not pairs:
        raise ValueError("no timing pairs")
    ratios = []
    for reference, candidate in pairs:
        if not (valid_seconds(reference) and valid_seconds(candidate)):
            raise ValueError(f"invalid timing pair ({reference!r}, {candidate!r})")
        ratios.append(candidate / reference)
    median = statistics.median(ratios)
    mad = statistics.median(abs(r - median) for r in ratios)
    return median, mad / median


def paired_score(pairs: Sequence[Pair], policy: StackPolicy) -> tuple[float, float] | None:
    """``(ratio, relative_mad)`` of the pairs, or None when they are empty, invalid, or noisier than allowed."""
    try:
        ratio, relative_mad = ratio_statistics(pairs)
    except ValueError:
        return None
    if relative_mad > policy.max_relative_mad:
        return None
    return ratio, relative_mad


@dataclass(frozen=True)
class Verdict:
    """How one candidate fared: accepted with a ratio, or rejected with a note saying why."""

    accepted: bool
    ratio: float | None
    relative_mad: float | None
    note: str


def judge(pairs: Sequence[Pair], policy: StackPolicy) -> Verdict:
    """Score a validated candidate's pairs: rejected when invalid or noisy, otherwise a ratio to compare."""
    try:
        ratio, relative_mad = ratio_statistics(pairs)
    except ValueError as e:
        return Verdict(False, None, None, f"rejected: {e}")
    if relative_mad > policy.max_relative_mad:
        return Verdict(
            False, ratio, relative_mad, f"noisy: relative MAD {relative_mad:.3f} > {policy.max_relative_mad:.3f}"
        )
    if ratio * policy.min_speedup > 1.0:
        return Verdict(True, ratio, relative_mad, f"too slow: ratio {ratio:.3f} misses min_speedup {policy.min_speedup}")
    return Verdict(True, ratio, relative_mad, f"ratio {ratio:.3f}")


class Selection:
    """The running winner of a search: starts at the reference (ratio 1.0) and takes strictly better offers."""

    def __init__(self, reference: int, policy: StackPolicy) -> None:
        self.index = reference
        self.ratio = 1.0
        self.verified = True
        self._min_speedup = policy.min_speedup

    def offer(self, index: int, ratio: float, verified: bool) -> bool:
        """Make ``index`` the winner if it beats the current one and clears min_speedup; say whether it did."""
        if ratio < self.ratio and ratio * self._min_speedup <= 1.0:
            self.index, self.ratio, self.verified = index, ratio, verified
            return True
        return False
