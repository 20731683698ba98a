"""The CUDA runtime on a real device: fences, CUDA-event profiling, exclusive use, and try_execute_stack on CuPy
arrays. Every test here needs CuPy and a GPU; the conftest hook skips them elsewhere."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from farm.adapter import RuntimeTrials, enable_stack_autotune, try_execute_stack
from farm.arrays import array_signature, clone, compare_outputs
from farm.engine import Validation
from farm.environment import runtime_environment
from farm.errors import FailureKind, TuneFailure
from farm.policy import StackPolicy, Timing, Tolerance
from farm.runtimes.cuda import CudaClient, device_count
from farm.tunable import TunableSet

pytestmark = pytest.mark.gpu


@pytest.fixture
def cp() -> Any:
    import cupy

    return cupy


@pytest.fixture
def client() -> CudaClient:
    return CudaClient(0)


def scale_set(cp: Any) -> TunableSet:
    tunable = TunableSet("gpu_scale", signature=array_signature)
    tunable.add(lambda x: x * 2.0, name="reference", reference=True)
    tunable.add(lambda x: x + x, name="correct")
    tunable.add(lambda x: x * 2.01, name="wrong_but_fast")
    tunable.add(lambda x: cp.where(x > 0, cp.nan, x * 2.0), name="nan_output")
    tunable.add(lambda x: (x * 2.0).astype(cp.float32), name="wrong_dtype")
    return tunable


def test_a_cuda_client_describes_its_device_class(client: CudaClient) -> None:
    assert (client.backend, client.device_id, client.device_kind) == ("cuda-cupy", "cuda:0", "cuda")
    assert "sm_" in client.properties_fingerprint()
    assert client.driver_fingerprint() is not None
    assert "cupy" in client.compiler()


def test_sync_and_profile_time_completed_device_work(client: CudaClient, cp: Any) -> None:
    with client.activate():
        x = cp.random.random((2048, 2048), dtype=cp.float32)
    client.flush()
    client.sync()
    out, seconds = client.profile(lambda: x @ x)
    client.sync()
    assert out.shape == (2048, 2048)
    assert seconds > 0


def test_exclusive_excludes_another_thread_on_the_device(client: CudaClient) -> None:
    holding, release = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        with client.exclusive():
            holding.set()
            release.wait(10)
            order.append("first releases")

    def second() -> None:
        with CudaClient(0).exclusive():
            order.append("second acquires")

    a = threading.Thread(target=first)
    a.start()
    assert holding.wait(10)
    b = threading.Thread(target=second)
    b.start()
    release.set()
    a.join(10)
    b.join(10)
    assert order == ["first releases", "second acquires"]


def test_an_out_of_range_device_is_unavailable() -> None:
    with pytest.raises(TuneFailure) as info:
        CudaClient(device_count())
    assert info.value.kind is FailureKind.UNAVAILABLE and "no CUDA device" in info.value.message


def test_cupy_outputs_are_validated_on_the_host(cp: Any) -> None:
    x = cp.arange(16, dtype=cp.float64)
    assert compare_outputs(x * 2, x + x, Tolerance()).passed
    wrong = compare_outputs(x * 2, x * 2.01, Tolerance())
    assert wrong.supported and wrong.problem is not None


def test_a_strided_cupy_view_is_cloned_with_its_layout(cp: Any) -> None:
    base = cp.arange(120, dtype=cp.float32).reshape(10, 12)
    view = base[:, ::3]
    copy = clone(view)
    assert copy.strides == view.strides
    assert bool(cp.all(copy == view))
    copy[...] = -1
    assert float(base[0, 0]) == 0.0


@pytest.mark.parametrize("timing", [Timing.END_TO_END, Timing.DEVICE])
def test_try_execute_stack_on_cupy_arrays_never_picks_a_wrong_candidate(client: CudaClient, cp: Any, timing: Timing) -> None:
    tuner = enable_stack_autotune(StackPolicy(warmups=1, samples=3, timing=timing))
    x = cp.linspace(-3.0, 5.0, 1 << 16)
    tunable = scale_set(cp)
    out = try_execute_stack("gpu_scale", "cuda:0", client, tunable, x)
    client.sync()
    assert np.array_equal(cp.asnumpy(out), cp.asnumpy(x) * 2.0)
    report = tuner.reports()[-1]
    assert report.winner in ("reference", "correct")
    notes = {c.name: c.note for c in report.candidates}
    assert all(notes[n].startswith("rejected: ") for n in ("wrong_but_fast", "nan_output", "wrong_dtype"))
    again = try_execute_stack("gpu_scale", "cuda:0", client, tunable, x)
    assert tuner.stats().memory_hits == 1 and again.shape == x.shape


def test_runtime_trials_validate_cupy_outputs(client: CudaClient, cp: Any) -> None:
    tunable = scale_set(cp)
    trials = RuntimeTrials(client, tunable, (cp.ones(1024),), (0, 1, 2), Timing.DEVICE)
    assert trials.validate(0, 1, Tolerance()) is Validation.PASSED
    with pytest.raises(TuneFailure) as info:
        trials.validate(0, 2, Tolerance())
    assert info.value.kind is FailureKind.REJECTED
    assert trials.measure(1) > 0


def test_the_gpu_fingerprint_names_no_device_index(client: CudaClient) -> None:
    env = runtime_environment(client)
    assert "cuda:0" not in env.fingerprint
    if device_count() > 1:
        other = CudaClient(1)
        if other.properties_fingerprint() == client.properties_fingerprint():
            assert runtime_environment(other).fingerprint == env.fingerprint
