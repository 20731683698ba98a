"""The ``local`` strategy: a local search over a space's parameters, guided by an additive model of the results.

Measured on the recorded real GPU spaces (bench/replay.py), a kernel's time is mostly a product of per-parameter
effects (a block size that suits the device, a tiling that suits the kernel), broken by restrictions and by a few
interactions; TPE spends its configs learning densities it cannot use at 100 configs. This strategy proposes, per
round:

- at first, ``INIT`` (15 %) of its configs drawn uniformly among the feasible ones (seeded);
- then half of each round from an **additive model**: ridge regression of log(ratio) on one-hot parameter values,
  fitted to every result so far (a failure counts as a bad time), ranking a seeded pool of feasible configs; the
  best-predicted ones not yet proposed are asked;
- the other half from the **neighbourhood** of the best configs so far, best first: each parameter moved one step
  in its sorted values, numeric ones also doubled and halved (GPU spaces favour powers of two), every value of a
  parameter with at most three; a move a restriction forbids is repaired by also changing one small parameter
  (a tile stride that only a tile size above one allows).

It is deterministic in its seed and the results told, like every strategy (a resumed farm search replays it).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import numpy as np

from farm.roster import Roster, Segment

INIT = 0.15
"""The share of ``max_configs`` drawn at random before the model and the neighbourhood take over."""
MODEL_SHARE = 0.5
"""The share of each later round the additive model proposes; the neighbourhood proposes the rest."""
POOL = 4000
"""The seeded pool of feasible configs the model ranks (the space is never enumerated)."""
RIDGE = 1.0
DRAWS_PER_CONFIG = 64  # rejected random draws (infeasible, seen) per config before giving up on drawing


class LocalSearch:
    """See the module docstring. ``exclude`` names positions never to propose (an incremental search's covered
    configs); ``max_configs`` None: until the spaces run out (the pool and neighbourhoods, then random draws)."""

    name = "local"
    adaptive = True

    def __init__(self, roster: Roster, max_configs: int | None, seed: int, exclude: Callable[[int], bool]) -> None:
        self.roster = roster
        self.segments = tuple(roster.spaces())
        self.total = sum(s.size for s in self.segments)
        self.left = self.total if max_configs is None else min(max_configs, self.total)
        self.init = max(4, int(self.left * INIT))
        self.exclude = exclude
        self.rng = random.Random(seed)
        self.proposed: set[int] = set()
        self.results: dict[int, float | None] = {}
        # One-hot columns: per segment, per parameter, per value; plus one column per segment (its intercept).
        self.offsets: list[list[int]] = []
        column = 0
        for segment in self.segments:
            assert segment.space is not None
            starts = []
            for _, values in segment.space.params:
                starts.append(column)
                column += len(values)
            self.offsets.append(starts)
        self.width = column + len(self.segments)
        self._pool: tuple[list[int], np.ndarray] | None = None
        self._orders = [[_order(values) for _, values in s.space.params] for s in self.segments if s.space is not None]

    # -- positions --------------------------------------------------------------------------------------------

    def usable(self, position: int) -> bool:
        return position not in self.proposed and not self.exclude(position) and self.roster[position].eligible

    def _segment(self, position: int) -> tuple[int, Segment]:
        for n, segment in enumerate(self.segments):
            if segment.start <= position < segment.start + segment.size:
                return n, segment
        raise IndexError(position)

    def _digits(self, segment: Segment, position: int) -> list[int]:
        assert segment.space is not None
        rank, digits = position - segment.start, []
        for _, values in reversed(segment.space.params):
            rank, digit = divmod(rank, len(values))
            digits.append(digit)
        return digits[::-1]

    def _position(self, segment: Segment, digits: Sequence[int]) -> int:
        assert segment.space is not None
        rank = 0
        for (_, values), digit in zip(segment.space.params, digits, strict=True):
            rank = rank * len(values) + digit
        return segment.start + rank

    def _draw(self, taken: Sequence[int]) -> int | None:
        for _ in range(DRAWS_PER_CONFIG):
            ordinal = self.rng.randrange(self.total)
            for segment in self.segments:
                if ordinal < segment.size:
                    position = segment.start + ordinal
                    break
                ordinal -= segment.size
            if self.usable(position) and position not in taken:
                return position
        return None

    # -- the neighbourhood ------------------------------------------------------------------------------------

    def neighbours(self, position: int) -> list[int]:
        """Single-parameter moves (a step, doubling and halving, every value of a small parameter), then the
        repairs of the moves a restriction forbids."""
        n, segment = self._segment(position)
        assert segment.space is not None
        digits = self._digits(segment, position)
        moves = []
        for i, (_, values) in enumerate(segment.space.params):
            for digit in _moves(values, self._orders[n][i], digits[i]):
                moved = list(digits)
                moved[i] = digit
                moves.append(moved)
        small = [i for i, (_, values) in enumerate(segment.space.params) if 1 < len(values) <= 3]
        out = [self._position(segment, m) for m in moves]
        for moved, q in zip(moves, list(out), strict=True):
            if self.roster[q].eligible:
                continue
            for i in small:
                for digit in range(len(segment.space.params[i][1])):
                    if digit != moved[i]:
                        repaired = list(moved)
                        repaired[i] = digit
                        out.append(self._position(segment, repaired))
        return out

    # -- the model ----------------------------------------------------------------------------------------------

    def _features(self, positions: Sequence[int]) -> np.ndarray:
        rows = np.zeros((len(positions), self.width))
        for r, position in enumerate(positions):
            n, segment = self._segment(position)
            rows[r, self.width - len(self.segments) + n] = 1.0
            for start, digit in zip(self.offsets[n], self._digits(segment, position), strict=True):
                rows[r, start + digit] = 1.0
        return rows

    def _pool_features(self) -> tuple[list[int], np.ndarray]:
        if self._pool is None:
            pool: set[int] = set()
            for _ in range(POOL * 4):
                if len(pool) >= POOL:
                    break
                drawn = self._draw(())
                if drawn is not None:
                    pool.add(drawn)
            ordered = sorted(pool)
            self._pool = (ordered, self._features(ordered))
        return self._pool

    def _modelled(self, want: int, taken: Sequence[int]) -> list[int]:
        known = [(p, v) for p, v in self.results.items() if v is None or (v > 0 and math.isfinite(v))]
        logs = [math.log(v) for _, v in known if v is not None]
        if len(logs) < 5 or want <= 0:
            return []
        worst = max(logs) + 1.0  # a failure: a bad time, not an unknown one
        x = self._features([p for p, _ in known])
        y = np.array([math.log(v) if v is not None else worst for _, v in known])
        penalty = RIDGE * np.eye(self.width)
        weights = np.linalg.solve(x.T @ x + penalty, x.T @ y)
        pool, features = self._pool_features()
        picks: list[int] = []
        for j in np.argsort(features @ weights, kind="stable"):
            position = pool[int(j)]
            if self.usable(position) and position not in taken and position not in picks:
                picks.append(position)
                if len(picks) >= want:
                    break
        return picks

    # -- ask / tell ---------------------------------------------------------------------------------------------

    def ask(self, n: int) -> list[int]:
        want = min(n, self.left)
        out: list[int] = []
        while len(out) < want and len(self.proposed) + len(out) < self.init:
            drawn = self._draw(out)
            if drawn is None:
                break
            out.append(drawn)
        if len(out) < want and self.results:
            out.extend(self._modelled(round(MODEL_SHARE * (want - len(out))), out))
            ranked = sorted((v, p) for p, v in self.results.items() if v is not None)
            for _, parent in ranked:
                if len(out) >= want:
                    break
                for q in self.neighbours(parent):
                    if len(out) >= want:
                        break
                    if self.usable(q) and q not in out:
                        out.append(q)
        while len(out) < want:
            drawn = self._draw(out)
            if drawn is None:
                drawn = next((p for p in self._walk() if p not in out), None)
            if drawn is None:
                break
            out.append(drawn)
        self.proposed.update(out)
        self.left -= len(out)
        return out

    def _walk(self) -> list[int]:
        """Every usable position (the fallback of a nearly spent space), from a seeded start."""
        start = self.rng.randrange(self.total) if self.total else 0
        out = []
        for k in range(self.total):
            ordinal = (start + k) % self.total
            for segment in self.segments:
                if ordinal < segment.size:
                    position = segment.start + ordinal
                    break
                ordinal -= segment.size
            if self.usable(position):
                out.append(position)
                if len(out) >= 64:
                    break
        return out

    def adopt(self, positions: Sequence[int]) -> None:
        """Configs proposed for this search (a prior's, best first): never proposed again, counted against the
        limit; told, they are results like its own, so the model and the neighbourhood start from them."""
        fresh = [p for p in positions if p not in self.proposed]
        self.proposed.update(fresh)
        self.left -= len(fresh)

    def tell(self, results: Sequence[tuple[int, float | None]]) -> None:
        for position, ratio in results:
            self.results[position] = ratio


def _order(values: Sequence[object]) -> list[int]:
    """The indices of ``values`` in ascending order when all are numbers, else in declaration order."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sorted(range(len(values)), key=lambda i: values[i])  # type: ignore[arg-type,return-value]
    return list(range(len(values)))


def _moves(values: Sequence[object], order: list[int], digit: int) -> list[int]:
    """The digits one move away: every other value of a parameter with at most three; else a step either way
    in sorted order, and, for positive numbers, the values nearest to double and half."""
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
