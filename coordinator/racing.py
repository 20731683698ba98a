"""The race's bookkeeping on the farm (``screening = "race"``): pure functions of a problem's stored group results.

A race's groups (``farm_workers.racing``) pair each config against the incumbent on the worker's own device and
report, per config, ``dropped`` (its verdict), ``promoted`` or ``contender`` (``GroupResult.standings``), with its
pairs (incumbent seconds, config seconds). :func:`race_state` derives from the stored results alone, whatever
order they arrived in, what the next group needs:

- each raced config's **estimated ratio** to the reference: its fastest run over the incumbent's fastest run on the
  same device, times the incumbent's own estimate (the reference's is 1; a listed candidate's is its judged ratio);
- the **incumbent**: of the configs decided faster than the incumbent they were paired with (and the listed
  candidates decided faster than the reference), the one with the lowest estimate (then the name); the reference
  when none is;
- the **noise**: the relative excesses (``farm.racing.excesses``) of the reference's runs and the incumbent's, each
  list over its own fastest run (one device per list), the latest ``NOISE_WINDOW`` of each side.

A restarted coordinator reads the same results and so rebuilds the same race. :func:`settled` is what aggregation
sees: a raced config's pairs are against an incumbent, not the reference, so every timed raced outcome is marked
``dropped`` (settled); the winner's verdict is its final group's, the full protocol against the reference, so only
a decided FASTER verdict against the reference that clears ``min_speedup`` wins (``farm.trials.decide``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from farm.policy import StackPolicy
from farm.racing import NOISE_WINDOW, excesses
from farm.scoring import judge
from farm.trials import TrialVerdict
from farm_fleet.protocol import STATUS_OK, GroupResult

PROMOTED = "promoted"
CONTENDER = "contender"
DROPPED = "dropped"
FAILED = "failed"
_FINAL = re.compile(r"final\.(\d+)\Z")


def final_group(position: int) -> str:
    """The group of the race winner's full trials against the reference: ``final.<position>``."""
    return f"final.{position}"


def parse_final(name: str) -> int | None:
    """The roster position of a final group's config, None for another group."""
    match = _FINAL.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class RaceState:
    """Where a problem's race stands: the incumbent (the reference's name at first) and whether a listed
    candidate's full verdict made it one (``seeded``: it needs no final group), each raced config's standing and
    estimated ratio to the reference (None: failed before any pair), and the noise the next group carries."""

    incumbent: str
    seeded: bool
    standings: Mapping[str, str]
    estimates: Mapping[str, float | None]
    noise: tuple[float, ...]


def is_race(result: GroupResult) -> bool:
    """Whether ``result`` is a race group's (its configs paired against an incumbent, not the reference)."""
    return result.status == STATUS_OK and result.incumbent is not None


def race_state(reference: str, results: Mapping[str, GroupResult], policy: StackPolicy) -> RaceState:
    """The race a problem's stored ``results`` (by group) show; see the module docstring."""
    ordered = [results[g] for g in sorted(results)]
    raced: dict[str, tuple[str, list[tuple[float, float]]]] = {}  # config -> (its incumbent, its pairs)
    standings: dict[str, str] = {}
    estimates: dict[str, float | None] = {reference: 1.0}
    eligible: set[str] = set()
    seeds: dict[str, list[float]] = {}
    for r in ordered:
        if r.status != STATUS_OK:
            continue
        for o in r.outcomes:
            if r.incumbent is None:  # a full verdict against the reference: a listed candidate may seed the race
                if parse_final(r.group) is None and o.failure is None and o.pairs:
                    verdict = judge(o.pairs, policy)
                    if verdict.wins and verdict.ratio is not None:
                        estimates[o.name] = verdict.ratio
                        eligible.add(o.name)
                        seeds[o.name] = [c for _, c in o.pairs]
                continue
            if o.verdict is TrialVerdict.DROPPED:
                standings[o.name] = DROPPED
            elif o.failure is not None:
                standings[o.name] = FAILED
            else:
                standings[o.name] = r.standings.get(o.name, CONTENDER)
            if o.pairs:
                raced[o.name] = (r.incumbent, list(o.pairs))
    changed = True
    while changed:  # each config's estimate once its incumbent's is known (incumbents came first)
        changed = False
        for name, (incumbent, pairs) in raced.items():
            base = estimates.get(incumbent)
            if name not in estimates and base is not None:
                estimates[name] = min(c for _, c in pairs) / min(i for i, _ in pairs) * base
                changed = True
    for name, standing in standings.items():
        estimates.setdefault(name, None)
        if standing == PROMOTED and estimates[name] is not None:
            eligible.add(name)
    ranked = sorted(eligible, key=lambda n: (estimates[n] or 0.0, n))
    incumbent = ranked[0] if ranked else reference
    return RaceState(incumbent, incumbent in seeds, standings, estimates,
                     _noise(reference, incumbent, ordered, raced, seeds))


def _noise(reference: str, incumbent: str, ordered: Sequence[GroupResult],
           raced: Mapping[str, tuple[str, list[tuple[float, float]]]], seeds: Mapping[str, list[float]]) -> tuple[float, ...]:
    """The excesses of the reference's runs and the incumbent's, each run list from one group (one device)."""
    reference_noise: list[float] = []
    incumbent_noise: list[float] = []
    for r in ordered:
        if r.status != STATUS_OK:
            continue
        if r.incumbent is None:
            reference_noise += excesses(r.reference_times)
            continue
        for o in r.outcomes:
            runs_against = [i for i, _ in o.pairs]
            if r.incumbent == reference:
                reference_noise += excesses(runs_against)
            elif r.incumbent == incumbent:
                incumbent_noise += excesses(runs_against)
    if incumbent != reference:
        own = seeds.get(incumbent) or [c for _, c in raced.get(incumbent, ("", []))[1]]
        incumbent_noise += excesses(own)
    return tuple(reference_noise[-NOISE_WINDOW:] + (incumbent_noise[-NOISE_WINDOW:] if incumbent != reference else []))


def settled(told: Mapping[str, GroupResult]) -> dict[str, GroupResult]:
    """``told`` as aggregation reads it: every timed outcome of a race's group marked ``dropped`` (settled; its
    pairs were against an incumbent), the final groups last, so the winner's verdict is its final one. Results
    without a race come back as they are."""
    if not any(is_race(r) for r in told.values()):
        return dict(told)
    finals = [g for g in told if parse_final(g) is not None]
    winner = next((o.name for g in finals for o in told[g].outcomes), None)
    kept = f"{winner!r} kept as the race's winner" if winner is not None else "the race kept the reference"
    out: dict[str, GroupResult] = {}
    for group, r in told.items():
        if group in finals:
            continue
        if is_race(r):
            r = dataclasses.replace(r, outcomes=tuple(
                o if o.failure is not None else dataclasses.replace(
                    o, verdict=TrialVerdict.DROPPED, stop="settled",
                    note=f"settled: {kept} ({r.standings.get(o.name, CONTENDER)} against {r.incumbent!r} after "
                         f"{len(o.pairs)} pairs)")
                for o in r.outcomes))
        out[group] = r
    for group in finals:
        out[group] = told[group]
    return out
