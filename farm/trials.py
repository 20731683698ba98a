"""The trial protocol and the decision over its outcomes: the one code path shared by the in-process
controller (``engine``) and the farm (a worker runs the trials of one group, the coordinator decides).

- :func:`reference_trials`: warm up, validate the reference against itself, time it.
- :func:`candidate_trials`: warm up, validate against the reference, then PAIRS of (reference, candidate)
  timings alternating which runs first: at least ``samples``, and while the verdict is undecided more, at the
  looks of :func:`farm.scoring.look_sizes`, up to ``max_samples`` and within the budget. A win measured under
  interference above ``max_disturbed`` is re-measured once. Failures become an :class:`Outcome` with a
  :class:`TrialVerdict` and a note.
- :func:`decide`: judge every outcome in plan order with :mod:`farm.scoring` and pick the winner: only a decided
  FASTER verdict can win.

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

from farm.arrays import OutputCheck
from farm.errors import DeviceBusy, FailureKind, TuneFailure, ValidationUnavailable
from farm.identity import Candidate, fits_workspace
from farm.interference import Interference, Probe
from farm.policy import StackPolicy
from farm.runner import TrialRunner, Validation, output_check, throttle_probe
from farm.scoring import Pair, Selection, Standing, assess, judge, look_sizes, valid_seconds

# Why a candidate's sampling stopped: its verdict was decided, it reached max_samples, or the budget ran out.
STOP_DECIDED = "decided"
STOP_MAX_SAMPLES = "max_samples"
STOP_BUDGET = "budget"


class TrialVerdict(enum.Enum):
    """What the trials of one candidate came to. The value is the ``verdict`` column of trial rows (archives)."""

    PASSED = "passed"  # timed, output verified
    UNVERIFIED = "unverified"  # timed, output not verifiable (validation not required)
    REJECTED = "rejected"  # erred, wrong output, bad timing, or cut off by the budget mid-sampling
    SKIPPED = "skipped"  # not eligible, workspace, banned, or validation unsupported
    NOT_TRIED = "not tried"  # max_candidates, budget, or the group task's time limit stopped the search first
    DROPPED = "dropped"  # validated, then decided slower than the race's incumbent (farm.racing): never a winner
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
    cache key's candidate list; ``name`` and ``revision`` are its implementation identity. ``stop`` says why its
    sampling ended (``decided``, ``max_samples``, ``budget``), ``interference`` what disturbed its pairs, and
    ``remeasured`` whether its pairs are a second sequence, taken after a win measured under interference."""

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
    stop: str | None = None
    interference: Interference | None = None
    remeasured: bool = False

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
            "stop": self.stop,
            "interference": self.interference.to_dict() if self.interference is not None else None,
            "remeasured": self.remeasured,
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
            stop=data.get("stop"),
            interference=Interference.from_dict(data["interference"]) if data.get("interference") else None,
            remeasured=bool(data.get("remeasured", False)),
        )


@dataclass(frozen=True)
class CandidateReport:
    """How one candidate fared in a search: ``samples`` timing pairs (the reference: its own samples), the
    median ratio and relative MAD when scored, whether its output was verified, and the note saying why it won,
    lost or was skipped. ``index`` is its position in the candidate list. ``standing`` is the scored verdict
    (faster, not_faster, undecided; None when not scored), ``interval`` the confidence bounds of its median ratio,
    ``stop`` why its sampling ended and ``interference`` what disturbed its pairs."""

    name: str
    samples: int
    ratio: float | None
    relative_mad: float | None
    verified: bool
    note: str
    pairs: tuple[Pair, ...] = ()
    index: int = -1
    standing: str | None = None
    interval: tuple[float, float] | None = None
    stop: str | None = None
    interference: Interference | None = None


def seconds(value: float, name: str) -> float:
    if not valid_seconds(value):
        raise _Skip(TrialVerdict.REJECTED, f"{name!r} reported a non-positive or non-finite time ({value!r})")
    return float(value)


def reference_trials(runner: TrialRunner, policy: StackPolicy, reference: int, name: str) -> list[float]:
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
    except DeviceBusy:
        raise
    except (ValidationUnavailable, TuneFailure) as e:
        if isinstance(e, ValidationUnavailable) or e.kind is FailureKind.DEVICE:
            raise
        raise TuneFailure.rejected(f"reference {name!r} failed: {e.message}") from e
    except _Skip as e:
        raise TuneFailure.rejected(f"reference {name!r} failed: {e.verdict.value}: {e.note}") from e
    except Exception as e:
        raise TuneFailure.rejected(f"reference {name!r} failed: {type(e).__name__}: {e}") from e


def candidate_trials(
    runner: TrialRunner, policy: StackPolicy, reference: int, index: int, names: Sequence[str], deadline: float
) -> Outcome:
    """Warm up, validate against the reference, then take paired samples alternating which runs first: at least
    ``samples`` pairs, more while the verdict is undecided (up to ``max_samples``, within the budget).

    Returns an Outcome (verdict REJECTED or SKIPPED with a note when the candidate erred, was wrong,
    unverifiable or ran out of budget before ``samples`` pairs). Only a DEVICE failure propagates.
    """
    name = names[index]
    pairs: list[Pair] = []
    verified = False
    budget_hit = False
    check: OutputCheck | None = None
    stop: str | None = None
    interference: Interference | None = None
    remeasured = False
    try:
        for _ in range(policy.warmups):
            seconds(runner.measure(index), name)
        verdict = runner.validate(reference, index, policy.tolerance)
        # Only this candidate's own comparison: a failure before validation leaves the previous candidate's.
        check = output_check(runner)
        if verdict is Validation.UNSUPPORTED and policy.require_validation:
            raise _Skip(TrialVerdict.SKIPPED, "validation unsupported (output readback above tolerance.max_bytes)")
        verified = verdict is Validation.PASSED
        pairs, stop, interference = _sequence(runner, policy, reference, index, names, deadline)
        if stop is None:
            budget_hit = True
            raise _Skip(TrialVerdict.REJECTED, f"budget of {policy.budget:g}s exhausted during sampling")
        if interference.exceeds(policy.max_disturbed) and assess(pairs, policy).standing is Standing.FASTER:
            # A win measured while something else ran: measure it again, and let the second sequence decide.
            again, again_stop, again_interference = _sequence(runner, policy, reference, index, names, deadline)
            if again_stop is not None:
                pairs, stop, interference, remeasured = again, again_stop, again_interference, True
        verdict_, note = None, ""
    except Exception as e:
        verdict_, note = failure_of(e)
    checked = check if check is not None and check.problem is None else None
    return Outcome(index, name, tuple(pairs), verified, verdict_, note, budget_hit,
                   max_abs_error=checked.max_abs_error if checked is not None else None,
                   max_rel_error=checked.max_rel_error if checked is not None else None,
                   stop=stop, interference=interference, remeasured=remeasured)


def failure_of(error: Exception) -> tuple[TrialVerdict, str]:
    """The verdict and note of a candidate's trials that raised ``error``; a busy device and a DEVICE failure are
    not the candidate's: they propagate."""
    if isinstance(error, DeviceBusy):
        raise error
    if isinstance(error, TuneFailure):
        if error.kind is FailureKind.DEVICE:
            raise error
        return TrialVerdict.REJECTED, error.message
    if isinstance(error, _Skip):
        return error.verdict, error.note
    return TrialVerdict.REJECTED, f"{type(error).__name__}: {error}"


def validation_trial(runner: TrialRunner, policy: StackPolicy, reference: int, index: int, name: str) -> Outcome:
    """Validate one candidate against the reference, its run serving as its warm-up (racing, farm.racing): an
    Outcome without pairs, PASSED or UNVERIFIED, or the failure's verdict and note. Only a DEVICE failure
    propagates."""
    check: OutputCheck | None = None
    try:
        verdict = runner.validate(reference, index, policy.tolerance)
        check = output_check(runner)
        if verdict is Validation.UNSUPPORTED and policy.require_validation:
            raise _Skip(TrialVerdict.SKIPPED, "validation unsupported (output readback above tolerance.max_bytes)")
    except Exception as e:
        failed, note = failure_of(e)
        return Outcome(index, name, verdict=failed, note=note)
    checked = check if check is not None and check.problem is None else None
    return Outcome(index, name, verified=verdict is Validation.PASSED,
                   max_abs_error=checked.max_abs_error if checked is not None else None,
                   max_rel_error=checked.max_rel_error if checked is not None else None)


def timed(runner: TrialRunner, index: int, name: str) -> float:
    """One timed run of a candidate: its seconds, or raises what :func:`failure_of` maps (a bad time is REJECTED)."""
    return seconds(runner.measure(index), name)


def _sequence(
    runner: TrialRunner, policy: StackPolicy, reference: int, index: int, names: Sequence[str], deadline: float
) -> tuple[list[Pair], str | None, Interference]:
    """One sequence of pairs: ``samples``, then more at each look while undecided. The stop reason is None when
    the budget ran out before ``samples`` pairs."""
    name, ref_name = names[index], names[reference]
    probe = Probe(throttle_probe(runner), host=not getattr(runner, "simulated", False))
    pairs: list[Pair] = []
    stop: str | None = STOP_MAX_SAMPLES
    for size in look_sizes(policy.samples, policy.sample_limit):
        while len(pairs) < size:
            if time.monotonic() > deadline:
                stop = STOP_BUDGET if len(pairs) >= policy.samples else None
                break
            probe.begin()
            if len(pairs) % 2 == 0:
                r = seconds(runner.measure(reference), ref_name)
                c = seconds(runner.measure(index), name)
            else:
                c = seconds(runner.measure(index), name)
                r = seconds(runner.measure(reference), ref_name)
            probe.end()
            pairs.append((r, c))
        if len(pairs) < size:
            break
        if assess(pairs, policy).decided:
            stop = STOP_DECIDED
            break
    return pairs, stop, probe.result([r for r, _ in pairs])


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
    """Apply the selection rule to outcomes in plan order; return the winner and a judged entry per outcome.

    Only a decided FASTER verdict is offered to the selection; undecided and not-faster candidates keep their
    ratio in the report but never win. Each note ends with the pairs taken and why sampling stopped."""
    selection = Selection(reference, policy)
    judged: list[CandidateReport] = []
    for outcome in outcomes:
        if outcome.failure is not None:
            judged.append(CandidateReport(outcome.name, len(outcome.pairs), None, None, outcome.verified,
                                          outcome.failure, outcome.pairs, outcome.index,
                                          stop=outcome.stop, interference=outcome.interference))
            continue
        verdict = judge(outcome.pairs, policy)
        if verdict.wins and verdict.ratio is not None:
            selection.offer(outcome.index, verdict.ratio, outcome.verified)
        score = verdict.score
        judged.append(CandidateReport(
            outcome.name, len(outcome.pairs), verdict.ratio, verdict.relative_mad, outcome.verified,
            verdict.note + _sampling(outcome), outcome.pairs, outcome.index,
            score.standing.value if score is not None else None,
            (score.low, score.high) if score is not None and score.decided else None, outcome.stop, outcome.interference,
        ))
    winner = selection.index
    final = []
    for j in judged:
        note = j.note
        if j.index == winner:
            note = f"selected: {note}"
        elif j.standing == Standing.FASTER.value:
            note = f"beaten: {note}, {names[winner]} is faster"
        final.append(dataclasses.replace(j, note=note))
    return selection, final


def _sampling(outcome: Outcome) -> str:
    """The note's tail: how many pairs the verdict took, why sampling stopped, and any interference."""
    if outcome.stop is None:
        return ""
    text = f"; {len(outcome.pairs)} pairs, stopped: {outcome.stop}"
    if outcome.remeasured:
        text += ", re-measured after interference"
    if outcome.interference is not None and outcome.interference.disturbed:
        text += f"; {outcome.interference.describe()}"
    return text
