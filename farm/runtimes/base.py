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

    def model(self) -> str:
        """The device model for people (``NVIDIA H200``, the CPU's model name)."""
        ...

    def driver_fingerprint(self) -> str | None: ...

    def compiler(self) -> str: ...

    def runtime_options(self) -> str: ...


def parse_device(device: str) -> tuple[str, int]:
    """``"cpu:1"`` -> ("cpu", 1). Raises INVALID_INPUT naming the value."""
    kind, sep, index = device.partition(":")
    if kind not in ("cpu", "cuda") or not sep or not index.isdigit():
        raise TuneFailure.invalid(f"device {device!r} must look like cpu:N or cuda:N")
    return kind, int(index)


def lock_directory() -> Path:
    """Where device lock files live: ``FARM_LOCK_DIR`` or a fixed folder under the system temp directory."""
    return Path(os.environ.get("FARM_LOCK_DIR") or Path(tempfile.gettempdir()) / "farm-device-locks")


class _Held:
    """The process-wide state of one device's lock, shared by every client of that device."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.depth = 0
        self.fd: int | None = None


_held: dict[str, _Held] = {}
_held_guard = threading.Lock()


def _forget_in_child() -> None:
    """A forked child holds no device: drop its copies of the parent's lock state (and lock file descriptors)."""
    global _held_guard
    for state in _held.values():
        if state.fd is not None:
            with contextlib.suppress(OSError):
                os.close(state.fd)
    _held.clear()
    _held_guard = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


class DeviceLock:
    """Exclusive use of one physical device: a re-entrant lock per process, plus an OS file lock (flock) so
    that two processes never run trials on the same device at once. Re-entry by the holding thread is free, so a
    worker can hold the device for a whole group of trials."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = lock_directory() / f"{name}.lock"

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with _held_guard:
            state = _held.setdefault(self.name, _Held())
        with state.lock:
            if state.depth == 0:
                state.fd = self._acquire()
            state.depth += 1
            try:
                yield
            finally:
                state.depth -= 1
                if state.depth == 0 and state.fd is not None:
                    os.close(state.fd)  # closing releases the flock
                    state.fd = None

    def _acquire(self) -> int:
        try:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise TuneFailure.device(f"cannot open device lock {self.path}: {e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            os.close(fd)
            raise TuneFailure.device(f"cannot lock {self.path}: {e}") from e
        return fd
