"""The controller's selection rules (SEMANTICS.md steps 1-10), driven by a scripted fake runner."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import FAST, FakeClock, FakeRunner, Gate, candidates, install_clock, problem

from farm.engine import Decision, DecisionSource, StackTuner, Stats, Validation, is_tuning
from farm.errors import FailureKind, TuneFailure
from farm.identity import Candidate
from farm.policy import MemoryEviction, Mode, StackPolicy

P = problem()
C = candidates("ref", "a", "b")


def tuner_with(**changes: Any) -> StackTuner:
    return StackTuner(FAST.replace(**changes))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return install_clock(monkeypatch)


class Background:
    """Runs ``fn`` in a thread; ``result()`` joins (with a deadline) and returns its value or re-raises."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def body() -> None:
            try:
                self._value = fn()
            except BaseException as e:  # handed to the test thread by result()
                self._error = e

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 10.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background selection did not finish"
        if self._error is not None:
            raise self._error
        return self._value


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


def test_a_candidate_noisier_than_max_relative_mad_is_undecided_and_never_wins() -> None:
    tuner = tuner_with(samples=7, max_samples=7)
    # Pair ratios 0.3 0.5 0.9 0.5 0.3 0.9 0.5: every one below 1 / min_speedup, but the interval [0.3, 0.9] is
    # far wider than +-0.15 around the ratio: undecided, and the reference stays.
    decision = tuner.select(P, C[:2], 0, FakeRunner({1: [0.1, 0.3, 0.5, 0.9, 0.5, 0.3, 0.9, 0.5]}))
    assert decision.index == 0
    a = tuner.reports()[0].candidates[1]
    assert a.note.startswith("undecided: noisy") and a.relative_mad == pytest.approx(0.4)
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


# -- step 5: validation unavailable, nested, busy ---------------------------------------------------------------


def test_an_unvalidatable_reference_makes_the_key_validation_unavailable() -> None:
    tuner = tuner_with()
    runner = FakeRunner({1: 0.1}, {0: Validation.UNSUPPORTED})
    decision = tuner.select(P, C, 0, runner)
    assert (decision.index, decision.source) == (0, DecisionSource.VALIDATION_UNAVAILABLE)
    assert runner.validated() == [(0, 0)]
    idle = FakeRunner()
    assert tuner.select(P, C, 0, idle).source is DecisionSource.VALIDATION_UNAVAILABLE
    assert idle.calls == []
    assert tuner.stats().tunes == 0


def test_an_unvalidatable_reference_is_timed_anyway_when_validation_is_off() -> None:
    tuner = tuner_with(require_validation=False)
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.1}, {0: Validation.UNSUPPORTED}))
    assert (decision.name, decision.source, decision.verified) == ("a", DecisionSource.TUNED, True)


def test_a_selection_inside_a_trial_gets_the_reference_and_never_recurses() -> None:
    tuner = tuner_with()
    nested: list[Decision] = []
    inside: list[bool] = []
    inner_runner = FakeRunner()

    def nest(candidate: int) -> None:
        inside.append(is_tuning())
        if not nested:
            nested.append(tuner.select(problem(workload="inner"), C, 1, inner_runner))
            nested.append(tuner.select(P, C, 0, inner_runner))  # its own key: still NESTED, not BUSY

    outer = tuner.select(P, C, 0, FakeRunner({1: 0.5}, on_measure=nest))
    assert outer.source is DecisionSource.TUNED
    assert [(d.index, d.source) for d in nested] == [(1, DecisionSource.NESTED), (0, DecisionSource.NESTED)]
    assert inner_runner.calls == []
    assert all(inside) and not is_tuning()
    assert tuner.stats().busy_fallbacks == 0


@pytest.mark.parametrize(
    ("contender", "device", "max_parallel"),
    [
        ("the same key", None, 4),
        ("another key on the same device lane", None, 4),
        ("another lane when max_parallel_tunes is reached", "cpu:9", 1),
    ],
)
def test_a_contender_gets_the_reference_at_once_while_another_thread_is_mid_trial(
    contender: str, device: str | None, max_parallel: int
) -> None:
    tuner = tuner_with(max_parallel_tunes=max_parallel)
    gate = Gate()
    first = Background(lambda: tuner.select(P, C, 0, FakeRunner({1: 0.5}, on_measure=gate)))
    try:
        assert gate.entered.wait(10)
        other = P if contender == "the same key" else problem(workload="other")
        idle = FakeRunner()
        decision = tuner.select(other, C, 2, idle, device=device)
        # The contender returned while the first selection is still blocked inside its trial.
        assert first.thread.is_alive() and not gate.release.is_set()
        assert (decision.index, decision.source) == (2, DecisionSource.BUSY)
        assert idle.calls == []
    finally:
        gate.release.set()
    assert first.result().source is DecisionSource.TUNED
    assert tuner.stats().busy_fallbacks == 1
    later = FakeRunner()
    assert tuner.select(problem(workload="other"), C, 2, later, device=device).source is DecisionSource.TUNED
    assert later.calls != []


def test_parallel_tunes_on_different_lanes_run_at_once_up_to_the_limit() -> None:
    tuner = tuner_with(max_parallel_tunes=2)
    gate = Gate()
    first = Background(lambda: tuner.select(P, C, 0, FakeRunner(on_measure=gate)))
    try:
        assert gate.entered.wait(10)
        second = tuner.select(problem(workload="other"), C, 0, FakeRunner({1: 0.5}), device="cpu:1")
        assert first.thread.is_alive() and not gate.release.is_set()
        assert (second.source, second.name) == (DecisionSource.TUNED, "a")
    finally:
        gate.release.set()
    assert first.result().source is DecisionSource.TUNED


def test_memory_hits_are_served_while_another_key_is_being_tuned() -> None:
    tuner = tuner_with()
    tuner.select(problem(workload="warm"), C, 0, FakeRunner({1: 0.5}))
    gate = Gate()
    first = Background(lambda: tuner.select(P, C, 0, FakeRunner(on_measure=gate)))
    try:
        assert gate.entered.wait(10)
        hit = tuner.select(problem(workload="warm"), C, 0, FakeRunner())
        assert first.thread.is_alive()
        assert (hit.source, hit.name) == (DecisionSource.MEMORY_CACHE, "a")
    finally:
        gate.release.set()
    first.result()


def test_concurrent_selections_of_one_key_tune_it_exactly_once() -> None:
    tuner = tuner_with()
    gate = Gate()
    first = Background(lambda: tuner.select(P, C, 0, FakeRunner({1: 0.5}, on_measure=gate)))
    try:
        assert gate.entered.wait(10)
        others = [Background(lambda: tuner.select(P, C, 0, FakeRunner())) for _ in range(8)]
        sources = [o.result().source for o in others]
    finally:
        gate.release.set()
    assert first.result().source is DecisionSource.TUNED
    assert sources == [DecisionSource.BUSY] * 8
    assert tuner.stats().tunes == 1


def test_many_threads_selecting_many_keys_tune_each_key_exactly_once() -> None:
    tuner = tuner_with(max_parallel_tunes=256)
    keys = [problem(workload=f"w{n}") for n in range(10)]
    sources: list[DecisionSource] = []
    lock = threading.Lock()

    def worker(offset: int) -> None:
        for i in range(50):
            n = (i + offset) % len(keys)
            decision = tuner.select(keys[n], C, 0, FakeRunner({1: 0.5}), device=f"lane{n}")
            assert decision.index in (0, 1)
            with lock:
                sources.append(decision.source)

    threads = [Background(lambda o=o: worker(o)) for o in range(8)]
    for t in threads:
        t.result(30)
    stats = tuner.stats()
    assert stats.tunes == len(keys) == sources.count(DecisionSource.TUNED)
    assert stats.memory_hits == sources.count(DecisionSource.MEMORY_CACHE)
    assert stats.busy_fallbacks == sources.count(DecisionSource.BUSY)
    assert len(sources) == 400 and set(sources) <= {DecisionSource.TUNED, DecisionSource.MEMORY_CACHE, DecisionSource.BUSY}


# -- step 2: device failures quarantine the lane --------------------------------------------------------------


def test_a_device_failure_propagates_and_quarantines_the_lane() -> None:
    tuner = tuner_with()
    warm = problem(workload="warm")
    tuner.select(warm, C, 0, FakeRunner({1: 0.5}))
    with pytest.raises(TuneFailure) as info:
        tuner.select(P, C, 0, FakeRunner({1: TuneFailure.device("sync failed")}))
    assert info.value.kind is FailureKind.DEVICE
    assert tuner.stats().device_failures == 1
    assert tuner.quarantined() == {P.environment}
    idle = FakeRunner()
    for prob in (P, warm):  # even a memory hit on the lane is refused
        with pytest.raises(TuneFailure) as later:
            tuner.select(prob, C, 0, idle)
        assert later.value.kind is FailureKind.QUARANTINED
    assert idle.calls == []


def test_a_device_failure_during_reference_validation_also_quarantines() -> None:
    tuner = tuner_with()
    with pytest.raises(TuneFailure) as info:
        tuner.select(P, C, 0, FakeRunner(verdicts={0: TuneFailure.device("lost")}))
    assert info.value.kind is FailureKind.DEVICE
    assert tuner.quarantined() == {P.environment}


def test_quarantine_is_per_lane() -> None:
    tuner = tuner_with()
    with pytest.raises(TuneFailure):
        tuner.select(P, C, 0, FakeRunner({0: TuneFailure.device("lost")}), device="cuda:1")
    assert tuner.quarantined() == {"cuda:1"}
    assert tuner.select(P, C, 0, FakeRunner({1: 0.5}), device="cuda:0").source is DecisionSource.TUNED
    assert tuner.select(problem(environment="env-B"), C, 0, FakeRunner()).source is DecisionSource.TUNED


def test_quarantine_is_checked_before_disabled_mode() -> None:
    tuner = tuner_with()
    with pytest.raises(TuneFailure):
        tuner.select(P, C, 0, FakeRunner({1: TuneFailure.device("lost")}))
    disabled = StackTuner(FAST.replace(mode=Mode.DISABLED))
    assert disabled.select(P, C, 0, FakeRunner()).source is DecisionSource.DISABLED  # another controller
    with pytest.raises(TuneFailure) as info:
        tuner.select(P, C, 0, FakeRunner())
    assert info.value.kind is FailureKind.QUARANTINED


# -- the budget (a fake clock that trials advance) ------------------------------------------------------------


def test_the_budget_stops_the_search_between_candidates(clock: FakeClock) -> None:
    tuner = tuner_with(budget=1.4)
    # The reference takes 4 x 0.1 s; candidate a 1 warmup + 7 pairs (3 cannot decide) = 1.1 s more, its last pair
    # starting at 1.35 s; b would follow at 1.5 s.
    runner = FakeRunner({0: 0.1, 1: 0.05, 2: 0.01}, clock=clock)
    decision = tuner.select(P, C, 0, runner)
    assert decision.name == "a"
    assert 2 not in runner.measured()
    report = tuner.reports()[0]
    assert report.budget_exhausted is True
    assert report.candidates[2].note == "not tried: budget of 1.4s exhausted"
    assert report.elapsed == pytest.approx(1.5)


def test_a_candidate_cut_off_by_the_budget_mid_sampling_is_rejected(clock: FakeClock) -> None:
    tuner = tuner_with(budget=0.5)
    runner = FakeRunner({0: 0.1, 1: 0.05, 2: 0.01}, clock=clock)
    decision = tuner.select(P, C, 0, runner)
    assert decision.index == 0
    report = tuner.reports()[0]
    assert report.budget_exhausted is True
    assert report.candidates[1].note == "rejected: budget of 0.5s exhausted during sampling"
    assert report.candidates[2].note.startswith("not tried: budget")


def test_the_budget_is_soft_and_the_reference_is_always_timed(clock: FakeClock) -> None:
    tuner = tuner_with(budget=0.01)
    runner = FakeRunner({0: 1.0, 1: 0.1}, clock=clock)
    decision = tuner.select(P, C, 0, runner)
    assert (decision.index, decision.source) == (0, DecisionSource.TUNED)
    assert runner.measured() == [0] * 4
    assert tuner.reports()[0].budget_exhausted is True


def test_a_search_within_budget_is_not_marked_exhausted(clock: FakeClock) -> None:
    tuner = tuner_with(budget=100.0)
    tuner.select(P, C, 0, FakeRunner({1: 0.5}, clock=clock))
    assert tuner.reports()[0].budget_exhausted is False


# -- invalidation and the regression window ---------------------------------------------------------------------


def test_invalidate_with_ban_forgets_the_decision_and_never_picks_that_candidate_again() -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5, 2: 0.8}))
    tuner.invalidate(decision, True)
    assert tuner.stats().invalidations == 1
    retune = FakeRunner({1: 0.1, 2: 0.8})
    again = tuner.select(P, C, 0, retune)
    assert (again.name, again.source) == ("b", DecisionSource.TUNED)
    assert 1 not in retune.measured()
    assert tuner.reports()[-1].candidates[1].note == "skipped: banned for this key after a failure or regression"
    # The ban is per key: another workload may still choose it.
    assert tuner.select(problem(workload="other"), C, 0, FakeRunner({1: 0.5})).name == "a"


def test_invalidate_without_ban_lets_the_candidate_win_again() -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    tuner.invalidate(decision, False)
    retune = FakeRunner({1: 0.5})
    assert tuner.select(P, C, 0, retune) == decision
    assert retune.calls != []


def test_the_reference_is_never_banned() -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({1: 2.0, 2: 2.0}))
    assert decision.index == 0
    tuner.invalidate(decision, True)
    assert tuner.select(P, C, 0, FakeRunner({1: 2.0, 2: 2.0})).index == 0
    assert tuner.reports()[-1].candidates[0].note == "selected: reference"


REGRESSION = [
    ("three slow checked observations", [(1.0, 1.2, True)] * 3, [False, False, True]),
    ("fewer than regression_pairs", [(1.0, 1.2, True)] * 2, [False, False]),
    ("unchecked observations are ignored", [(1.0, 2.0, False)] * 3 + [(1.0, 2.0, True)] * 2, [False] * 5),
    ("a median at the ratio is not above it", [(1.0, 1.15, True)] * 3, [False] * 3),
    ("the median, not the mean", [(1.0, 1.0, True), (1.0, 1.0, True), (1.0, 100.0, True)], [False] * 3),
    ("the window slides", [(1.0, 1.0, True)] * 3 + [(1.0, 2.0, True)] * 2, [False] * 4 + [True]),
]


@pytest.mark.parametrize(("case", "observations", "expected"), REGRESSION, ids=[r[0] for r in REGRESSION])
def test_the_regression_window_invalidates_and_bans_on_a_slow_median(
    case: str, observations: list[tuple[float, float, bool]], expected: list[bool]
) -> None:
    tuner = tuner_with(regression_pairs=3, regression_ratio=1.15)
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5, 2: 0.8}))
    results = [tuner.record_comparison(decision, r, s, checked) for r, s, checked in observations]
    assert results == expected
    retune = FakeRunner({1: 0.5, 2: 0.8})
    after = tuner.select(P, C, 0, retune)
    if expected[-1]:
        assert tuner.stats().invalidations == 1
        assert (after.name, after.source) == ("b", DecisionSource.TUNED)
        assert 1 not in retune.measured()
    else:
        assert tuner.stats().invalidations == 0
        assert after.source is DecisionSource.MEMORY_CACHE and retune.calls == []


def test_a_memory_hit_decision_feeds_the_same_window() -> None:
    tuner = tuner_with(regression_pairs=3)
    tuned = tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    hit = tuner.select(P, C, 0, FakeRunner())
    assert [tuner.record_comparison(d, 1.0, 2.0, True) for d in (tuned, hit, hit)] == [False, False, True]


@pytest.mark.parametrize("source", [DecisionSource.BUSY, DecisionSource.NESTED, DecisionSource.CACHE_MISS])
def test_comparisons_of_a_fallback_decision_are_ignored(source: DecisionSource) -> None:
    tuner = tuner_with(regression_pairs=3)
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5}))._replace(source=source)
    assert [tuner.record_comparison(decision, 1.0, 5.0, True) for _ in range(3)] == [False] * 3
    assert tuner.stats().invalidations == 0


def test_comparisons_of_the_reference_never_invalidate() -> None:
    tuner = tuner_with(regression_pairs=3)
    decision = tuner.select(P, C, 0, FakeRunner({1: 2.0, 2: 2.0}))
    assert [tuner.record_comparison(decision, 1.0, 5.0, True) for _ in range(3)] == [False] * 3


@pytest.mark.parametrize(("reference", "selected"), [(0.0, 1.0), (1.0, -1.0), (math.nan, 1.0), (1.0, math.inf)])
def test_a_comparison_with_unusable_seconds_is_invalid_input(reference: float, selected: float) -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    with pytest.raises(TuneFailure) as info:
        tuner.record_comparison(decision, reference, selected, True)
    assert info.value.kind is FailureKind.INVALID_INPUT


# -- memory: eviction, TTL, reports -------------------------------------------------------------------------------


def workload(n: int) -> Any:
    return problem(workload=f"w{n}")


def test_fifo_eviction_drops_the_oldest_insert_even_if_it_was_just_read() -> None:
    tuner = StackTuner(FAST.replace(capacity=2), memory_eviction=MemoryEviction.FIFO)
    for n in (1, 2):
        tuner.select(workload(n), C, 0, FakeRunner())
    assert tuner.select(workload(1), C, 0, FakeRunner()).source is DecisionSource.MEMORY_CACHE
    tuner.select(workload(3), C, 0, FakeRunner())
    assert tuner.select(workload(2), C, 0, FakeRunner()).source is DecisionSource.MEMORY_CACHE
    assert tuner.select(workload(1), C, 0, FakeRunner()).source is DecisionSource.TUNED


def test_lru_eviction_drops_the_least_recently_read() -> None:
    tuner = StackTuner(FAST.replace(capacity=2), memory_eviction=MemoryEviction.LRU)
    for n in (1, 2):
        tuner.select(workload(n), C, 0, FakeRunner())
    assert tuner.select(workload(1), C, 0, FakeRunner()).source is DecisionSource.MEMORY_CACHE
    tuner.select(workload(3), C, 0, FakeRunner())
    assert tuner.select(workload(1), C, 0, FakeRunner()).source is DecisionSource.MEMORY_CACHE
    assert tuner.select(workload(2), C, 0, FakeRunner()).source is DecisionSource.TUNED


def test_a_record_is_fresh_up_to_its_ttl_and_expires_after(clock: FakeClock) -> None:
    tuner = tuner_with(ttl=60.0)
    tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    clock.advance(60.0)
    assert tuner.select(P, C, 0, FakeRunner()).source is DecisionSource.MEMORY_CACHE
    clock.advance(0.001)
    retune = FakeRunner({1: 0.5})
    assert tuner.select(P, C, 0, retune).source is DecisionSource.TUNED
    assert retune.calls != []


def test_a_future_dated_record_is_stale(clock: FakeClock) -> None:
    tuner = tuner_with()
    tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    clock.wall -= 10.0
    assert tuner.select(P, C, 0, FakeRunner({1: 0.5})).source is DecisionSource.TUNED


@pytest.mark.parametrize(("capacity", "tunes", "kept"), [(3, 5, 3), (1024, 130, 128)])
def test_reports_are_bounded_to_the_smaller_of_capacity_and_128(capacity: int, tunes: int, kept: int) -> None:
    tuner = StackTuner(FAST.replace(capacity=capacity, warmups=1, samples=3))
    for n in range(tunes):
        tuner.select(workload(n), C[:2], 0, FakeRunner())
    reports = tuner.reports()
    assert len(reports) == kept
    assert reports[-1].workload == f"w{tunes - 1}" and reports[0].workload == f"w{tunes - kept}"


def test_stats_count_every_outcome() -> None:
    tuner = tuner_with()
    decision = tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    tuner.select(P, C, 0, FakeRunner())
    tuner.select(P, C, 0, FakeRunner())
    tuner.invalidate(decision, False)
    tuner.select(P, C, 0, FakeRunner({1: 0.5}))
    with pytest.raises(TuneFailure):
        tuner.select(problem(workload="dead"), C, 0, FakeRunner({0: TuneFailure.device("x")}), device="cuda:3")
    assert tuner.stats() == Stats(memory_hits=2, misses=3, tunes=2, invalidations=1, device_failures=1)
