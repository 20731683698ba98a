"""The trial protocol and the decision over its outcomes: the one code path shared by the in-process
controller (``engine``) and the farm (a worker runs the trials of one group, the coordinator decides).

- :func:`reference_trials`: warm up, validate the reference against itself, time it.
- :func:`candidate_trials`: warm up, validate against the reference, then ``samples`` PAIRS of (reference,
  candidate) timings alternating which runs first. Failures become an :class:`Outcome` with a
  :class:`TrialVerdict` and a note.
- :func:`decide`: judge every outcome in plan order with :mod:`farm.scoring` and pick the winner.

The loop over candidates (budget, max_candidates) is :mod:`farm.search`.
"""

from __future__ import annotations

import dataclasses
import enum
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from farm.errors import FailureKind, TuneFailure, ValidationUnavailable
from farm.identity import Candidate, fits_workspace
from farm.policy import StackPolicy
from farm.scoring import Pair, Selection, judge, valid_seconds


class Validation(enum.Enum):
    """A validation verdict. A wrong output is never UNSUPPORTED: it raises a REJECTED failure."""

    PASSED = "passed"
    UNSUPPORTED = "unsupported"


class TrialVerdict(enum.Enum):
    """What the trials of one candidate came to. The value is the ``verdict`` column of trial rows (archives)."""

    PASSED = "passed"  # timed, output verified
    UNVERIFIED = "unverified"  # timed, output not verifiable (validation not required)
    REJECTED = "rejected"  # erred, wrong output, bad timing, or cut off by the budget mid-sampling
    SKIPPED = "skipped"  # not eligible, workspace, banned, or validation unsupported
    NOT_TRIED = "not tried"  # max_candidates, budget, or the group task's time limit stopped the search first
    GROUP_FAILED = "group failed"  # the farm lost the whole group (reference failed, attempts, timeout)

    @property
    def timed(self) -> bool:
        """Whether the candidate produced pairs to judge."""
        return self in (TrialVerdict.PASSED, TrialVerdict.UNVERIFIED)


class _Skip(Exception):
    """Raised when a candidate fails during its trials; private: it never leaves :func:`candidate_trials`, which
    turns it into the candidate's Outcome (verdict and note)."""

    def __init__(self, verdict: TrialVerdict, note: str) -> None:
        super().__init__(note)
        self.verdict = verdict
        self.note = note


@dataclass(frozen=True)
class Outcome:
    """What the trials of one candidate produced: its ``verdict`` (PASSED or UNVERIFIED when timed, from
    ``verified``, unless given) and a ``note`` saying why when it failed; timed ``pairs`` are judged.
    ``budget_exhausted`` marks a candidate the budget or max_candidates cut off. ``index`` is its position in the
    cache key's candidate list; ``name`` and ``revision`` are its implementation identity."""

    index: int
    name: str
    pairs: tuple[Pair, ...] = ()
    verified: bool = False
    verdict: TrialVerdict | None = None
    note: str = ""
    budget_exhausted: bool = False
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    revision: str = ""

    def __post_init__(self) -> None:
        if self.verdict is None:
            object.__setattr__(self, "verdict", TrialVerdict.PASSED if self.verified else TrialVerdict.UNVERIFIED)

    @property
    def kind(self) -> TrialVerdict:
        """The verdict (never None after construction)."""
        assert self.verdict is not None
        return self.verdict

    @property
    def failure(self) -> str | None:
        """``"<verdict>: <note>"`` when the candidate was not timed to the end, else None (the report's note)."""
        return None if self.kind.timed else f"{self.kind.value}: {self.note}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "revision": self.revision,
            "pairs": [list(p) for p in self.pairs],
            "verified": self.verified,
            "verdict": self.kind.value,
            "note": self.note,
            "budget_exhausted": self.budget_exhausted,
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        """Raises KeyError, TypeError or ValueError (an unknown verdict) for malformed data."""
        return cls(
            index=int(data["index"]),
            name=str(data["name"]),
            revision=str(data.get("revision", "")),
            pairs=tuple((float(r), float(c)) for r, c in data["pairs"]),
            verified=bool(data["verified"]),
            verdict=TrialVerdict(data["verdict"]),
            note=str(data.get("note", "")),
            budget_exhausted=bool(data.get("budget_exhausted", False)),
            max_abs_error=data.get("max_abs_error"),
            max_rel_error=data.get("max_rel_error"),
        )


@dataclass(frozen=True)
class CandidateReport:
    """How one candidate fared in a search: ``samples`` timing pairs (the reference: its own samples), the
    median ratio and relative MAD when scored, whether its output was verified, and the note saying why it won,
    lost or was skipped. ``index`` is its position in the candidate list."""

    name: str
    samples: int
    ratio: float | None
    relative_mad: float | None
    verified: bool
    note: str
    pairs: tuple[Pair, ...] = ()
    index: int = -1


def seconds(value: float, name: str) -> float:
    if not valid_seconds(value):
        raise _Skip(TrialVerdict.REJECTED, f"{name!r} reported a non-positive or non-finite time ({value!r})")
    return float(value)


def reference_trials(runner: Any, policy: StackPolicy, reference: int, name: str) -> list[float]:
    """Warm up, self-validate and time the reference ``samples`` times.

    Raises ValidationUnavailable when its output cannot be checked and validation is required, TuneFailure
    DEVICE for a device failure, and TuneFailure REJECTED when the reference itself fails.
    """
    try:
        for _ in range(policy.warmups):
            seconds(runner.measure(reference), name)
        verdict = runner.validate(reference, reference, policy.tolerance)
        if verdict is Validation.UNSUPPORTED and policy.require_validation:
            raise ValidationUnavailable(name)
        return [seconds(runner.measure(reference), name) for _ in range(policy.samples)]
    except (ValidationUnavailable, TuneFailure) as e:
        if isinstance(e, ValidationUnavailable) or e.kind is FailureKind.DEVICE:
            raise
        raise TuneFailure.rejected(f"reference {name!r} failed: {e.message}") from e
    except _Skip as e:
        raise TuneFailure.rejected(f"reference {name!r} failed: {e.verdict.value}: {e.note}") from e
    except Exception as e:
        raise TuneFailure.rejected(f"reference {name!r} failed: {type(e).__name__}: {e}") from e


def candidate_trials(
    runner: Any, policy: StackPolicy, reference: int, index: int, names: Sequence[str], deadline: float
) -> Outcome:
    """Warm up, validate against the reference, then take paired samples alternating which runs first.

    Returns an Outcome (verdict REJECTED or SKIPPED with a note when the candidate erred, was wrong,
    unverifiable or ran out of budget). Only a DEVICE failure propagates.
    """
    name, ref_name = names[index], names[reference]
    pairs: list[Pair] = []
    verified = False
    budget_hit = False
    check: Any = None
    try:
        for _ in range(policy.warmups):
            seconds(runner.measure(index), name)
        verdict = runner.validate(reference, index, policy.tolerance)
        # Only this candidate's own comparison: a failure before validation leaves the previous candidate's.
        check = getattr(runner, "last_check", None)
        if verdict is Validation.UNSUPPORTED and policy.require_validation:
            raise _Skip(TrialVerdict.SKIPPED, "validation unsupported (output readback above tolerance.max_bytes)")
        verified = verdict is Validation.PASSED
        for sample in range(policy.samples):
            if time.monotonic() > deadline:
                budget_hit = True
                raise _Skip(TrialVerdict.REJECTED, f"budget of {policy.budget:g}s exhausted during sampling")
            if sample % 2 == 0:
                r = seconds(runner.measure(reference), ref_name)
                c = seconds(runner.measure(index), name)
            else:
                c = seconds(runner.measure(index), name)
                r = seconds(runner.measure(reference), ref_name)
            pairs.append((r, c))
        verdict, note = None, ""
    except TuneFailure as e:
        if e.kind is FailureKind.DEVICE:
            raise
        verdict, note = TrialVerdict.REJECTED, e.message
    except _Skip as e:
        verdict, note = e.verdict, e.note
    except Exception as e:
        verdict, note = TrialVerdict.REJECTED, f"{type(e).__name__}: {e}"
    errors = (check.max_abs_error, check.max_rel_error) if check is not None and check.problem is None else (None, None)
    return Outcome(index, name, tuple(pairs), verified, verdict, note, budget_hit, *errors)


def pre_trial_skip(candidate: Candidate, policy: StackPolicy, banned: bool) -> str | None:
    """Why a candidate is not tried at all (ineligible, workspace, banned: verdict SKIPPED), or None."""
    if not candidate.eligible:
        return "not eligible"
    if not fits_workspace(candidate, policy):
        return f"workspace {candidate.workspace_bytes!r} does not fit limit {policy.workspace_limit}"
    if banned:
        return "banned for this key after a failure or regression"
    return None


def reference_noise(times: Sequence[float]) -> float:
    """Relative MAD of the reference's own timings."""
    median = statistics.median(times)
    return statistics.median(abs(t / median - 1.0) for t in times)


def decide(
    reference: int, names: Sequence[str], outcomes: Sequence[Outcome], policy: StackPolicy
) -> tuple[Selection, list[CandidateReport]]:
    """Apply the selection rule to outcomes in plan order; return the winner and a judged entry per outcome."""
    selection = Selection(reference, policy)
    judged: list[CandidateReport] = []
    cleared: set[int] = set()  # judged fast enough to win: "beaten" when another won
    for outcome in outcomes:
        if outcome.failure is not None:
            judged.append(CandidateReport(outcome.name, len(outcome.pairs), None, None, outcome.verified,
                                          outcome.failure, outcome.pairs, outcome.index))
            continue
        verdict = judge(outcome.pairs, policy)
        note = verdict.note
        if verdict.accepted and verdict.ratio is not None:
            selection.offer(outcome.index, verdict.ratio, outcome.verified)
            if verdict.ratio * policy.min_speedup <= 1.0:
                cleared.add(outcome.index)
        judged.append(CandidateReport(outcome.name, len(outcome.pairs), verdict.ratio, verdict.relative_mad,
                                      outcome.verified, note, outcome.pairs, outcome.index))
    winner = selection.index
    final = []
    for j in judged:
        note = j.note
        if j.index == winner:
            note = f"selected: {note}"
        elif j.index in cleared:
            note = f"beaten: {note}, {names[winner]} is faster"
        final.append(dataclasses.replace(j, note=note))
    return selection, final
