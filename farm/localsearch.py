"""The ``local`` strategy: a local search over a space's parameters, guided by an additive model of the results.

After ``INIT`` of its configs drawn at random (seeded), ``MODEL_SHARE`` of each round comes from the model
(ridge regression of log(ratio) on one-hot parameter values) and the rest from :meth:`LocalSearch.neighbours`.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

from farm.keyroster import mixed_rank, unrank
from farm.roster import Roster, Segment
from farm.sampler import Budgeted, Exclude, numeric

INIT = 0.15  # the share of ``max_configs`` drawn at random before the model and the neighbourhood take over
MODEL_SHARE = 0.5  # the share of each later round the additive model proposes; the neighbourhood the rest
POOL = 4000  # the seeded pool of feasible configs the model ranks (the space is never enumerated)
RIDGE = 1.0
DRAWS_PER_CONFIG = 64  # rejected random draws (infeasible, seen) per config before giving up on drawing


class LocalSearch(Budgeted):
    """See the module docstring; ``max_configs`` None: until the spaces run out; ``exclude``: never asked."""

    name = "local"
    adaptive = True

    def __init__(self, roster: Roster, max_configs: int | None, seed: int, exclude: Exclude) -> None:
        super().__init__(roster, max_configs, seed, exclude)
        self.init = max(4, int(self.left * INIT))
        self.results: dict[int, float | None] = {}
        # One-hot columns: per segment, per parameter, per value; plus one column per segment (its intercept).
        self._sizes = [[len(v) for _, v in s.space.params] for s in self.segments if s.space is not None]
        starts = itertools.accumulate((size for row in self._sizes for size in row), initial=0)
        self.offsets = [[next(starts) for _ in row] for row in self._sizes]  # each parameter's first column
        self.width = next(starts) + len(self.segments)
        self._numbers = {s.start: n for n, s in enumerate(self.segments)}
        self._orders = [[_order(values) for _, values in s.space.params] for s in self.segments if s.space is not None]

    def _locate(self, position: int) -> tuple[int, Segment, list[int]]:
        """The number of the segment holding ``position``, the segment, and each parameter's value index."""
        segment, rank = self.roster.locate(position)
        n = self._numbers[segment.start]
        return n, segment, unrank(rank, [range(size) for size in self._sizes[n]])

    def _position(self, n: int, segment: Segment, digits: Sequence[int]) -> int:
        return segment.start + mixed_rank(zip(digits, self._sizes[n], strict=True))

    def _draw(self, taken: Sequence[int]) -> int | None:
        for _ in range(DRAWS_PER_CONFIG):
            position = self.position(self.rng.randrange(self.total))
            if self.usable(position) and position not in taken:
                return position
        return None

    def neighbours(self, position: int) -> list[int]:
        """Single-parameter moves (:func:`_moves`), then the repairs of the moves a restriction forbids: each
        also changes one small parameter (at most three values; a tile stride only a larger tile allows)."""
        n, segment, digits = self._locate(position)
        assert segment.space is not None
        params = segment.space.params
        moves = [[*digits[:i], digit, *digits[i + 1:]] for i, (_, values) in enumerate(params)
                 for digit in _moves(values, self._orders[n][i], digits[i])]
        small = [i for i, (_, values) in enumerate(params) if 1 < len(values) <= 3]
        out = [self._position(n, segment, m) for m in moves]
        for moved, q in zip(moves, list(out), strict=True):
            if not self.roster[q].eligible:
                out.extend(self._position(n, segment, [*moved[:i], digit, *moved[i + 1:]])
                           for i in small for digit in range(len(params[i][1])) if digit != moved[i])
        return out

    def _features(self, positions: Sequence[int]) -> np.ndarray:
        rows = np.zeros((len(positions), self.width))
        for r, position in enumerate(positions):
            n, _, digits = self._locate(position)
            rows[r, self.width - len(self.segments) + n] = 1.0
            for start, digit in zip(self.offsets[n], digits, strict=True):
                rows[r, start + digit] = 1.0
        return rows

    @functools.cached_property
    def _pool(self) -> tuple[list[int], np.ndarray]:
        """The seeded pool of distinct feasible configs the model ranks, drawn when first needed."""
        pool: set[int] = set()
        for _ in range(POOL * 4):
            if len(pool) >= POOL:
                break
            drawn = self._draw(())
            if drawn is not None:
                pool.add(drawn)
        ordered = sorted(pool)
        return ordered, self._features(ordered)

    def _modelled(self, want: int, taken: Sequence[int]) -> list[int]:
        known = [(p, v) for p, v in self.results.items() if v is None or (v > 0 and math.isfinite(v))]
        logs = [math.log(v) for _, v in known if v is not None]
        if len(logs) < 5 or want <= 0:
            return []
        worst = max(logs) + 1.0  # a failure: a bad time, not an unknown one
        x = self._features([p for p, _ in known])
        y = np.array([math.log(v) if v is not None else worst for _, v in known])
        weights = np.linalg.solve(x.T @ x + RIDGE * np.eye(self.width), x.T @ y)
        pool, features = self._pool
        best = (pool[int(j)] for j in np.argsort(features @ weights, kind="stable"))
        return list(itertools.islice((p for p in best if self.usable(p) and p not in taken), want))

    def ask(self, n: int) -> list[int]:
        want = min(n, self.left)
        out: list[int] = []
        while len(out) < min(want, self.init - len(self.proposed)) and (drawn := self._draw(out)) is not None:
            out.append(drawn)
        if len(out) < want and self.results:
            out.extend(self._modelled(round(MODEL_SHARE * (want - len(out))), out))
            best = sorted((v, p) for p, v in self.results.items() if v is not None)
            for q in (q for _, parent in best for q in self.neighbours(parent)):
                if len(out) >= want:
                    break
                if self.usable(q) and q not in out:
                    out.append(q)
        while len(out) < want:
            drawn = self._draw(out)
            if drawn is None:  # a nearly spent space: the usable ones from a seeded start
                start = self.rng.randrange(self.total) if self.total else 0
                drawn = next((p for p in itertools.islice(self.walk(start), 64) if p not in out), None)
            if drawn is None:
                break
            out.append(drawn)
        return self.take(out)

    def tell(self, results: Sequence[tuple[int, float | None]]) -> None:
        for position, ratio in results:
            self.results[position] = ratio


def _order(values: Sequence[object]) -> list[int]:
    """The indices of ``values`` in ascending order when all are numbers, else in declaration order."""
    if numeric(values):
        return sorted(range(len(values)), key=lambda i: values[i])  # type: ignore[arg-type,return-value]
    return list(range(len(values)))


def _moves(values: Sequence[object], order: list[int], digit: int) -> list[int]:
    """The digits one move away: every other value of a parameter with at most three; else a step either way
    in sorted order and, for positive numbers, the values nearest to double and half (powers of two)."""
    if len(values) <= 3:
        return [d for d in range(len(values)) if d != digit]
    at = order.index(digit)
    found = {order[j] for j in (at - 1, at + 1) if 0 <= j < len(order)}
    value = values[digit]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        assert isinstance(value, (int, float))
        for target in (value * 2.0, value / 2.0):
            found.add(min(range(len(values)), key=lambda d: abs(math.log(values[d] / target))))  # type: ignore[operator]
    found.discard(digit)
    return sorted(found)
