"""The selection rule, shared by the in-process controller and the farm's aggregation.

A candidate is scored from PAIRS of (reference_seconds, candidate_seconds) timed back to back in the order
taken, the even-numbered ones reference first. Its ratio is the median block ratio (order-balanced); sign-test
intervals of the median, spending at most ``ALPHA`` per side over a sequence of looks (:func:`look_sizes`),
decide FASTER or NOT_FASTER against ``1 / min_speedup``; orders that disagree leave it UNDECIDED. A candidate
wins only on a FASTER verdict that beats the current winner. In full: docs/decisions.md.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from farm.policy import StackPolicy

Pair = tuple[float, float]

ALPHA = 0.05
"""Per side: the most probability that a whole sequence of looks wrongly decides FASTER (or NOT_FASTER)."""


class Standing(enum.Enum):
    """What a candidate's pairs prove: faster by ``min_speedup`` (a win), not that fast, or neither yet."""

    FASTER = "faster"
    NOT_FASTER = "not_faster"
    UNDECIDED = "undecided"


def valid_seconds(value: float) -> bool:
    """A usable timing: a finite number of seconds above zero."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _ratios(pairs: Sequence[Pair]) -> list[float]:
    if not pairs:
        raise ValueError("no timing pairs")
    for reference, candidate in pairs:
        if not (valid_seconds(reference) and valid_seconds(candidate)):
            raise ValueError(f"invalid timing pair ({reference!r}, {candidate!r})")
    return [candidate / reference for reference, candidate in pairs]


def ratio_statistics(pairs: Sequence[Pair]) -> tuple[float, float]:
    """Plain median candidate/reference ratio and its relative MAD, orders pooled (a description of the spread,
    not the score). Raises ValueError for empty or invalid pairs."""
    ratios = _ratios(pairs)
    median = statistics.median(ratios)
    mad = statistics.median(abs(r - median) for r in ratios)
    return median, mad / median


@lru_cache(maxsize=4096)
def bound_rank(n: int, alpha: float) -> int:
    """The largest k >= 1 with P(Binomial(n, 1/2) <= k - 1) <= alpha, or 0 when even k = 1 fails: the k-th
    smallest and k-th largest of n ratios then bound their median with error <= alpha per side."""
    cumulative = 0
    for k in range((n + 1) // 2):
        cumulative += math.comb(n, k)
        if cumulative / 2**n > alpha:
            return k
    return (n + 1) // 2


def look_sizes(samples: int, limit: int) -> list[int]:
    """The pair counts at which a sequence looks: ``samples``, then ``samples + 1`` more at a time (so each
    extension adds as many pairs of each order), and finally ``limit``."""
    sizes = list(range(samples, limit + 1, samples + 1))
    if not sizes or sizes[-1] != limit:
        sizes.append(limit)
    return sizes


def _spend(look: int) -> float:
    return ALPHA * 6.0 / (math.pi**2 * look**2)


@lru_cache(maxsize=4096)
def look_alpha(n: int, samples: int) -> float:
    """The per-side error the look at ``n`` pairs may spend (for its two tests); 0.0 when it cannot decide.
    Only looks that can decide are counted along the sequence, so an early one that cannot spends nothing."""
    look = 1
    for m in range(samples, n, samples + 1):
        if bound_rank(m, _spend(look) / 2) >= 1:
            look += 1
    return _spend(look) if bound_rank(n, _spend(look) / 2) >= 1 else 0.0


def blocks(pairs: Sequence[Pair]) -> list[float]:
    """Block ratios: each reference-first pair with the candidate-first pair after it, ``min(candidates) /
    min(references)``."""
    return [min(pairs[i][1], pairs[i + 1][1]) / min(pairs[i][0], pairs[i + 1][0])
            for i in range(0, len(pairs) - 1, 2)]


@dataclass(frozen=True)
class Score:
    """A candidate's standing after ``pairs`` pairs: the order-balanced ``ratio`` (median block ratio), the
    median ratio's deciding bounds (``low``, ``high``; NaN if none could) and ``reason``, a note why."""

    standing: Standing
    ratio: float
    low: float
    high: float
    reference_first: float  # median ratio of the reference-first pairs
    candidate_first: float  # median ratio of the candidate-first pairs
    relative_mad: float  # of the pair ratios, orders pooled
    pairs: int
    reason: str

    @property
    def decided(self) -> bool:
        return self.standing is not Standing.UNDECIDED


def _interval(values: Sequence[float], alpha: float) -> tuple[float, float, float] | None:
    """(low, high, median) of the values, or None when no bound reaches the confidence."""
    k = bound_rank(len(values), alpha)
    if not k:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[len(values) - k], statistics.median(ordered)


def _orders_differ(ratios: Sequence[float]) -> bool:
    """Whether the reference-first and candidate-first ratios differ beyond chance: a Mann-Whitney rank test
    (normal approximation, two-sided 5 %). Seven pairs wholly separated by order already show it."""
    first, second = ratios[0::2], ratios[1::2]
    if not first or not second:
        return False
    u = sum((a < b) + 0.5 * (a == b) for a in first for b in second)
    n1, n2 = len(first), len(second)
    sd = math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12.0)
    return abs(u - n1 * n2 / 2.0) > 1.96 * sd


def assess(pairs: Sequence[Pair], policy: StackPolicy) -> Score:
    """Score pairs taken in alternating order (the first one reference-first); ValueError for empty or invalid
    pairs. Two sign tests, over the pair ratios and over the block ratios, share each look's error."""
    ratios = _ratios(pairs)
    n = len(ratios)
    first = statistics.median(ratios[0::2])
    second = statistics.median(ratios[1::2]) if n > 1 else first
    block = blocks(pairs)
    ratio = statistics.median(block) if block else ratios[0]
    _, relative_mad = ratio_statistics(pairs)
    alpha = look_alpha(n, policy.samples) / 2
    intervals = [i for i in (_interval(ratios, alpha), _interval(block, alpha)) if i is not None]
    line = 1.0 / policy.min_speedup

    def score(standing: Standing, reason: str, interval: tuple[float, ...] = (math.nan, math.nan)) -> Score:
        return Score(standing, ratio, interval[0], interval[1], first, second, relative_mad, n, reason)

    undecided = Standing.UNDECIDED
    effect = math.sqrt(max(first, second) / min(first, second)) - 1.0  # the orders' gap, relative
    if effect > policy.max_relative_mad and _orders_differ(ratios):
        return score(undecided, f"undecided: orders disagree (reference-first median {first:.3f}, candidate-first "
                                f"{second:.3f}: {effect:.3f} > {policy.max_relative_mad:g})")
    if not intervals:
        return score(undecided, f"undecided: {n} pairs are too few for a confident verdict")
    # A clear win however wide its interval; the least noisy one (upper bound over median) is reported.
    below = sorted(((i[1] - i[2]) / i[2], i) for i in intervals if i[1] <= line)
    if below and ratio <= line:
        _, best = below[0]
        return score(Standing.FASTER, f"ratio {ratio:.3f} in [{best[0]:.3f}, {best[1]:.3f}]", best)
    above = [i for i in intervals if i[0] > line]
    if above:
        return score(Standing.NOT_FASTER, f"too slow: ratio {ratio:.3f} in [{above[0][0]:.3f}, {above[0][1]:.3f}] "
                                          f"misses min_speedup {policy.min_speedup:g}", above[0])
    widest = intervals[0]
    return score(undecided, f"undecided: ratio {ratio:.3f} in [{widest[0]:.3f}, {widest[1]:.3f}] straddles "
                            f"1/min_speedup = {line:.3f}", widest)


@dataclass(frozen=True)
class Verdict:
    """How one candidate fared: ``accepted`` when its pairs reached a decided verdict (``score.standing``)."""

    accepted: bool
    ratio: float | None
    relative_mad: float | None
    note: str
    score: Score | None = None

    @property
    def wins(self) -> bool:
        """A decided FASTER verdict: the candidate clears min_speedup with confidence."""
        return self.score is not None and self.score.standing is Standing.FASTER


def judge(pairs: Sequence[Pair], policy: StackPolicy) -> Verdict:
    """Score a validated candidate's pairs: rejected when invalid, otherwise its decided or undecided score."""
    try:
        s = assess(pairs, policy)
    except ValueError as e:
        return Verdict(False, None, None, f"rejected: {e}")
    return Verdict(s.decided, s.ratio, s.relative_mad, s.reason, s)


def paired_score(pairs: Sequence[Pair], policy: StackPolicy) -> tuple[float, float] | None:
    """``(ratio, relative_mad)`` of a DECIDED verdict over the pairs (a win: ``ratio * min_speedup <= 1``);
    None when they are empty, invalid or undecided."""
    s = judge(pairs, policy).score
    return (s.ratio, s.relative_mad) if s is not None and s.decided else None


class Selection:
    """The running winner of a search: starts at the reference (ratio 1.0) and takes strictly better offers."""

    def __init__(self, reference: int, policy: StackPolicy) -> None:
        self.index, self.ratio, self.verified = reference, 1.0, True
        self._min_speedup = policy.min_speedup

    def offer(self, index: int, ratio: float, verified: bool) -> bool:
        """Make ``index`` the winner if it beats the current one and clears min_speedup; say whether it did."""
        better = ratio < self.ratio and ratio * self._min_speedup <= 1.0
        if better:
            self.index, self.ratio, self.verified = index, ratio, verified
        return better
