"""The run budget's allocator: which problem gets the next device-second (pure, no I/O).

A run with a budget in device seconds (``farm tune --budget-device-seconds N``, ``[policy] run_budget``) gives
each free device to the problem whose next device-second is expected to save the fleet the most time. Per problem
(a frozen :class:`Standing`, changed only through the :class:`Allocator`'s transitions):

- its **value** is its ``weight``: the fleet time it is worth per hour, relative (the catalog's weight,
  ``farm_coordinator.weights``: calls x seconds per call at the reference when known; default 1);
- its **saving** is ``value x (1 - ratio)``, ``ratio`` the best (selected / reference) its search found so far;
- its **expected rate** (:func:`expected_rate`), the weighted saving one more device-second is expected to buy, is
  ``value`` x the larger of two estimates of how fast its ratio falls, both scaled by the share of its space left:
  *backward*, the ratio its search gained over its last ``WINDOW`` results per device-second (TVM's task
  scheduler's gradient); *forward*, a search drawing from what is left of its space beats the best of its ``n``
  results with chance about ``1 / (n + 1)``, by about the factor its latest improvement gained (``step``, in log,
  plus ``OPTIMISM``), at its mean cost per result: improvements shrink as a search nears its floor, and a low ratio
  has less left to save in fleet time. A finished search's rate is 0. Improvements under ``SIGNIFICANT`` are noise.

Every problem first gets its reference measured and its cheapest evidence (``WARMUP`` results: the reference's
round and one more), least-served first, then in catalog order; only then does the ranking apply
(:func:`choose`). Every result re-estimates its problem (:meth:`Allocator.observe`). :func:`bought` says what the
spending bought: fleet seconds saved per hour, the share of the achievable saving, device seconds per problem.
``bench/fleet_budget.py`` and the coordinator (``farm_coordinator.runbudget``) use this same module.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

WARMUP = 2
"""Results every problem gets before the ranking applies: the reference's round and one round of evidence."""
WINDOW = 4
"""Results the backward estimate looks back over."""
OPTIMISM = 0.05
"""The ratio gain (5 % of the reference) a search that gained nothing yet may still find: its forward estimate."""
SIGNIFICANT = 0.01
"""A ratio counts as the new best only this much (1 %) below the best so far: closer is timing noise (a race's
estimates, from fastest runs, drift down that much by chance), which would look like a search still improving."""


@dataclass(frozen=True)
class Standing:
    """One problem as the allocator sees it. ``key`` names it, ``order`` its place in the catalog (ties);
    ``weight``: the fleet time it is worth per hour; ``reference_seconds``: the reference's seconds per call
    (None until measured: it is not warm before);
    ``ratio``: the best selected / reference ratio its search found so far (1.0: the reference);
    ``spent``: device seconds charged; ``results``: how many results it had; ``step``: the log of the factor its
    latest improvement gained (0 before any); ``history``: (spent, ratio) after
    each of the latest ``WINDOW + 1`` results, oldest first; ``left``: the share of its space not yet evaluated
    (0..1); ``finished``: its search ended."""

    key: str
    order: int = 0
    weight: float = 1.0
    reference_seconds: float | None = None
    ratio: float = 1.0
    spent: float = 0.0
    results: int = 0
    step: float = 0.0
    history: tuple[tuple[float, float], ...] = ()
    left: float = 1.0
    finished: bool = False

    @property
    def value(self) -> float:
        """The fleet time it is worth per hour at the reference: its weight."""
        return self.weight

    @property
    def saving(self) -> float:
        """Fleet seconds per hour its best so far saves against the reference."""
        return self.value * max(0.0, 1.0 - self.ratio)

    @property
    def warm(self) -> bool:
        """Whether it has its reference measured and its cheapest evidence (or its search ended)."""
        return self.finished or (self.reference_seconds is not None and self.results >= WARMUP)


def expected_rate(s: Standing) -> float:
    """The weighted saving (fleet seconds per hour) one more device-second on ``s`` is expected to buy; see the
    module docstring. 0 for a finished search or one with nothing left."""
    if s.finished or s.left <= 0.0 or not s.history or s.spent <= 0.0:
        return 0.0
    n = max(1, s.results)
    cost = s.spent / n
    ratio = min(1.0, s.ratio)
    forward = ratio * (s.step + OPTIMISM) / (n + 1) / cost
    start_spent, start_ratio = s.history[0]  # WINDOW results back, or the first
    backward = max(0.0, start_ratio - s.ratio) / (s.spent - start_spent) if s.spent > start_spent else 0.0
    return s.value * max(forward, backward) * min(1.0, s.left)


def choose(standings: Iterable[Standing]) -> Standing | None:
    """The problem that gets the next device-second among ``standings`` (those that have work to send): a
    problem not yet warm (least-served, then catalog order) first, else the largest expected rate (then catalog
    order); None when every one has finished."""
    open_ = [s for s in standings if not s.finished]
    if not open_:
        return None
    cold = [s for s in open_ if not s.warm]
    if cold:
        return min(cold, key=lambda s: (s.results, s.order))
    return min(open_, key=lambda s: (-expected_rate(s), s.order))


def achievable_gain(s: Standing) -> float:
    """An estimate of the ratio gain (1 - ratio) its whole search would reach: what it gained for a finished
    search; else what the draws left are expected to add, in log (new records of ``n`` draws out of ``N`` come
    about ``ln(N / n)`` times, each about its mean log gain per record so far: ``(ln(1 / ratio) + OPTIMISM) /
    ln(n + 1)``; a space of unknown size: as many records ahead as behind), at most the rest of the ratio."""
    ratio = min(1.0, s.ratio)
    n = s.results
    if s.finished or s.left <= 0.0 or n == 0:
        return 1.0 - ratio
    # The space's size unknown (a whole share left): as many records ahead as behind.
    records_left = math.log(1.0 / (1.0 - s.left)) if s.left < 1.0 else math.log(n + 1.0)
    extra = (math.log(1.0 / ratio) + OPTIMISM) * records_left / max(1.0, math.log(n + 1.0))
    return 1.0 - ratio * math.exp(-extra)


@dataclass(frozen=True)
class Bought:
    """What a budget bought: ``saved`` fleet seconds per hour (weighted) against the references, the
    ``achievable`` saving (estimated, or given), their ``share`` (None when nothing is achievable), the device
    seconds ``spent``, and per problem (key, device seconds, fleet seconds per hour saved), most spent first."""

    saved: float
    achievable: float
    share: float | None
    spent: float
    problems: tuple[tuple[str, float, float], ...]


def bought(standings: Iterable[Standing], achievable: Mapping[str, float] | None = None) -> Bought:
    """Sum what ``standings`` bought. ``achievable``: each problem's achievable ratio gain (1 - the best ratio of
    its space, when known: the bench's recorded optimum); else :func:`achievable_gain` estimates it."""
    items = list(standings)
    saved = sum(s.saving for s in items)
    reach = sum(s.value * max(achievable[s.key] if achievable is not None and s.key in achievable
                              else achievable_gain(s), max(0.0, 1.0 - s.ratio)) for s in items)
    problems = tuple(sorted(((s.key, s.spent, s.saving) for s in items), key=lambda p: (-p[1], p[0])))
    return Bought(saved, reach, saved / reach if reach > 0 else None, sum(s.spent for s in items), problems)


class Allocator:
    """The one owner of a run's standings: problems are added, charged and re-estimated through its named
    transitions; everything else reads frozen :class:`Standing` views."""

    def __init__(self) -> None:
        self._standings: dict[str, Standing] = {}

    def add(self, key: str, weight: float = 1.0) -> Standing:
        """A problem joins (in catalog order: the order it is added); one already known is left as it is."""
        if key not in self._standings:
            if not (math.isfinite(weight) and weight >= 0.0):
                raise ValueError(f"problem {key}: weight must be a finite number >= 0, got {weight!r}")
            self._standings[key] = Standing(key, len(self._standings), weight)
        return self._standings[key]

    def observe(self, key: str, seconds: float, *, reference_seconds: float | None = None,
                ratio: float | None = None, left: float | None = None) -> Standing:
        """A result of ``key``'s search: ``seconds`` it ran on a device, charged; the reference's seconds per
        call once measured, the best ratio it showed (the best so far is kept), the share of the space left."""
        s = self._standings[key]
        spent = s.spent + max(0.0, seconds)
        better = ratio is not None and math.isfinite(ratio) and 0.0 < ratio < s.ratio * (1.0 - SIGNIFICANT)
        best = ratio if better and ratio is not None else s.ratio
        reference = s.reference_seconds if reference_seconds is None or reference_seconds <= 0.0 else reference_seconds
        step = math.log(s.ratio / best) if best < s.ratio else s.step
        s = dataclasses.replace(s, spent=spent, ratio=best, reference_seconds=reference, results=s.results + 1, step=step,
                                history=(*s.history[-WINDOW:], (spent, best)),
                                left=s.left if left is None else min(1.0, max(0.0, left)))
        self._standings[key] = s
        return s

    def finish(self, key: str) -> Standing:
        """``key``'s search ended: nothing more to give it."""
        s = self._standings[key] = dataclasses.replace(self._standings[key], finished=True)
        return s

    def next(self, among: Collection[str] | None = None) -> str | None:
        """The key that gets the next device-second (:func:`choose`), among ``among`` (those with work ready)."""
        pool = self._standings.values() if among is None else (self._standings[k] for k in among
                                                               if k in self._standings)
        chosen = choose(pool)
        return chosen.key if chosen is not None else None

    def __getitem__(self, key: str) -> Standing:
        return self._standings[key]

    def __contains__(self, key: object) -> bool:
        return key in self._standings

    def standings(self) -> list[Standing]:
        """Every problem's standing, in the order they were added."""
        return list(self._standings.values())

    @property
    def spent(self) -> float:
        """Device seconds charged to every problem."""
        return sum(s.spent for s in self._standings.values())
