"""The compute-client port: what the controller needs from a device."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from farm.errors import TuneFailure


class ComputeClient(Protocol):
    """One device. ``flush`` submits queued work (raising = a submission error), ``sync`` waits for completion
    (raising = a device failure), ``exclusive`` holds the device against other threads AND processes,
    ``profile`` runs a callable and returns ``(output, device_seconds)``."""

    backend: str
    device_id: str
    device_kind: str

    def flush(self) -> None: ...

    def sync(self) -> None: ...

    def exclusive(self) -> AbstractContextManager[None]: ...

    def activate(self) -> AbstractContextManager[None]: ...

    def profile(self, fn: Callable[[], Any]) -> tuple[Any, float]: ...

    def properties_fingerprint(self) -> str: ...

    def driver_fingerprint(self) -> str | None: ...

    def compiler(self) -> str: ...

    def runtime_options(self) -> str: ...


def parse_device(device: str) -> tuple[str, int]:
    """``"cpu:1"`` -> ("cpu", 1). Raises INVALID_INPUT naming the value."""
    kind, sep, index = device.partition(":")
    if kind not in ("cpu", "cuda") or not sep or not index.isdigit():
        raise TuneFailure.invalid(f"device {device!r} must look like cpu:N or cuda:N")
    return kind, int(index)


def client_for(device: str) -> ComputeClient:
    """The client for ``cpu:N`` or ``cuda:N``; a CUDA client without a device raises UNAVAILABLE."""
    kind, index = parse_device(device)
    if kind == "cpu":
        from farm.runtimes.host import HostClient

        return HostClient(index)
    from farm.runtimes.cuda import CudaClient

    return CudaClient(index)


def lock_directory() -> Path:
    """Where device lock files live: ``FARM_LOCK_DIR`` or a fixed folder under the system temp directory."""
    return Path(os.environ.get("FARM_LOCK_DIR") or Path(tempfile.gettempdir()) / "farm-device-locks")


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


class DeviceLock:
    """Exclusive use of one physical device: a lock per process thread, plus an OS file lock (flock) so that two
    processes never run trials on the same device at once."""

    def __init__(self, name: str) -> None:
        self.name = name
        with _thread_locks_guard:
            self._thread_lock = _thread_locks.setdefault(name, threading.Lock())
        self.path = lock_directory() / f"{name}.lock"

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._thread_lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as e:
                raise TuneFailure.device(f"cannot open device lock {self.path}: {e}") from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the flock
