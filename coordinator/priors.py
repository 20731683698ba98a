"""Fleet priors on the farm (``farm.priors``): what a spaced decision keeps for another SKU's search, and where a
run finds other fingerprints' decisions of a problem's family.

- :func:`fleet_meta`: a spaced decision's meta names its family across fingerprints (``fleet_family``, what the
  lookups find it by), the priors its search started from (``priors``: their fingerprint digests, as the in-process
  search names its own) and its best ``farm.priors.RANKED`` configs with their estimated ratios to the reference
  (``ranked``: judged ratios for full verdicts, the race's estimates for raced configs), exactly as
  ``farm.spacesearch.space_meta`` does in process.
- :class:`PriorTiers`: the run's lookup (``farm_coordinator.plan.FleetPriors``) over stores that answer
  ``priors(family, exclude, limit)``: the decision store the run publishes to (``RedisDecisions``, the embedded
  farm's ``LocalStore``), then archive directories (``ArchiveStore``); at most ``limit`` fingerprints in all, the
  first tier's record for a fingerprint found in two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from farm.policy import StackPolicy
from farm.priors import RANKED, ranked
from farm.stores.base import DecisionRecord
from farm.trials import CandidateReport
from farm_coordinator.plan import PlannedProblem
from farm_coordinator.racing import is_race, race_state
from farm_fleet.protocol import GroupResult


def fleet_meta(problem: PlannedProblem, reference: str, told: Mapping[str, GroupResult],
               judged: Sequence[CandidateReport], policy: StackPolicy) -> dict[str, Any]:
    """The fleet-priors members of a spaced decision's meta (none for a problem without spaces); ``told``: its group
    results as the workers sent them (before ``farm_coordinator.racing.settled``), ``judged``: its verdicts."""
    family = problem.family
    if family is None:
        return {}
    estimates: dict[str, float | None] = {j.name: j.ratio for j in judged if j.stop != "settled"}
    if any(is_race(r) for r in told.values()):  # a raced config's pairs were against an incumbent: its estimate
        estimates = {**race_state(reference, told, policy).estimates,
                     **{n: r for n, r in estimates.items() if r is not None}}
    return {"fleet_family": family.fleet_id, "priors": [s.name for s in family.fleet_priors],
            "ranked": [[n, r] for n, r in ranked(estimates, reference, RANKED)]}


class PriorTier(Protocol):
    def priors(self, family: str, exclude: str, limit: int) -> list[tuple[str, DecisionRecord]]: ...


class PriorTiers:
    """Other fingerprints' decisions of a family from several stores (see the module docstring)."""

    def __init__(self, tiers: Sequence[PriorTier]) -> None:
        self.tiers = tuple(tiers)

    def __call__(self, family: str, exclude: str, limit: int) -> list[tuple[str, DecisionRecord]]:
        found: dict[str, DecisionRecord] = {}
        for tier in self.tiers:
            if len(found) >= limit:
                break
            for digest, record in tier.priors(family, exclude, limit):
                if digest != exclude and digest not in found and len(found) < limit:
                    found[digest] = record
        return sorted(found.items())


def run_lookup(sink: object, enabled: bool = True, archives: Sequence[str] = ()) -> PriorTiers | None:
    """A run's fleet-priors lookup: its sink's store (when it answers ``priors``), then ``archives`` (directories
    of ``farm archive export``); None when switched off (``farm tune --no-priors``) or nothing answers."""
    if not enabled:
        return None
    tiers: list[PriorTier] = [sink] if callable(getattr(sink, "priors", None)) else []  # type: ignore[list-item]
    if archives:
        from farm.stores.archive.store import ArchiveStore

        tiers.append(ArchiveStore(*archives))
    return PriorTiers(tiers) if tiers else None
