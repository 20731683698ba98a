"""The controller's selection rules (the contract's steps 1, 3 and 7-9), driven by a scripted fake runner."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import (
    C,
    P,
    tuner_with,
)
from fakes import FakeRunner, candidates, problem

from farm.engine import Decision, DecisionSource, StackTuner, Stats, Validation
from farm.errors import FailureKind, TuneFailure
from farm.identity import Candidate
from farm.policy import Mode, StackPolicy

# -- the happy path ----------------------------------------------------------------------------------------


def test_a_faster_candidate_is_tuned_then_served_from_memory_without_any_runner_call() -> None:
    tuner = tuner_with()
    first = tuner.select(P, C, 0, FakeRunner({0: 1.0, 1: 0.5, 2: 0.8}))
    assert first == Decision(1, 0, "a", DecisionSource.TUNED, True, 0.5, first.cache_key)
    idle = FakeRunner()
    again = tuner.select(P, C, 0, idle)
    assert again == first._replace(source=DecisionSource.MEMORY_CACHE)
    assert idle.calls == []
    assert tuner.stats() == Stats(memory_hits=1, misses=1, tunes=1)


def test_a_decision_is_a_named_tuple_carrying_its_cache_key() -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner())
    assert isinstance(decision, tuple)
    assert decision._fields == ("index", "reference_index", "name", "source", "verified", "ratio", "cache_key")
    assert decision.cache_key == tuner.request(P, C, 0).key


def test_the_report_notes_the_winner_the_beaten_and_the_reference() -> None:
    tuner = tuner_with()
    tuner.select(P, C, 0, FakeRunner({0: 1.0, 1: 0.5, 2: 0.8}))
    (report,) = tuner.reports()
    assert (report.operation, report.workload, report.winner, report.budget_exhausted) == ("matmul", P.workload, "a", False)
    ref, a, b = report.candidates
    assert (ref.name, ref.samples, ref.ratio, ref.verified, ref.note) == ("ref", 3, 1.0, True, "reference")
    # samples = 3 is a minimum: the sign test cannot decide on 3 pairs, so the next look (7 pairs) decides.
    assert (a.samples, a.ratio, a.stop, a.standing) == (7, 0.5, "decided", "faster")
    assert a.note == "selected: ratio 0.500 in [0.500, 0.500]; 7 pairs, stopped: decided"
    assert b.note.startswith("beaten: ratio 0.800") and "a is faster" in b.note
    assert a.pairs == ((1.0, 0.5),) * 7


def test_when_the_reference_stays_its_report_says_selected() -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({1: 2.0, 2: 3.0}))
    assert (decision.index, decision.source, decision.ratio) == (0, DecisionSource.TUNED, 1.0)
    assert tuner.reports()[0].candidates[0].note == "selected: reference"


def test_a_reference_in_the_middle_of_the_list_is_never_timed_as_a_candidate() -> None:
    tuner = tuner_with()
    runner = FakeRunner({0: 0.5, 1: 1.0, 2: 0.9})
    decision = tuner.select(P, C, 1, runner)
    assert (decision.index, decision.reference_index, decision.name) == (0, 1, "ref")
    assert (1, 1) in runner.validated() and (1, 0) in runner.validated() and (1, 2) in runner.validated()


# -- step 1 and the constructor: bad input before anything else ---------------------------------------------

BAD = [
    ("no candidates", P, (), 0),
    ("duplicate names", P, candidates("ref", "a", "a"), 0),
    ("empty name", P, candidates("ref", ""), 0),
    ("reference out of range", P, C, 3),
    ("empty workload", problem(workload=""), C, 0),
    ("empty operation", problem(operation=""), C, 0),
    ("oversized key", problem(workload="w" * (400 << 10)), C, 0),
]


@pytest.mark.parametrize(("case", "prob", "cands", "reference"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_invalid_input_before_any_runner_call(case: str, prob: Any, cands: Any, reference: int) -> None:
    tuner = tuner_with()
    runner = FakeRunner()
    with pytest.raises(TuneFailure) as info:
        tuner.select(prob, cands, reference, runner)
    assert info.value.kind is FailureKind.INVALID_INPUT
    assert runner.calls == []
    assert tuner.stats() == Stats()


def test_bad_input_is_rejected_even_in_disabled_mode() -> None:
    with pytest.raises(TuneFailure) as info:
        tuner_with(mode=Mode.DISABLED).select(P, (), 0, FakeRunner())
    assert info.value.kind is FailureKind.INVALID_INPUT


def test_an_invalid_policy_fails_the_constructor_before_any_disk_access(tmp_path: Path) -> None:
    with pytest.raises(TuneFailure) as info:
        StackTuner(StackPolicy(samples=4), cache_directory=tmp_path / "cache")
    assert info.value.kind is FailureKind.INVALID_INPUT
    assert "policy.samples" in info.value.message and "4" in info.value.message
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (({"samples": 7},), "policy must be a StackPolicy"),
        ((StackPolicy(), None, "lru"), "memory_eviction"),
    ],
)
def test_the_constructor_rejects_arguments_of_the_wrong_type(args: tuple[Any, ...], named: str) -> None:
    with pytest.raises(TuneFailure) as info:
        StackTuner(*args)
    assert info.value.kind is FailureKind.INVALID_INPUT
    assert named in info.value.message


def test_a_request_is_built_once_and_reused() -> None:
    tuner = tuner_with()
    assert tuner.request(P, C, 0) is tuner.request(P, list(C), 0)
    assert tuner.request(P, C, 0, device="cpu:1").lane == "cpu:1"
    assert tuner.request(P, C, 0).lane == P.environment


# -- step 3: DISABLED; step 7: CACHE_ONLY ----------------------------------------------------------------------


def test_disabled_mode_returns_the_reference_with_no_runner_call_and_no_caching() -> None:
    tuner = tuner_with(mode=Mode.DISABLED)
    runner = FakeRunner()
    for _ in range(2):
        decision = tuner.select(P, C, 2, runner)
        assert (decision.index, decision.name, decision.source, decision.verified, decision.ratio) == (
            2, "b", DecisionSource.DISABLED, True, 1.0,
        )
    assert runner.calls == []
    assert tuner.stats() == Stats()


def test_a_cache_only_miss_returns_the_reference_without_searching() -> None:
    tuner = tuner_with(mode=Mode.CACHE_ONLY)
    runner = FakeRunner()
    decision = tuner.select(P, C, 0, runner)
    assert (decision.index, decision.source) == (0, DecisionSource.CACHE_MISS)
    assert tuner.select(P, C, 0, runner).source is DecisionSource.CACHE_MISS
    assert runner.calls == []
    assert tuner.stats() == Stats(misses=2)


# -- step 8: the search -----------------------------------------------------------------------------------------


def test_paired_samples_alternate_which_runs_first() -> None:
    tuner = StackTuner(StackPolicy())  # 2 warmups, 7 samples
    runner = FakeRunner({1: 0.5})
    tuner.select(P, C[:2], 0, runner)
    reference = [("measure", 0)] * 2 + [("validate", 0, 0)] + [("measure", 0)] * 7
    candidate = [("measure", 1)] * 2 + [("validate", 0, 1)]
    for sample in range(7):
        candidate += [("measure", 0), ("measure", 1)] if sample % 2 == 0 else [("measure", 1), ("measure", 0)]
    assert runner.calls == reference + candidate


def test_the_score_is_the_median_block_ratio_and_its_mad_describes_the_pairs() -> None:
    tuner = tuner_with(samples=7, max_samples=7)
    # warmup, then pair ratios 0.5 0.6 0.55 0.55 0.5 0.6 0.55: median 0.55, MAD 0.05. Blocks (a reference-first pair
    # and the candidate-first pair after it) take each side's minimum: 0.5, 0.55, 0.5 -> ratio 0.5.
    decision = tuner.select(P, C[:2], 0, FakeRunner({0: 2.0, 1: [9.0, 1.0, 1.2, 1.1, 1.1, 1.0, 1.2, 1.1]}))
    assert decision.index == 1
    assert decision.ratio == pytest.approx(0.5)
    a = tuner.reports()[0].candidates[1]
    assert a.ratio == pytest.approx(0.5)
    assert a.relative_mad == pytest.approx(0.05 / 0.55)


def test_a_noisy_candidate_whose_whole_interval_lies_below_the_line_wins() -> None:
    tuner = tuner_with(samples=7, max_samples=7)
    # Pair ratios 0.3 0.5 0.9 0.5 0.3 0.9 0.5: the interval [0.3, 0.9] is far wider than +-0.15 around the ratio,
    # but it lies wholly below 1 / min_speedup: a clear win, decided (the noise limit guards close rankings only).
    decision = tuner.select(P, C[:2], 0, FakeRunner({1: [0.1, 0.3, 0.5, 0.9, 0.5, 0.3, 0.9, 0.5]}))
    assert decision.index == 1
    a = tuner.reports()[0].candidates[1]
    assert a.standing == "faster" and a.relative_mad == pytest.approx(0.4)
    assert (a.stop, a.samples) == ("decided", 7)


def test_a_candidate_whose_interval_straddles_the_line_is_undecided_and_never_wins() -> None:
    tuner = tuner_with(samples=7, max_samples=7)
    decision = tuner.select(P, C[:2], 0, FakeRunner({1: [0.1, 0.6, 1.2, 1.1, 0.6, 0.7, 1.2, 0.9]}))
    assert decision.index == 0
    a = tuner.reports()[0].candidates[1]
    assert a.note.startswith("undecided")
    assert (a.standing, a.stop, a.samples) == ("undecided", "max_samples", 7)


@pytest.mark.parametrize(("candidate_seconds", "wins"), [(1.0, True), (1.0000001, False)])
def test_min_speedup_is_inclusive_at_its_boundary(candidate_seconds: float, wins: bool) -> None:
    tuner = tuner_with(min_speedup=2.0)
    decision = tuner.select(P, C[:2], 0, FakeRunner({0: 2.0, 1: candidate_seconds}))
    assert (decision.index == 1) is wins
    if not wins:
        assert "too slow" in tuner.reports()[0].candidates[1].note


def test_the_best_ratio_wins_across_every_candidate_not_the_first_good_one() -> None:
    tuner = tuner_with()
    runner = FakeRunner({1: 0.8, 2: 0.5, 3: 0.7})
    decision = tuner.select(P, candidates("ref", "a", "b", "c"), 0, runner)
    assert (decision.name, decision.ratio) == ("b", 0.5)
    assert set(runner.measured()) == {0, 1, 2, 3}


def test_max_candidates_counts_the_reference_and_stops_the_search() -> None:
    tuner = tuner_with(max_candidates=2)
    runner = FakeRunner({1: 0.8, 2: 0.1})
    decision = tuner.select(P, C, 0, runner)
    assert decision.name == "a"
    assert 2 not in runner.measured()
    assert tuner.reports()[0].candidates[2].note == "not tried: max_candidates 2 reached"


def test_max_candidates_one_times_only_the_reference() -> None:
    tuner = tuner_with(max_candidates=1)
    runner = FakeRunner({1: 0.1})
    assert tuner.select(P, C, 0, runner).index == 0
    assert set(runner.measured()) == {0}


def test_skipped_candidates_do_not_use_up_max_candidates() -> None:
    tuner = tuner_with(max_candidates=2)
    cands = (Candidate("ref"), Candidate("off", eligible=False), Candidate("a"))
    assert tuner.select(P, cands, 0, FakeRunner({2: 0.5})).name == "a"


def test_ineligible_and_oversized_workspace_candidates_are_skipped_with_notes() -> None:
    tuner = tuner_with(workspace_limit=50)
    cands = (
        Candidate("ref", workspace_bytes=0),
        Candidate("off", workspace_bytes=0, eligible=False),
        Candidate("unknown", workspace_bytes=None),
        Candidate("big", workspace_bytes=100),
        Candidate("fits", workspace_bytes=50),
    )
    runner = FakeRunner({1: 0.1, 2: 0.1, 3: 0.1, 4: 0.5})
    assert tuner.select(P, cands, 0, runner).name == "fits"
    assert set(runner.measured()) == {0, 4}
    notes = {c.name: c.note for c in tuner.reports()[0].candidates}
    assert notes["off"] == "skipped: not eligible"
    assert "workspace None does not fit limit 50" in notes["unknown"]
    assert "workspace 100 does not fit limit 50" in notes["big"]


# -- step 9: failures are notes ---------------------------------------------------------------------------------

FAILURES = [
    ("raises while warming up", {1: RuntimeError("boom")}, {}, "RuntimeError: boom"),
    ("raises while sampling", {1: [0.1, 0.1, RuntimeError("late")]}, {}, "RuntimeError: late"),
    ("takes zero time", {1: 0.0}, {}, "non-positive or non-finite time (0.0)"),
    ("takes negative time", {1: -1.0}, {}, "non-positive or non-finite"),
    ("takes NaN time", {1: math.nan}, {}, "(nan)"),
    ("takes infinite time", {1: math.inf}, {}, "(inf)"),
    ("returns a non-number", {1: lambda: "fast"}, {}, "'fast'"),
    ("fails validation", {1: 0.01}, {1: TuneFailure.rejected("wrong output: output: contains NaN or Inf")}, "NaN"),
    ("crashes validation", {1: 0.01}, {1: ValueError("bad readback")}, "ValueError: bad readback"),
]


@pytest.mark.parametrize(("case", "times", "verdicts", "note"), FAILURES, ids=[f[0] for f in FAILURES])
def test_a_failing_candidate_is_a_rejected_note_and_never_the_winner(
    case: str, times: dict[int, Any], verdicts: dict[int, Any], note: str
) -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({**times, 2: 0.5}, verdicts))
    assert (decision.name, decision.source) == ("b", DecisionSource.TUNED)
    report = tuner.reports()[0].candidates[1]
    assert report.note.startswith("rejected: ")
    assert note in report.note
    assert report.ratio is None


def test_a_wrong_output_is_rejected_not_unsupported() -> None:
    tuner = tuner_with(require_validation=False)
    wrong = TuneFailure.rejected("wrong output: output: values differ beyond tolerance")
    decision = tuner.select(P, C[:2], 0, FakeRunner({1: 0.01}, {1: wrong}))
    assert decision.index == 0
    assert "wrong output" in tuner.reports()[0].candidates[1].note


def test_an_unsupported_candidate_is_skipped_when_validation_is_required() -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C[:2], 0, FakeRunner({1: 0.1}, {1: Validation.UNSUPPORTED}))
    assert decision.index == 0
    report = tuner.reports()[0].candidates[1]
    assert report.note.startswith("skipped: validation unsupported")
    assert report.samples == 0


def test_an_unsupported_candidate_may_win_unverified_when_validation_is_off() -> None:
    tuner = tuner_with(require_validation=False)
    decision = tuner.select(P, C[:2], 0, FakeRunner({1: 0.1}, {1: Validation.UNSUPPORTED}))
    assert (decision.index, decision.verified) == (1, False)
    hit = tuner.select(P, C[:2], 0, FakeRunner())
    assert (hit.source, hit.index, hit.verified) == (DecisionSource.MEMORY_CACHE, 1, False)


def test_a_failing_reference_is_a_rejected_failure_and_nothing_is_cached() -> None:
    tuner = tuner_with()
    with pytest.raises(TuneFailure) as info:
        tuner.select(P, C, 0, FakeRunner({0: RuntimeError("ref broke")}))
    assert info.value.kind is FailureKind.REJECTED
    assert "reference 'ref' failed" in info.value.message and "ref broke" in info.value.message
    assert tuner.quarantined() == set()
    retry = FakeRunner({1: 0.5})
    assert tuner.select(P, C, 0, retry).name == "a"
    assert retry.calls != []


def test_a_reference_that_takes_zero_time_is_a_rejected_failure() -> None:
    with pytest.raises(TuneFailure) as info:
        tuner_with().select(P, C, 0, FakeRunner({0: 0.0}))
    assert info.value.kind is FailureKind.REJECTED
