"""Runtimes: the host client (exclusive across threads AND processes, CPU-time DEVICE timing), the fence, device
names, and the CUDA runtime's clean unavailability on a machine without one."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fakes import wait_until

from farm.adapter import RuntimeTrials, complete
from farm.arrays import array_signature
from farm.errors import FailureKind, TuneFailure
from farm.policy import Timing
from farm.runtimes import HostClient, client_for
from farm.runtimes.base import parse_device
from farm.tunable import TunableSet

ROOT = Path(__file__).resolve().parent.parent


def test_a_host_client_describes_its_device() -> None:
    client = HostClient(2)
    assert (client.backend, client.device_id, client.device_kind) == ("host-numpy", "cpu:2", "cpu")
    assert f"numpy {np.__version__}" in client.compiler()
    assert client.runtime_options().startswith(f"cpus={len(os.sched_getaffinity(0))}; blas=")
    assert client.properties_fingerprint() == HostClient(0).properties_fingerprint()
    assert repr(client) == "HostClient(cpu:2)"


def test_client_for_builds_a_host_client_from_a_device_name() -> None:
    client = client_for("cpu:1")
    assert isinstance(client, HostClient) and client.device_id == "cpu:1"


@pytest.mark.parametrize("device", ["gpu:0", "cpu", "cpu:", "cpu:-1", "cpu:x", "cuda:1.5", ""])
def test_a_malformed_device_name_is_invalid_input_naming_it(device: str) -> None:
    with pytest.raises(TuneFailure) as info:
        parse_device(device)
    assert info.value.kind is FailureKind.INVALID_INPUT and repr(device) in info.value.message


def test_parse_device_splits_kind_and_index() -> None:
    assert parse_device("cuda:12") == ("cuda", 12)


# -- the fence ---------------------------------------------------------------------------------------------------


class FenceClient(HostClient):
    def __init__(self, flush_error: Exception | None, sync_error: Exception | None) -> None:
        super().__init__(0)
        self.flush_error, self.sync_error = flush_error, sync_error

    def flush(self) -> None:
        if self.flush_error:
            raise self.flush_error

    def sync(self) -> None:
        if self.sync_error:
            raise self.sync_error


@pytest.mark.parametrize(
    ("flush_error", "sync_error", "kind", "says"),
    [
        (RuntimeError("bad launch"), None, FailureKind.REJECTED, "submission failed after a successful completion fence"),
        (None, RuntimeError("lost"), FailureKind.DEVICE, "synchronization failed: lost"),
        (RuntimeError("bad launch"), RuntimeError("lost"), FailureKind.DEVICE, "synchronization failed"),
        (None, TuneFailure.device("ECC error"), FailureKind.DEVICE, "ECC error"),
    ],
)
def test_the_fence_makes_a_sync_failure_a_device_failure_and_a_submission_error_a_rejection(
    flush_error: Exception | None, sync_error: Exception | None, kind: FailureKind, says: str
) -> None:
    with pytest.raises(TuneFailure) as info:
        complete(FenceClient(flush_error, sync_error))
    assert info.value.kind is kind and says in info.value.message


def test_a_clean_fence_returns_quietly() -> None:
    assert complete(FenceClient(None, None)) is None


# -- exclusive use of a device ------------------------------------------------------------------------------------


def test_exclusive_excludes_another_thread_on_the_same_device() -> None:
    holding, release = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        with HostClient(0).exclusive():
            holding.set()
            release.wait(10)
            order.append("first releases")

    def second() -> None:
        with HostClient(0).exclusive():
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


def test_different_devices_are_held_independently() -> None:
    with HostClient(0).exclusive(), HostClient(1).exclusive():
        probe = os.open(HostClient(2)._lock.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a third device is free
        finally:
            os.close(probe)


HOLDER = """
import sys, time
from pathlib import Path
from farm.runtimes.host import HostClient

held, release, releasing = (Path(p) for p in sys.argv[1:4])
with HostClient(0).exclusive():
    held.touch()
    deadline = time.monotonic() + 60
    while not release.exists():
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.001)
    releasing.touch()
"""


def lock_is_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_exclusive_excludes_another_process_on_the_same_device(tmp_path: Path) -> None:
    held, release, releasing = tmp_path / "held", tmp_path / "release", tmp_path / "releasing"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(held), str(release), str(releasing)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    acquired_after_release: list[bool] = []
    waiter: threading.Thread | None = None
    try:
        wait_until(held.exists, 30, "the child to hold cpu:0")
        path = HostClient(0)._lock.path
        assert not lock_is_free(path)  # the OS lock is held by the other process

        def take() -> None:
            with HostClient(0).exclusive():
                acquired_after_release.append(releasing.exists())

        waiter = threading.Thread(target=take)
        waiter.start()
        assert not lock_is_free(path)
        release.touch()
        waiter.join(30)
        assert not waiter.is_alive()
    finally:
        release.touch()
        assert child.wait(30) == 0
    assert acquired_after_release == [True]  # this process got the device only once the child let go
    assert lock_is_free(path)


def test_an_unusable_lock_directory_is_device_busy_not_a_device_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.errors import DeviceBusy

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("FARM_LOCK_DIR", str(blocker / "locks"))
    with pytest.raises(DeviceBusy, match="cannot create the device lock folder"), HostClient(7).exclusive():
        pass


# -- timing -------------------------------------------------------------------------------------------------------


def test_device_timing_on_the_host_is_cpu_time_so_sleeping_costs_little() -> None:
    client = HostClient(0)
    start = time.perf_counter()
    out, cpu = client.profile(lambda: time.sleep(0.05) or "done")
    wall = time.perf_counter() - start
    assert out == "done"
    assert 0 <= cpu < wall


def test_a_sleeping_candidate_has_less_device_time_than_end_to_end_time() -> None:
    tunable = TunableSet("nap", signature=array_signature)
    tunable.add(lambda v: (time.sleep(0.03), v.copy())[1], name="napper", reference=True)
    inputs = (np.ones(4),)
    device = RuntimeTrials(HostClient(0), tunable, inputs, (0,), Timing.DEVICE).measure(0)
    wall = RuntimeTrials(HostClient(0), tunable, inputs, (0,), Timing.END_TO_END).measure(0)
    assert device < wall


def test_a_busy_candidate_has_positive_device_time() -> None:
    tunable = TunableSet("busy", signature=array_signature)
    tunable.add(lambda v: np.sort(np.tile(v, 2000)), name="sorter", reference=True)
    assert RuntimeTrials(HostClient(0), tunable, (np.random.default_rng(0).random(64),), (0,), Timing.DEVICE).measure(0) > 0


# -- CUDA without a GPU ---------------------------------------------------------------------------------------------


def test_the_cuda_runtime_imports_without_cupy_or_a_gpu() -> None:
    import farm.runtimes.cuda as cuda

    assert cuda.device_count() == 0


@pytest.mark.parametrize("make", [lambda: __import__("farm.runtimes.cuda").runtimes.cuda.CudaClient(0), lambda: client_for("cuda:0")])
def test_creating_a_cuda_client_without_a_device_is_unavailable_saying_so(make: Callable[[], object]) -> None:
    with pytest.raises(TuneFailure) as info:
        make()
    assert info.value.kind is FailureKind.UNAVAILABLE
    assert "no CUDA device" in info.value.message


def test_import_farm_loads_neither_cupy_nor_celery_nor_redis() -> None:
    probe = "import sys, farm, farm.runtimes.cuda; print(sorted(m for m in ('cupy', 'celery', 'redis') if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
