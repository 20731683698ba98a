"""The trial protocol and the decision over its outcomes: the one code path shared by the in-process
controller (``engine``) and the farm (a worker runs the trials of one group, the coordinator decides).

:func:`reference_trials` and :func:`candidate_trials` run the protocol of docs/decisions.md; :func:`decide`
judges each :class:`Outcome` with :mod:`farm.scoring` and picks the winner (the loop: :mod:`farm.search`).
"""

from __future__ import annotations

import dataclasses
import enum
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from farm.errors import DeviceBusy, FailureKind, TuneFailure, ValidationUnavailable
from farm.identity import Candidate, fits_workspace
from farm.interference import Interference, Probe
from farm.policy import StackPolicy
from farm.runner import TrialRunner, Validation, output_check, throttle_probe
from farm.scoring import Pair, Selection, Standing, Verdict, assess, judge, look_sizes, valid_seconds


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
    """Raised when a candidate fails during its trials; :func:`failure_of` gives its verdict and note."""

    def __init__(self, verdict: TrialVerdict, note: str) -> None:
        super().__init__(note)
        self.verdict, self.note = verdict, note


@dataclass(frozen=True)
class Outcome:
    """What the trials of one candidate produced: its ``verdict`` (PASSED or UNVERIFIED when timed, from
    ``verified``, unless given), a ``note`` saying why when it failed, and the timed ``pairs`` to judge.
    ``index``: its position in the cache key's candidate list; ``budget_exhausted``: the budget or
    max_candidates cut it off; ``stop``: why sampling ended (``"decided"``, ``"max_samples"``, ``"budget"``);
    ``remeasured``: its pairs are a second sequence, taken after a win measured under interference."""

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
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**data, "pairs": [list(p) for p in self.pairs], "verdict": self.kind.value,
                "interference": self.interference.to_dict() if self.interference is not None else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        """Raises KeyError, TypeError or ValueError (an unknown verdict) for malformed data."""
        return cls(
            index=int(data["index"]), name=str(data["name"]), revision=str(data.get("revision", "")),
            pairs=tuple((float(r), float(c)) for r, c in data["pairs"]), verified=bool(data["verified"]),
            verdict=TrialVerdict(data["verdict"]), note=str(data.get("note", "")),
            budget_exhausted=bool(data.get("budget_exhausted", False)),
            max_abs_error=data.get("max_abs_error"), max_rel_error=data.get("max_rel_error"),
            stop=data.get("stop"), remeasured=bool(data.get("remeasured", False)),
            interference=Interference.from_dict(data["interference"]) if data.get("interference") else None,
        )


@dataclass(frozen=True)
class CandidateReport:
    """How one candidate fared in a search. ``samples``: its timing pairs (the reference: its own samples);
    ``note``: why it won, lost or was skipped; ``standing``: the scored :class:`~farm.scoring.Standing` value
    (None when not scored); ``interval``: the decided confidence bounds of its median ratio."""

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


def timed(runner: TrialRunner, index: int, name: str) -> float:
    """One timed run of a candidate: its seconds, or raises what :func:`failure_of` maps (bad time: REJECTED)."""
    value = runner.measure(index)
    if not valid_seconds(value):
        raise _Skip(TrialVerdict.REJECTED, f"{name!r} reported a non-positive or non-finite time ({value!r})")
    return float(value)


def reference_trials(runner: TrialRunner, policy: StackPolicy, reference: int, name: str) -> list[float]:
    """Warm up, self-validate and time the reference ``samples`` times. Raises ValidationUnavailable (output
    not checkable, validation required), TuneFailure DEVICE, or TuneFailure REJECTED (the reference fails)."""
    try:
        for _ in range(policy.warmups):
            timed(runner, reference, name)
        verdict = runner.validate(reference, reference, policy.tolerance)
        if verdict is Validation.UNSUPPORTED and policy.require_validation:
            raise ValidationUnavailable(name)
        return [timed(runner, reference, name) for _ in range(policy.samples)]
    except ValidationUnavailable:
        raise
    except Exception as e:
        failed, note = failure_of(e)  # a busy device and a DEVICE failure propagate
        detail = f"{failed.value}: {note}" if isinstance(e, _Skip) else note
        raise TuneFailure.rejected(f"reference {name!r} failed: {detail}") from e


def candidate_trials(
    runner: TrialRunner, policy: StackPolicy, reference: int, index: int, names: Sequence[str], deadline: float
) -> Outcome:
    """Warm up, validate against the reference, then take pairs alternating which runs first: ``samples``,
    more while undecided (up to ``max_samples``, within the budget); a win under interference is re-measured.
    A failure is the Outcome's verdict and note; only a busy device and a DEVICE failure propagate."""
    name = names[index]
    pairs: list[Pair] = []
    verified = budget_hit = remeasured = False
    errors: tuple[float | None, float | None] = (None, None)
    stop: str | None = None
    interference: Interference | None = None
    try:
        for _ in range(policy.warmups):
            timed(runner, index, name)
        verdict = runner.validate(reference, index, policy.tolerance)
        errors = _errors(runner)  # read only now: before its validation it is the previous candidate's
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
    return Outcome(index, name, tuple(pairs), verified, verdict_, note, budget_hit, *errors,
                   stop=stop, interference=interference, remeasured=remeasured)


def failure_of(error: Exception) -> tuple[TrialVerdict, str]:
    """The verdict and note of a candidate's trials that raised ``error``; a busy device and a DEVICE failure are
    not the candidate's: they propagate."""
    if isinstance(error, DeviceBusy) or (isinstance(error, TuneFailure) and error.kind is FailureKind.DEVICE):
        raise error
    if isinstance(error, TuneFailure):
        return TrialVerdict.REJECTED, error.message
    if isinstance(error, _Skip):
        return error.verdict, error.note
    return TrialVerdict.REJECTED, f"{type(error).__name__}: {error}"


def validation_trial(runner: TrialRunner, policy: StackPolicy, reference: int, index: int, name: str) -> Outcome:
    """Validate one candidate against the reference, its run serving as its warm-up (farm.racing): an Outcome
    without pairs, PASSED or UNVERIFIED, or the failure's verdict and note, as :func:`candidate_trials`."""
    try:
        verdict = runner.validate(reference, index, policy.tolerance)
        abs_error, rel_error = _errors(runner)
        if verdict is Validation.UNSUPPORTED and policy.require_validation:
            raise _Skip(TrialVerdict.SKIPPED, "validation unsupported (output readback above tolerance.max_bytes)")
    except Exception as e:
        failed, note = failure_of(e)
        return Outcome(index, name, verdict=failed, note=note)
    return Outcome(index, name, verified=verdict is Validation.PASSED, max_abs_error=abs_error,
                   max_rel_error=rel_error)


def _errors(runner: TrialRunner) -> tuple[float | None, float | None]:
    """(max_abs_error, max_rel_error) of the runner's latest output check; None when not compared or wrong."""
    check = output_check(runner)
    if check is None or check.problem is not None:
        return None, None
    return check.max_abs_error, check.max_rel_error


def _sequence(
    runner: TrialRunner, policy: StackPolicy, reference: int, index: int, names: Sequence[str], deadline: float
) -> tuple[list[Pair], str | None, Interference]:
    """One sequence of pairs: ``samples``, then more at each look while undecided. The stop reason is None when
    the budget ran out before ``samples`` pairs."""
    name, ref_name = names[index], names[reference]
    probe = Probe(throttle_probe(runner), host=not getattr(runner, "simulated", False))
    pairs: list[Pair] = []
    stop: str | None = "max_samples"
    for size in look_sizes(policy.samples, policy.sample_limit):
        while len(pairs) < size:
            if time.monotonic() > deadline:
                stop = "budget" if len(pairs) >= policy.samples else None
                break
            probe.begin()
            if len(pairs) % 2 == 0:
                r = timed(runner, reference, ref_name)
                c = timed(runner, index, name)
            else:
                c = timed(runner, index, name)
                r = timed(runner, reference, ref_name)
            probe.end()
            pairs.append((r, c))
        if len(pairs) < size:
            break
        if assess(pairs, policy).decided:
            stop = "decided"
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
    Only a decided FASTER verdict can win; each note ends with the pairs taken and why sampling stopped."""
    selection = Selection(reference, policy)
    judged: list[CandidateReport] = []
    for outcome in outcomes:
        failed = outcome.failure
        verdict = judge(outcome.pairs, policy) if failed is None else Verdict(False, None, None, failed)
        if verdict.wins and verdict.ratio is not None:
            selection.offer(outcome.index, verdict.ratio, outcome.verified)
        note = failed or verdict.note
        if failed is None and outcome.stop is not None:
            note += f"; {len(outcome.pairs)} pairs, stopped: {outcome.stop}"
            if outcome.remeasured:
                note += ", re-measured after interference"
            if outcome.interference is not None and outcome.interference.disturbed:
                note += f"; {outcome.interference.describe()}"
        score = verdict.score
        judged.append(CandidateReport(
            outcome.name, len(outcome.pairs), verdict.ratio, verdict.relative_mad, outcome.verified, note,
            outcome.pairs, outcome.index, score.standing.value if score is not None else None,
            (score.low, score.high) if score is not None and score.decided else None, outcome.stop, outcome.interference,
        ))
    winner = selection.index
    for i, j in enumerate(judged):
        if j.index == winner:
            judged[i] = dataclasses.replace(j, note=f"selected: {j.note}")
        elif j.standing == Standing.FASTER.value:
            judged[i] = dataclasses.replace(j, note=f"beaten: {j.note}, {names[winner]} is faster")
    return selection, judged
