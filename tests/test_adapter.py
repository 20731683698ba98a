"""The runtime adapter with real NumPy candidates on the host runtime: ``try_execute_stack`` end to end."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from farm import adapter
from farm.adapter import (
    RuntimeTrials,
    enable_stack_autotune,
    prepare,
    problem_for,
    stack_autotuner,
    try_execute_stack,
)
from farm.arrays import array_signature
from farm.engine import DecisionSource, StackTuner, Validation, is_tuning
from farm.errors import FailureKind, TuneFailure
from farm.identity import Scope
from farm.policy import StackPolicy, Timing, Tolerance
from farm.runtimes.host import HostClient
from farm.tunable import TunableSet

SCRIPTED = StackPolicy(warmups=1, samples=3, timing=Timing.DEVICE)
REAL = StackPolicy(warmups=1, samples=3)


class ScriptedClient(HostClient):
    """A host client whose DEVICE profile reports scripted seconds for whichever candidate ran last, so that the
    winner does not depend on this machine's speed. Candidates record themselves in ``ran``."""

    def __init__(self, seconds: dict[str, float], index: int = 0) -> None:
        super().__init__(index)
        self.seconds = seconds
        self.ran: list[str] = []
        self.tuning: list[bool] = []

    def profile(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        out = fn()
        return out, self.seconds[self.ran[-1]]


def recorded(client: ScriptedClient, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        client.ran.append(name)
        client.tuning.append(is_tuning())
        return fn(*args)

    return run


def scripted_set(client: ScriptedClient, impls: dict[str, Callable[..., Any]], name: str = "scale") -> TunableSet:
    """A set whose first implementation is the reference; every call is recorded on the client."""
    tunable = TunableSet(name, signature=array_signature)
    for n, (impl_name, fn) in enumerate(impls.items()):
        tunable.add(recorded(client, impl_name, fn), name=impl_name, reference=n == 0)
    return tunable


def reference(x: np.ndarray) -> np.ndarray:
    return x * 2.0


def correct(x: np.ndarray) -> np.ndarray:
    return x + x


def wrong_but_fast(x: np.ndarray) -> np.ndarray:
    return x * 2.01  # off by 0.5%: beyond the 0.1% relative tolerance


def nan_output(x: np.ndarray) -> np.ndarray:
    out = x * 2.0
    out[3] = np.nan
    return out


def raises(x: np.ndarray) -> np.ndarray:
    raise ValueError("unsupported layout")


def wrong_shape(x: np.ndarray) -> np.ndarray:
    return (x * 2.0)[:-1]


def wrong_dtype(x: np.ndarray) -> np.ndarray:
    return (x * 2.0).astype(np.float32)


def returns_none(x: np.ndarray) -> None:
    return None


BROKEN = {
    "wrong_but_fast": (wrong_but_fast, "values differ beyond tolerance"),
    "nan_output": (nan_output, "contains NaN or Inf"),
    "raises": (raises, "raised ValueError: unsupported layout"),
    "wrong_shape": (wrong_shape, "shape (63,) != reference shape (64,)"),
    "wrong_dtype": (wrong_dtype, "dtype float32 != reference dtype float64"),
    "returns_none": (returns_none, "expected an array"),
}


def x() -> np.ndarray:
    return np.linspace(-3.0, 5.0, 64)


def notes(tuner: StackTuner) -> dict[str, str]:
    return {c.name: c.note for c in tuner.reports()[-1].candidates}


# -- selection with real outputs -------------------------------------------------------------------------------


def test_the_correct_faster_candidate_wins_and_no_broken_candidate_ever_does() -> None:
    tuner = enable_stack_autotune(SCRIPTED)
    seconds = {"reference": 1.0, "correct": 0.5, **dict.fromkeys(BROKEN, 0.001)}
    client = ScriptedClient(seconds)
    impls = {"reference": reference, **{n: fn for n, (fn, _) in BROKEN.items()}, "correct": correct}
    out = try_execute_stack("scale", "cpu:0", client, scripted_set(client, impls), x())
    assert np.array_equal(out, x() * 2.0)
    assert tuner.reports()[-1].winner == "correct"
    assert client.ran[-1] == "correct"
    found = notes(tuner)
    for name, (_, says) in BROKEN.items():
        assert found[name].startswith("rejected: ") and says in found[name], (name, found[name])


@pytest.mark.parametrize("timing", [Timing.END_TO_END, Timing.DEVICE])
def test_with_real_timing_the_winner_is_always_a_correct_candidate(timing: Timing) -> None:
    tuner = enable_stack_autotune(REAL.replace(timing=timing))
    tunable = TunableSet("scale", signature=array_signature)
    tunable.add(reference, reference=True)
    for name, (fn, _) in BROKEN.items():
        tunable.add(fn, name=name)
    tunable.add(correct)
    out = try_execute_stack("scale", "cpu:0", HostClient(0), tunable, x())
    assert np.array_equal(out, x() * 2.0)
    report = tuner.reports()[-1]
    assert report.winner in ("reference", "correct")
    found = notes(tuner)
    assert all(found[name].startswith("rejected: ") for name in BROKEN)
    assert report.candidates[0].ratio == 1.0 and report.candidates[0].samples == 3


def test_every_priority_group_is_searched_and_a_faster_later_group_wins() -> None:
    tuner = enable_stack_autotune(SCRIPTED)
    client = ScriptedClient({"reference": 1.0, "early_good": 0.8, "late_better": 0.4})
    tunable = TunableSet("scale", signature=array_signature)
    tunable.add(recorded(client, "late_better", correct), name="late_better", group=1)
    tunable.add(recorded(client, "reference", reference), name="reference", reference=True, group=0)
    tunable.add(recorded(client, "early_good", correct), name="early_good", group=0)
    try_execute_stack("scale", "cpu:0", client, tunable, x())
    report = tuner.reports()[-1]
    assert [c.name for c in report.candidates] == ["reference", "early_good", "late_better"]  # plan order
    assert report.winner == "late_better"


def test_tuple_outputs_are_compared_leaf_by_leaf() -> None:
    tuner = enable_stack_autotune(SCRIPTED)
    client = ScriptedClient({"pair": 1.0, "good_pair": 0.5, "bad_second": 0.1})
    impls = {
        "pair": lambda v: (v * 2.0, v.sum()),
        "good_pair": lambda v: (v + v, np.sum(v)),
        "bad_second": lambda v: (v * 2.0, v.sum() + 1.0),
    }
    out = try_execute_stack("pair", "cpu:0", client, scripted_set(client, impls), x())
    assert np.array_equal(out[0], x() * 2.0)
    assert tuner.reports()[-1].winner == "good_pair"
    assert "output[1]" in notes(tuner)["bad_second"]


def test_a_readback_above_max_bytes_leaves_the_key_validation_unavailable() -> None:
    tuner = enable_stack_autotune(SCRIPTED.replace(tolerance=Tolerance(max_bytes=8)))
    client = ScriptedClient({"reference": 1.0, "wrong_but_fast": 0.001})
    tunable = scripted_set(client, {"reference": reference, "wrong_but_fast": wrong_but_fast})
    for _ in range(2):
        assert np.array_equal(try_execute_stack("scale", "cpu:0", client, tunable, x()), x() * 2.0)
    assert set(client.ran) == {"reference"}
    assert tuner.stats().tunes == 0


# -- isolation of trials -----------------------------------------------------------------------------------------


def test_trials_get_fresh_inputs_and_a_vandal_cannot_corrupt_the_caller_or_other_trials() -> None:
    enable_stack_autotune(SCRIPTED)
    caller = x()
    seen: list[tuple[bool, bool]] = []  # (shares memory with the caller's array, input is pristine)

    def watched_reference(v: np.ndarray) -> np.ndarray:
        seen.append((np.shares_memory(v, caller), bool(np.array_equal(v, x()))))
        return v * 2.0

    def vandal(v: np.ndarray) -> np.ndarray:
        out = v * 2.0
        v[...] = np.nan  # correct output, but destroys its input
        return out

    client = ScriptedClient({"reference": 1.0, "vandal": 2.0})
    tunable = scripted_set(client, {"reference": watched_reference, "vandal": vandal})
    out = try_execute_stack("scale", "cpu:0", client, tunable, caller)
    assert np.array_equal(out, x() * 2.0)
    assert np.array_equal(caller, x())
    assert client.ran.count("vandal") > 0
    trials, live = seen[:-1], seen[-1]
    assert trials and all(pristine and not shared for shared, pristine in trials)
    assert live == (True, True)  # the live request runs on the caller's own arrays


def test_a_non_contiguous_input_keeps_its_layout_in_trials() -> None:
    enable_stack_autotune(SCRIPTED)
    layouts: list[tuple[int, ...]] = []

    def strided(v: np.ndarray) -> np.ndarray:
        layouts.append(v.strides)
        return v * 2.0

    client = ScriptedClient({"strided": 1.0})
    view = np.arange(40.0).reshape(5, 8)[:, ::3]
    out = try_execute_stack("scale", "cpu:0", client, scripted_set(client, {"strided": strided}), view)
    assert np.array_equal(out, view * 2.0)
    assert set(layouts) == {view.strides}


# -- the live request ----------------------------------------------------------------------------------------------


def test_the_live_request_runs_exactly_once_and_a_hit_runs_only_the_winner() -> None:
    tuner = enable_stack_autotune(SCRIPTED)
    client = ScriptedClient({"reference": 1.0, "correct": 0.5})
    tunable = scripted_set(client, {"reference": reference, "correct": correct})
    try_execute_stack("scale", "cpu:0", client, tunable, x())
    assert client.tuning.count(False) == 1 and client.tuning[-1] is False
    before = Counter(client.ran)
    out = try_execute_stack("scale", "cpu:0", client, tunable, x())
    assert np.array_equal(out, x() * 2.0)
    assert Counter(client.ran) - before == Counter({"correct": 1})
    assert tuner.stats().memory_hits == 1


def test_is_tuning_is_true_inside_trials_and_false_for_the_live_call_and_outside() -> None:
    enable_stack_autotune(SCRIPTED)
    client = ScriptedClient({"reference": 1.0, "correct": 0.5})
    try_execute_stack("scale", "cpu:0", client, scripted_set(client, {"reference": reference, "correct": correct}), x())
    assert all(client.tuning[:-1]) and len(client.tuning) > 1
    assert client.tuning[-1] is False
    assert not is_tuning()


class LiveFailure(Exception):
    pass


def test_a_live_failure_invalidates_bans_reraises_and_the_next_call_picks_another() -> None:
    tuner = enable_stack_autotune(SCRIPTED)
    raised: list[LiveFailure] = []

    def flaky(v: np.ndarray) -> np.ndarray:
        if not is_tuning():
            raised.append(LiveFailure("failed on the live request"))
            raise raised[-1]
        return v + v

    client = ScriptedClient({"reference": 1.0, "flaky": 0.25, "correct": 0.5})
    tunable = scripted_set(client, {"reference": reference, "flaky": flaky, "correct": correct})
    with pytest.raises(LiveFailure) as info:
        try_execute_stack("scale", "cpu:0", client, tunable, x())
    assert [info.value] == raised  # the candidate's own exception, raised once, never replayed
    assert client.ran[-1] == "flaky" and tuner.stats().invalidations == 1
    flaky_runs = client.ran.count("flaky")
    out = try_execute_stack("scale", "cpu:0", client, tunable, x())
    assert np.array_equal(out, x() * 2.0)
    assert client.ran[-1] == "correct"
    assert client.ran.count("flaky") == flaky_runs  # banned: not even tried again
    assert notes(tuner)["flaky"].startswith("skipped: banned")


# -- bad setup: refused before anything runs --------------------------------------------------------------------


def test_without_a_controller_try_execute_stack_is_unavailable_and_runs_nothing() -> None:
    client = ScriptedClient({"reference": 1.0})
    with pytest.raises(TuneFailure) as info:
        try_execute_stack("scale", "cpu:0", client, scripted_set(client, {"reference": reference}), x())
    assert info.value.kind is FailureKind.UNAVAILABLE and "not enabled" in info.value.message
    assert client.ran == []


def test_a_set_without_a_reference_is_invalid_input_before_anything_runs() -> None:
    enable_stack_autotune(SCRIPTED)
    client = ScriptedClient({"a": 1.0})
    tunable = TunableSet("scale", signature=array_signature)
    tunable.add(recorded(client, "a", reference), name="a")
    with pytest.raises(TuneFailure) as info:
        try_execute_stack("scale", "cpu:0", client, tunable, x())
    assert info.value.kind is FailureKind.INVALID_INPUT and "no explicit reference" in info.value.message
    assert client.ran == []


def test_a_set_without_a_signature_is_invalid_input_before_anything_runs() -> None:
    enable_stack_autotune(SCRIPTED)
    client = ScriptedClient({"reference": 1.0})
    tunable = TunableSet("scale", signature=None)
    tunable.add(recorded(client, "reference", reference), name="reference", reference=True)
    with pytest.raises(TuneFailure) as info:
        try_execute_stack("scale", "cpu:0", client, tunable, x())
    assert info.value.kind is FailureKind.INVALID_INPUT and "signature" in info.value.message
    assert client.ran == []


def test_the_controller_is_installed_once_and_querying_never_creates_one() -> None:
    assert stack_autotuner() is None
    assert stack_autotuner() is None
    first = enable_stack_autotune(SCRIPTED)
    with pytest.raises(TuneFailure) as info:
        enable_stack_autotune(StackPolicy())
    assert info.value.kind is FailureKind.INVALID_INPUT and "already configured" in info.value.message
    assert stack_autotuner() is first


def test_an_invalid_policy_installs_nothing() -> None:
    with pytest.raises(TuneFailure):
        enable_stack_autotune(StackPolicy(warmups=0))
    assert stack_autotuner() is None


# -- fences and device failures ----------------------------------------------------------------------------------


class BrokenSyncClient(ScriptedClient):
    def sync(self) -> None:
        raise RuntimeError("device lost")


def test_a_synchronization_failure_is_a_device_failure_that_quarantines_the_device() -> None:
    tuner = enable_stack_autotune(SCRIPTED)
    client = BrokenSyncClient({"reference": 1.0, "correct": 0.5}, index=3)
    tunable = scripted_set(client, {"reference": reference, "correct": correct})
    with pytest.raises(TuneFailure) as info:
        try_execute_stack("scale", "cpu:3", client, tunable, x())
    assert info.value.kind is FailureKind.DEVICE and "synchronization failed" in info.value.message
    assert tuner.quarantined() == {"cpu:3"}
    with pytest.raises(TuneFailure) as again:
        try_execute_stack("scale", "cpu:3", client, tunable, x())
    assert again.value.kind is FailureKind.QUARANTINED


class SubmissionErrorClient(ScriptedClient):
    """``flush`` fails once, right after the candidate that asked for it ran."""

    pending = False

    def flush(self) -> None:
        if self.pending:
            self.pending = False
            raise RuntimeError("launch failed")


def test_a_submission_error_after_a_clean_fence_rejects_only_that_candidate() -> None:
    tuner = enable_stack_autotune(SCRIPTED)
    client = SubmissionErrorClient({"reference": 1.0, "bad_launch": 0.1, "correct": 0.5})

    def bad_launch(v: np.ndarray) -> np.ndarray:
        client.pending = True
        return v + v

    tunable = scripted_set(client, {"reference": reference, "bad_launch": bad_launch, "correct": correct})
    out = try_execute_stack("scale", "cpu:0", client, tunable, x())
    assert np.array_equal(out, x() * 2.0)
    assert tuner.reports()[-1].winner == "correct"
    assert "submission failed after a successful completion fence" in notes(tuner)["bad_launch"]
    assert tuner.quarantined() == set()


# -- identity of the problem ---------------------------------------------------------------------------------------


def test_the_problem_names_a_device_kind_not_an_index_and_fusion_is_a_graph() -> None:
    client = ScriptedClient({})
    tunable = scripted_set(client, {"reference": reference})
    on_0 = problem_for("scale", "cpu:0", HostClient(0), tunable, (x(),))
    on_3 = problem_for("scale", "cpu:3", HostClient(3), tunable, (x(),))
    assert on_0 == on_3 and on_0.scope is Scope.OPERATOR
    assert problem_for("attention_fusion", "cpu:0", HostClient(0), tunable, (x(),)).scope is Scope.GRAPH


def test_a_decision_tuned_on_one_device_serves_another_of_the_same_class() -> None:
    tuner = enable_stack_autotune(REAL)
    tunable = TunableSet("scale", signature=array_signature)
    tunable.add(reference, reference=True)
    tunable.add(correct)
    try_execute_stack("scale", "cpu:1", HostClient(1), tunable, x())
    try_execute_stack("scale", "cpu:0", HostClient(0), tunable, x())
    assert (tuner.stats().tunes, tuner.stats().memory_hits) == (1, 1)


def test_prepared_requests_belong_to_the_controller_that_made_them() -> None:
    client = ScriptedClient({})
    tunable = scripted_set(client, {"reference": reference, "correct": correct})
    loose = StackTuner(SCRIPTED.replace(min_speedup=1.5))
    prepare(loose, "scale", "cpu:0", client, tunable, (x(),))
    del loose
    gc.collect()
    strict = StackTuner(SCRIPTED)
    prepared = prepare(strict, "scale", "cpu:0", client, tunable, (x(),))
    expected = strict.request(prepared.request.problem, prepared.request.candidates, 0, client.device_id)
    assert prepared.request.key == expected.key


def test_runtime_trials_validate_and_measure_directly() -> None:
    tunable = TunableSet("scale", signature=array_signature)
    tunable.add(reference, reference=True)
    tunable.add(correct)
    tunable.add(wrong_but_fast)
    trials = RuntimeTrials(HostClient(0), tunable, (x(),), (0, 1, 2), Timing.END_TO_END)
    assert trials.validate(0, 1, Tolerance()) is Validation.PASSED
    assert trials.last_check is not None and trials.last_check.max_abs_error == 0.0
    with pytest.raises(TuneFailure) as info:
        trials.validate(0, 2, Tolerance())
    assert info.value.kind is FailureKind.REJECTED and "wrong output" in info.value.message
    assert trials.validate(0, 2, Tolerance(max_bytes=8)) is Validation.UNSUPPORTED
    assert trials.measure(1) > 0


def test_adapter_decisions_come_from_the_installed_controller() -> None:
    tuner = enable_stack_autotune(SCRIPTED)
    client = ScriptedClient({"reference": 1.0, "correct": 0.5})
    tunable = scripted_set(client, {"reference": reference, "correct": correct})
    try_execute_stack("scale", "cpu:0", client, tunable, x())
    prepared = prepare(tuner, "scale", "cpu:0", client, tunable, (x(),))
    decision = tuner.select_request(prepared.request, RuntimeTrials(client, tunable, (x(),), prepared.indices, Timing.DEVICE))
    assert (decision.name, decision.source) == ("correct", DecisionSource.MEMORY_CACHE)
    adapter._uninstall_for_tests()
    assert stack_autotuner() is None
