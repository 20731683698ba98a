"""Aggregation: group results -> one decision, by the same rule and code as the in-process controller
(``farm.trials.decide`` over ``farm.scoring``). Candidates are matched by name against the cache key's candidate
list the workers report; nothing here consults the kernel registry."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.environment import farm_version
from farm.keyroster import KeyRoster
from farm.policy import StackPolicy
from farm.scoring import Standing, judge
from farm.stores.archive.schema import TRIAL_FIELDS as ARCHIVE_TRIAL_FIELDS
from farm.stores.base import DecisionRecord
from farm.trials import CandidateReport, Outcome, TrialVerdict, decide
from farm_coordinator.partial import carried, partial_meta
from farm_coordinator.plan import PlannedProblem
from farm_coordinator.priors import fleet_meta
from farm_coordinator.racing import settled
from farm_fleet.protocol import (
    SET_DIFFERS,
    STATUS_NOT_TRIED,
    STATUS_OK,
    STATUS_VALIDATION_UNAVAILABLE,
    GroupResult,
)

# Every published record's meta carries exactly these fields, from Redis or from the embedded farm alike.
META_FIELDS = (
    "run", "problem_id", "operation", "device_kind", "spec", "fingerprint", "reference", "relative_mad", "samples",
    "accuracy_key", "farm_version", "workers", "candidates", "tuned_by", "confirmation", "confirmed_by",
    "confirmation_ratio", "rejected_winner", "device_seconds", "compile_seconds", "partial", "continues",
)
# The search's cost (SEMANTICS, "device seconds are the cost"): ``device_seconds``, what its groups' runs took on
# their devices (every group and the confirmation: validation, warm-ups, timed runs); ``compile_seconds``, what the
# run's compile stage charged to this problem (a replay target's recorded compile time, ``farm_coordinator.
# precompile``; 0 when the stage's time cannot be told per problem: the run's summary has it then).
# ``partial``: None for a search that judged every planned candidate, else what the budget (or the run's stop) left
# not tried, why and what changes it (``farm_coordinator.partial``); ``continues``: the run whose partial decision
# this search continued (its verdicts are carried forward in ``candidates``, each with ``from_run``), or None.
# A problem tuned over a space adds the search's effort (as the in-process search records it, farm.spacesearch):
# the run's strategy, seed and max_configs, the space configs judged and how many its spaces declare, the value
# lists a complete search covered (None: not complete), the winner's name and whether the search was incremental
# (a grown space: only the configs its family's earlier search lacked, against the stored winner).
# With the fleet priors' members (farm_coordinator.priors.fleet_meta): the family's id across fingerprints, the
# priors the search started from and its best configs ranked, what another SKU's search reads.
SPACE_FIELDS = ("strategy", "seed", "max_configs", "evaluated", "space_size", "covered", "winner", "incremental",
                "fleet_family", "priors", "ranked")


@dataclass(frozen=True)
class Aggregate:
    """A problem's verdict. ``record`` is None when nothing can be published (every group failed, or
    validation is unavailable); ``error`` then says why. ``judged`` lists every candidate with its note.
    ``budget_exhausted``: the budget or ``max_candidates`` stopped the problem's search early. ``results``: the
    group results it was decided from (plan order); ``confirmation``: the second device's result, once applied.
    Frozen, and no function here changes anything it is given: each step returns a new Aggregate."""

    problem: PlannedProblem
    record: DecisionRecord | None
    judged: tuple[CandidateReport, ...]
    winner: str | None
    ratio: float | None
    error: str | None
    trial_seconds: float
    winner_worker: str | None = None
    budget_exhausted: bool = False
    results: Mapping[str, GroupResult] = field(default_factory=dict)
    confirmation: GroupResult | None = None
    compile_seconds: float = 0.0

    @property
    def device_seconds(self) -> float:
        """Seconds its groups (and its confirmation, once applied) ran on their devices."""
        groups = sum(r.device_seconds for r in self.results.values())
        return groups + (self.confirmation.device_seconds if self.confirmation is not None else 0.0)


def aggregate(problem: PlannedProblem, told: Mapping[str, GroupResult], policy: StackPolicy, run: str,
              asked: Mapping[str, tuple[tuple[str, str], ...]] | None = None, compile_seconds: float = 0.0) -> Aggregate:
    """The decision of a problem from its group results ``told`` (every group of its search answered), by the
    in-process rule. ``asked``: the candidates of groups the plan does not name (a strategy's own groups).
    ``compile_seconds``: what the run's compile stage charged to this problem (its meta records it)."""
    raw, told = told, settled(told)  # a race's configs: dropped unless the winner's final verdict (farm_coordinator.racing)
    planned = [t.group for t in problem.tasks]
    order = [g for g in planned if g in told] + [g for g in told if g not in planned]
    by_group: dict[str, GroupResult] = {g: told[g] for g in order}
    results: list[GroupResult] = list(by_group.values())
    failed = functools.partial(_failure, problem, by_group, compile_seconds)
    trial_seconds = sum(r.trial_seconds for r in results)
    ok = [r for r in results if r.status == STATUS_OK]
    if any(r.status == STATUS_VALIDATION_UNAVAILABLE for r in results):
        return failed("validation unavailable: the reference output cannot be read back", trial_seconds)
    refused = next((r for r in results if r.status != STATUS_OK and (r.error or "").startswith(SET_DIFFERS)), None)
    if refused is not None:  # a search over another set than the coordinator's: no decision, whatever else ran
        return failed(f"a worker refused group {refused.group}: {str(refused.error)[len(SET_DIFFERS):]}", trial_seconds)
    if not ok:
        errors = "; ".join(f"{r.group}: {r.error}" for r in results)
        return failed(f"every group failed ({errors})", trial_seconds)
    keys = {r.cache_key for r in ok}
    if len(keys) != 1:
        return failed("groups disagree on the cache key (mixed builds?)", trial_seconds)
    first = ok[0]
    # A worker lists the key's candidate names, except for a roster too long to send (a large space): then
    # they are computed from the key (farm.keyroster), a space's configs unranked from its descriptor.
    listed = {name: i for i, name in enumerate(first.names)}
    roster = KeyRoster.of_key(first.cache_key) if not first.names and first.cache_key else None
    names: Sequence[str] = roster.names if roster is not None else first.names
    position = _Positions(listed, roster)
    outcomes: dict[int, Outcome] = {}
    worker_of: dict[int, str] = {}
    for r in ok:
        for o in r.outcomes:
            outcomes[o.index] = o
            worker_of[o.index] = str(r.provenance.get("worker", ""))
    for r in results:
        if r.status != STATUS_OK:
            task = problem.task(r.group)
            candidates = task.candidates if task is not None else (asked or {}).get(r.group, ())
            not_tried = r.status == STATUS_NOT_TRIED
            verdict = TrialVerdict.NOT_TRIED if not_tried else TrialVerdict.GROUP_FAILED
            for name, revision in candidates:
                if name in position and position[name] != 0:
                    outcomes[position[name]] = Outcome(position[name], name, verdict=verdict, note=str(r.error),
                                                       budget_exhausted=not_tried, revision=revision)
    for o in problem.skipped:
        if o.name in position:
            outcomes[position[o.name]] = dataclasses.replace(o, index=position[o.name])
    budget_exhausted = any(o.budget_exhausted for o in outcomes.values())
    selection, judged = decide(0, names, [outcomes[i] for i in sorted(outcomes)], policy)
    winner = selection.index
    ratio_mad = next((j.relative_mad for j in judged if j.index == winner), None)
    samples = next((j.samples for j in judged if j.index == winner), len(first.reference_times))
    partial = partial_meta(outcomes.values(), {o.name for o in problem.skipped})
    earlier = carried(problem.continues, {j.name for j in judged}) if problem.continues is not None else []
    meta: dict[str, Any] = {
        "run": run,
        "problem_id": problem.problem_id,
        "operation": problem.workload.operation,
        "device_kind": problem.target.device_kind,
        "spec": problem.workload.spec,
        "fingerprint": problem.target.digest,
        "reference": names[0],
        "relative_mad": ratio_mad,
        "samples": samples,
        "accuracy_key": policy.accuracy_key(),
        "farm_version": farm_version(),
        "workers": sorted({str(r.provenance.get("worker", "")) for r in ok}),
        "candidates": [
            {"name": j.name, "ratio": j.ratio, "relative_mad": j.relative_mad, "verified": j.verified, "note": j.note,
             "pairs": len(j.pairs), "standing": j.standing, "interval": list(j.interval) if j.interval else None,
             "stop": j.stop, "interference": j.interference.to_dict() if j.interference is not None else None}
            for j in judged
        ] + earlier,
        "tuned_by": worker_of.get(winner),
        "confirmation": None,
        "confirmed_by": None,
        "confirmation_ratio": None,
        "rejected_winner": None,
        "device_seconds": sum(r.device_seconds for r in results),
        "compile_seconds": compile_seconds,
        "partial": partial,
        "continues": problem.continues.get("run") if problem.continues is not None else None,
    }
    assert set(meta) == set(META_FIELDS)
    assert first.cache_key is not None
    planned_out = {o.name for o in problem.skipped}  # banned, or rejected by the compile stage: never timed
    prior = problem.family.prior if problem.family is not None else None
    if prior is not None:
        planned_out.add(prior.winner)  # judged again, not evaluated anew (as in-process)
    effort = space_effort(first.cache_key, [o for o in outcomes.values() if o.name not in planned_out], policy,
                          [str(c["name"]) for c in earlier])
    if effort and problem.family is not None:
        complete = (policy.strategy == "exhaustive" and not budget_exhausted and partial is None
                    and (policy.max_configs is None or effort["evaluated"] < policy.max_configs)
                    and all(o.verdict is not TrialVerdict.GROUP_FAILED for o in outcomes.values()))
        effort.update(covered=problem.family.covered if complete else None, winner=names[winner],
                      incremental=prior is not None)
        effort.update(fleet_meta(problem, names[0], raw, judged, policy))
    meta.update(effort)
    record = DecisionRecord(cache_key=first.cache_key, index=winner, reference_index=0, name=names[winner],
                            verified=selection.verified, ratio=selection.ratio, created=time.time(), meta=meta)
    return Aggregate(problem, record, tuple(judged), names[winner], selection.ratio, error=None,
                     trial_seconds=trial_seconds, winner_worker=worker_of.get(winner), budget_exhausted=budget_exhausted,
                     results=by_group, compile_seconds=compile_seconds)


def space_effort(cache_key: str, outcomes: Iterable[Outcome], policy: StackPolicy,
                 before: Iterable[str] = ()) -> dict[str, Any]:
    """The :data:`SPACE_FIELDS` of a decision over a key with spaces (none for a plain list): the configs judged
    are those of ``outcomes`` (the trials' outcomes) the budget did not cut (``not tried``), plus the configs among
    ``before`` (the names a continued partial decision judged, ``farm_coordinator.partial.carried``)."""
    try:
        roster = KeyRoster.of_key(cache_key)
    except ValueError:
        return {}
    size = roster.space_size
    if not size:
        return {}
    evaluated = sum(1 for o in outcomes if roster.in_space(o.index) and o.verdict is not TrialVerdict.NOT_TRIED)
    evaluated += sum(1 for name in before if (at := roster.position(name)) is not None and roster.in_space(at))
    return {"strategy": policy.strategy, "seed": policy.seed, "max_configs": policy.max_configs,
            "evaluated": evaluated, "space_size": size}


def _failure(problem: PlannedProblem, results: Mapping[str, GroupResult], compile_seconds: float, error: str,
             trial_seconds: float) -> Aggregate:
    return Aggregate(problem, None, (), None, None, error, trial_seconds, results=results,
                     compile_seconds=compile_seconds)


TRIAL_FIELDS = ARCHIVE_TRIAL_FIELDS  # the trial row's fields: defined once, with their types, by the archive schema


def trial_rows(agg: Aggregate) -> list[dict[str, Any]]:
    """Every timing pair and verdict behind a problem's decision, with provenance: one row per pair (a
    candidate that produced none gets one row with ``pair`` None); the reference's own samples have role
    "reference". Confirmation trials have role "confirmation"."""
    notes = {j.name: j.note for j in agg.judged}
    rows: list[dict[str, Any]] = []
    results = list(agg.results.values())
    if agg.confirmation is not None:
        results.append(agg.confirmation)
    for r in results:
        p = r.provenance
        base = {"run": r.run, "problem_id": r.problem_id, "group": r.group, "host": p.get("host"),
                "device": p.get("device"), "worker": p.get("worker"), "attempt": p.get("attempt")}
        role = "confirmation" if r.group == "confirm" else "candidate"
        if r.status != STATUS_OK:
            verdict = TrialVerdict.NOT_TRIED if r.status == STATUS_NOT_TRIED else TrialVerdict.GROUP_FAILED
            rows.append({**base, "role": role, "candidate": None, "candidate_index": None, "verdict": verdict.value,
                         "note": r.error, "pair": None, "reference_seconds": None, "candidate_seconds": None,
                         "max_abs_error": None, "max_rel_error": None})
            continue
        reference = r.names[0] if r.names else (KeyRoster.of_key(r.cache_key).name(0) if r.cache_key else None)
        for i, t in enumerate(r.reference_times):
            rows.append({**base, "role": "reference", "candidate": reference, "candidate_index": 0,
                         "verdict": "reference", "note": "reference sample", "pair": i, "reference_seconds": t,
                         "candidate_seconds": None, "max_abs_error": None, "max_rel_error": None})
        for o in r.outcomes:
            note = o.failure or notes.get(o.name, "")
            common = {**base, "role": role, "candidate": o.name, "candidate_index": o.index, "verdict": o.kind.value,
                      "note": note, "max_abs_error": o.max_abs_error, "max_rel_error": o.max_rel_error}
            if not o.pairs:
                rows.append({**common, "pair": None, "reference_seconds": None, "candidate_seconds": None})
            for i, (ref_s, cand_s) in enumerate(o.pairs):
                rows.append({**common, "pair": i, "reference_seconds": ref_s, "candidate_seconds": cand_s})
    rows += rejected_rows(agg, results[0].run if results else "")
    return rows


def rejected_rows(agg: Aggregate, run: str) -> list[dict[str, Any]]:
    """One row (group ``compile``, no pair) per config the compile stage rejected before any group was sent
    (``farm_coordinator.precompile``): its verdict is on record with the trials, though no worker saw it."""
    index = {j.name: j.index for j in agg.judged}
    return [{"run": run, "problem_id": agg.problem.problem_id, "group": "compile", "host": None, "device": None,
             "worker": None, "attempt": None, "role": "candidate", "candidate": o.name,
             "candidate_index": index.get(o.name, o.index), "verdict": o.kind.value, "note": o.failure, "pair": None,
             "reference_seconds": None, "candidate_seconds": None, "max_abs_error": None, "max_rel_error": None}
            for o in agg.problem.skipped if o.verdict is TrialVerdict.REJECTED]


def confirm(agg: Aggregate, result: GroupResult, policy: StackPolicy) -> Aggregate:
    """Apply a second device's trials of the winner. The winner is confirmed only when they reproduce its
    verdict: validated, a decided win that clears min_speedup, a ratio within the first verdict's noise band
    (its interval widened by ``max_relative_mad`` each way) and pairs not disturbed beyond ``max_disturbed``.

    A contradiction (wrong output there, or decided not faster) keeps the reference, with the reason and the
    rejected winner in the meta. Anything else that fails to reproduce (undecided, out of band, disturbed, a
    failed task) publishes the winner unconfirmed, or nothing when the policy requires confirmation."""
    record = agg.record
    assert record is not None
    agg = dataclasses.replace(agg, confirmation=result)
    outcome = result.outcomes[0] if result.status == STATUS_OK and result.outcomes else None
    contradicted = None
    reason = None
    confirmed_ratio = None
    if result.cache_key != record.cache_key:
        reason = "confirmation ran under a different cache key"
    elif outcome is None:
        reason = f"confirmation failed: {result.error or 'no outcome'}"
    elif outcome.failure is not None:
        failure = f"confirmation failed: {outcome.failure}"
        # Running out of budget there says nothing about the winner; anything else the second device saw does.
        contradicted, reason = (None, failure) if outcome.budget_exhausted else (failure, None)
    else:
        verdict = judge(outcome.pairs, policy)
        confirmed_ratio = verdict.ratio
        low, high = next((j.interval for j in agg.judged if j.name == record.name and j.interval), (record.ratio, record.ratio))
        slack = 1.0 + policy.max_relative_mad
        if verdict.score is not None and verdict.score.standing is Standing.NOT_FASTER:
            contradicted = f"confirmation failed: {verdict.note}"
        elif policy.require_validation and not outcome.verified:
            contradicted = "confirmation failed: not verified on the second device"
        elif not verdict.wins or verdict.ratio is None or verdict.ratio * policy.min_speedup > 1.0:
            reason = f"confirmation did not decide a win: {verdict.note}"
        elif not low / slack <= verdict.ratio <= high * slack:
            reason = (f"confirmation ratio {verdict.ratio:.3f} is outside the first verdict's band "
                      f"[{low / slack:.3f}, {high * slack:.3f}]")
        elif outcome.interference is not None and outcome.interference.exceeds(policy.max_disturbed):
            reason = f"confirmation measured under interference: {outcome.interference.describe()}"
    meta = dict(record.meta)
    meta["confirmed_by"] = result.provenance.get("worker")
    meta["confirmation_ratio"] = confirmed_ratio
    meta["device_seconds"] = float(meta.get("device_seconds") or 0.0) + result.device_seconds
    extra = result.trial_seconds
    if contradicted is not None:
        meta["confirmation"] = contradicted
        meta["rejected_winner"] = record.name
        if "winner" in meta:  # a space search's record names its winner: the reference now
            meta["winner"] = str(meta["reference"])
        reference = dataclasses.replace(record, index=0, reference_index=0, name=str(meta["reference"]), verified=True,
                                        ratio=1.0, meta=meta)
        return _replace(agg, reference, reference.name, 1.0, extra)
    if reason is not None:
        kept = dataclasses.replace(record, reference_index=0, meta=meta)
        return unconfirmed(_replace(agg, kept, agg.winner, agg.ratio, extra), policy, f"unconfirmed: {reason}")
    meta["confirmation"] = "confirmed"
    confirmed = dataclasses.replace(record, reference_index=0, meta=meta)
    return _replace(agg, confirmed, agg.winner, agg.ratio, extra)


def unconfirmed(agg: Aggregate, policy: StackPolicy,
                reason: str = "unconfirmed: no second device of this fingerprint online") -> Aggregate:
    """The winner without a confirmation: published with the reason in its meta, or, when the policy requires
    confirmation, not published at all (``record`` None and ``error`` saying why)."""
    assert agg.record is not None
    r = agg.record
    if policy.require_confirmation:
        return dataclasses.replace(agg, record=None, winner=None, ratio=None, error=f"not published: {reason}")
    meta = dict(r.meta, confirmation=reason)
    return dataclasses.replace(agg, record=dataclasses.replace(r, meta=meta))


def _replace(agg: Aggregate, record: DecisionRecord, winner: str | None, ratio: float | None, extra_seconds: float) -> Aggregate:
    return dataclasses.replace(agg, record=record, winner=winner, ratio=ratio,
                               trial_seconds=agg.trial_seconds + extra_seconds)


class _Positions:
    """``name in positions`` and ``positions[name]``: the listed names' positions, or the key roster's."""

    def __init__(self, listed: dict[str, int], roster: KeyRoster | None) -> None:
        self.listed, self.roster = listed, roster

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __getitem__(self, name: str) -> int:
        found = self.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def get(self, name: str) -> int | None:
        return self.listed.get(name) if self.roster is None else self.roster.position(name)
