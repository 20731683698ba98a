"""The search: the one loop over candidates, shared by the in-process controller and the farm's group task.

:func:`admit` applies the rules that need no trial; :func:`search` tries candidates in order until the budget
runs out. The budget bounds a problem's whole search and is soft (docs/farm.md, "The budget").
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from farm.identity import Candidate
from farm.policy import StackPolicy
from farm.roster import Roster
from farm.runner import TrialRunner
from farm.trials import Outcome, TrialVerdict, candidate_trials, pre_trial_skip, reference_trials


def budget_note(budget: float) -> str:
    return f"budget of {budget:g}s exhausted"


def admit(candidates: Sequence[Candidate], reference: int, policy: StackPolicy,
          order: Iterable[int] | None = None, banned: Collection[str] = (),
          ) -> tuple[list[int], list[Outcome]]:
    """The positions (in ``order``, default list order) a search may try, and an Outcome for each other one:
    SKIPPED (not eligible, workspace, banned) or NOT_TRIED, ``budget_exhausted``, past ``max_candidates``
    (the reference counts one)."""
    admitted: list[int] = []
    refused: list[Outcome] = []
    for index in range(len(candidates)) if order is None else order:
        if index == reference:
            continue
        cand = candidates[index]
        note = pre_trial_skip(cand, policy, cand.name in banned)
        if note is not None:
            refused.append(Outcome(index, cand.name, verdict=TrialVerdict.SKIPPED, note=note, revision=cand.revision))
        elif len(admitted) + 1 >= policy.max_candidates:
            refused.append(Outcome(index, cand.name, verdict=TrialVerdict.NOT_TRIED, budget_exhausted=True,
                                   note=f"max_candidates {policy.max_candidates} reached", revision=cand.revision))
        else:
            admitted.append(index)
    return admitted, refused


@dataclass(frozen=True)
class Search:
    """One search's result: the reference's own timings, an Outcome per candidate given (in order), whether the
    budget stopped it early, and the seconds it charged to the budget."""

    reference_times: tuple[float, ...]
    outcomes: tuple[Outcome, ...]
    budget_exhausted: bool
    spent: float


def search(runner: TrialRunner, policy: StackPolicy, reference: int, candidates: Sequence[Candidate],
           positions: Iterable[int], *, budget: float | None = None, charge_reference: bool = True,
           banned: Collection[str] = (), stop: Callable[[], str | None] = lambda: None) -> Search:
    """Time the reference, then try ``positions`` in order within ``budget`` seconds (default the policy's).
    ``charge_reference`` counts the reference's timing against the budget (the first search of a problem);
    ``stop`` may give a reason to try no further candidate (the farm's task time limit): NOT_TRIED with it.
    Raises ValidationUnavailable (the reference's output cannot be checked), TuneFailure DEVICE, or
    TuneFailure REJECTED when the reference itself fails; every candidate failure is an Outcome."""
    names = candidates.names if isinstance(candidates, Roster) else [c.name for c in candidates]
    started = time.monotonic()
    reference_times = reference_trials(runner, policy, reference, names[reference])
    if not charge_reference:
        started = time.monotonic()
    deadline = started + (policy.budget if budget is None else budget)
    outcomes: list[Outcome] = []
    exhausted = False
    for index in positions:
        if index == reference:
            continue
        cand = candidates[index]
        note, verdict = pre_trial_skip(cand, policy, cand.name in banned), TrialVerdict.SKIPPED
        if note is None:
            note, verdict = stop(), TrialVerdict.NOT_TRIED
        if note is None and (exhausted or time.monotonic() > deadline):
            exhausted, note = True, budget_note(policy.budget)
        if note is not None:
            outcomes.append(Outcome(index, cand.name, verdict=verdict, note=note, revision=cand.revision,
                                    budget_exhausted=exhausted))
            continue
        outcome = candidate_trials(runner, policy, reference, index, names, deadline)
        exhausted = exhausted or outcome.budget_exhausted
        outcomes.append(dataclasses.replace(outcome, revision=cand.revision))
    return Search(tuple(reference_times), tuple(outcomes), exhausted, time.monotonic() - started)
