"""Partial decisions: a search the budget (or the run's stop) cut before every planned config was judged.

Such a decision is published (it is the best winner decided so far, and applications are served it), but its meta
says it is partial (``partial``: the configs not tried, why, and what changes it), every summary says so, and it
does not count as final: the next run of the same problem is not skipped as decided (``farm_coordinator.claims``)
but continues the search (``farm_coordinator.plan``: the earlier winner judged again, and only the configs the
earlier searches did not judge). The continuation's decision carries the earlier verdicts forward
(:func:`carried`), so repeated runs under the same budget judge every config eventually, and the last one is
final (``partial`` None) and, for a complete exhaustive search of a space, indexed under its family.

The rule depends on the outcomes alone (a NOT_TRIED verdict or a candidate whose trials the budget cut), never on
one cause: the per-problem budget, a group task's time limit or a run-level budget all make a decision partial.
Refusals made when the problem was planned (``max_candidates``, bans, the compile stage) do not: those are bounds
the user set, not a search that stopped early.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from farm.trials import Outcome, TrialVerdict

FIX = "raise budget in the catalog's [policy] table"
RUN_FIX = "raise --budget-device-seconds (or run_budget in the catalog's [policy] table)"
CONTINUES = "the next `farm tune` continues the search from these results"
NAMES_SHOWN = 5  # not-tried config names a one-line summary shows (the record lists them all)
_BUDGET = re.compile(r"^budget of ([0-9.eE+-]+)s exhausted")
_RUN_BUDGET = re.compile(r"^the run's budget of .* device seconds was spent")


def cut(outcomes: Iterable[Outcome], planned_out: Collection[str] = ()) -> list[Outcome]:
    """The outcomes of candidates the search did not finish judging: not tried, or cut mid-trial by the budget;
    ``planned_out``: names refused at planning time (never part of the search's cut)."""
    return [o for o in outcomes if o.name not in planned_out and o.index != 0
            and (o.verdict is TrialVerdict.NOT_TRIED or o.budget_exhausted)]


def reason_of(notes: Sequence[str]) -> tuple[str, str]:
    """(why the search stopped, what changes it) from the cut candidates' notes: the per-problem budget says
    ``the budget of 10 s ran out`` (fix: raise ``budget``), the run's device-second budget is quoted (fix: raise
    it); any other cause is quoted as it was recorded."""
    for note in notes:
        found = _BUDGET.match(note.removeprefix("not tried: "))
        if found:
            return f"the budget of {float(found.group(1)):g} s ran out", f"{FIX}; {CONTINUES}"
    for note in notes:
        if _RUN_BUDGET.match(note.removeprefix("not tried: ")):
            return note.removeprefix("not tried: "), f"{RUN_FIX}; {CONTINUES}"
    first = next((n for n in notes if n), "the search stopped early")
    return first.removeprefix("not tried: "), CONTINUES


def partial_meta(outcomes: Iterable[Outcome], planned_out: Collection[str] = ()) -> dict[str, Any] | None:
    """The record meta's ``partial`` (None for a search that judged every planned config): ``not_tried`` (every
    config the search did not finish judging, by name, in plan order), ``reason`` and ``fix``."""
    stopped = sorted(cut(outcomes, planned_out), key=lambda o: o.index)
    if not stopped:
        return None
    reason, fix = reason_of([o.note or o.failure or "" for o in stopped])
    return {"not_tried": [o.name for o in stopped], "reason": reason, "fix": fix}


def is_partial(meta: Mapping[str, Any]) -> bool:
    """Whether a record's meta says its search did not finish (a later run continues it)."""
    found = meta.get("partial")
    return isinstance(found, dict) and bool(found.get("not_tried"))


def judged_before(meta: Mapping[str, Any]) -> set[str]:
    """The candidates a partial decision's searches judged (its listed candidates, less those not tried): a
    continuation does not plan them again (the winner excepted: it is judged again)."""
    partial = meta.get("partial")
    missing = set(partial.get("not_tried") or ()) if isinstance(partial, dict) else set()
    return {str(c.get("name")) for c in meta.get("candidates", []) if isinstance(c, dict)
            and c.get("name") not in missing and not str(c.get("note", "")).startswith("not tried")}


def carried(meta: Mapping[str, Any], now: Collection[str]) -> list[dict[str, Any]]:
    """The earlier decision's verdicts a continuation keeps (``now``: the names this run judged, which replace
    theirs): each candidate entry as it was, with ``from_run`` naming the run that judged it."""
    done = judged_before(meta)
    return [{**c, "from_run": c.get("from_run") or meta.get("run")} for c in meta.get("candidates", [])
            if isinstance(c, dict) and c.get("name") in done and c.get("name") not in now]


def continuation_round(meta: Mapping[str, Any]) -> str:
    """The round a continuation of the partial decision ``meta`` runs under: its own (the problem's stored round
    holds the group results the partial decision was made from), the same for every coordinator that takes the
    continuation up and for a resumed one (its finished groups are reused), a new one once a decision replaced it."""
    return f"{meta.get('run')}-continued"


def describe(meta: Mapping[str, Any]) -> str:
    """One line for a summary: ``PARTIAL: the budget of 10 s ran out with 3 candidates not tried (a, b, c): raise
    budget ...``; empty for a final decision."""
    partial = meta.get("partial")
    if not is_partial(meta):
        return ""
    assert isinstance(partial, dict)
    names = [str(n) for n in partial["not_tried"]]
    shown = ", ".join(names[:NAMES_SHOWN]) + (f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else "")
    return (f"PARTIAL: {partial.get('reason')} with {len(names)} candidate{'s' if len(names) != 1 else ''} not tried "
            f"({shown}): {partial.get('fix')}")
