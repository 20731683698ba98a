"""The compute-client port: what the controller needs from a device."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from farm.errors import DeviceBusy, TuneFailure

T = TypeVar("T")  # what a profiled callable returns


class DescribedDevice(Protocol):
    """A device as its environment fingerprint sees it (farm.environment): backend (``cpu``, ``cuda``), id, kind,
    what tells one SKU, driver, compiler and runtime apart, and ``model()``, its name for people."""

    backend: str
    device_id: str
    device_kind: str

    def properties_fingerprint(self) -> str: ...

    def model(self) -> str: ...

    def driver_fingerprint(self) -> str | None: ...

    def compiler(self) -> str: ...

    def runtime_options(self) -> str: ...


class ComputeClient(DescribedDevice, Protocol):
    """One device as the runtime adapters hold it: described, and timed for trials. ``flush`` submits queued
    work (raising = a submission error), ``sync`` waits for completion (raising = a device failure),
    ``exclusive`` holds the device against other threads AND processes, ``activate`` makes it current for the
    calling thread, ``profile`` returns ``(fn(), seconds it took on this device)``."""

    def flush(self) -> None: ...

    def sync(self) -> None: ...

    def exclusive(self) -> AbstractContextManager[None]: ...

    def activate(self) -> AbstractContextManager[None]: ...

    def profile(self, fn: Callable[[], T]) -> tuple[T, float]: ...


def parse_device(device: str) -> tuple[str, int]:
    """``"cpu:1"`` -> ("cpu", 1). Raises INVALID_INPUT naming the value."""
    kind, sep, index = device.partition(":")
    if kind not in ("cpu", "cuda") or not sep or not index.isdigit():
        raise TuneFailure.invalid(f"device {device!r} must look like cpu:N or cuda:N")
    return kind, int(index)


LOCK_DIR_VARIABLE = "FARM_LOCK_DIR"


def lock_directory() -> Path:
    """Where device lock files live: ``FARM_LOCK_DIR`` when set (a folder the deployment chose, e.g. one shared
    by a group), else a private per-user folder: ``$XDG_RUNTIME_DIR/farm-locks`` or ``/tmp/farm-locks-<uid>``."""
    configured = os.environ.get(LOCK_DIR_VARIABLE)
    if configured:
        return Path(configured)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return Path(runtime) / "farm-locks"
    return Path(tempfile.gettempdir()) / f"farm-locks-{os.geteuid()}"


_verified: set[Path] = set()  # lock folders checked by this process (a trial takes the lock: keep it cheap)


def _prepare(path: Path, shared: bool) -> None:
    """Create the lock folder if needed. Unless it is shared (FARM_LOCK_DIR), check that it is a directory of
    this user's, closed to others: one another user created or can write would let them hold our locks."""
    try:
        path.mkdir(mode=0o777 if shared else 0o700, parents=True, exist_ok=True)
        info = None if shared else os.lstat(path)
    except OSError as e:
        raise DeviceBusy(f"cannot create the device lock folder {path}: {e}") from e
    if info is not None:
        if not stat.S_ISDIR(info.st_mode):
            raise DeviceBusy(f"device lock folder {path} is not a directory (a symlink or a file); "
                             f"set {LOCK_DIR_VARIABLE}")
        if info.st_uid != os.geteuid():
            raise DeviceBusy(f"device lock folder {path} belongs to uid {info.st_uid}, not to this user "
                             f"(uid {os.geteuid()}); remove it or set {LOCK_DIR_VARIABLE}")
        if info.st_mode & 0o077:
            try:
                os.chmod(path, 0o700)
            except OSError as e:
                raise DeviceBusy(f"device lock folder {path} is open to other users and cannot be closed: "
                                 f"{e}") from e
    _verified.add(path)


@dataclass
class _Held:
    """The process-wide state of one device's lock, shared by every client of that device."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    depth: int = 0
    fd: int | None = None


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
    """Exclusive use of one physical device: a re-entrant lock in the process plus a file lock (flock) across
    processes. Re-entry by the holding thread is free: a worker may hold the device for a group of trials."""

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
        """Open and flock the lock file; DeviceBusy (never a device failure) when it cannot be taken at all."""
        directory = self.path.parent
        shared = bool(os.environ.get(LOCK_DIR_VARIABLE))
        if directory not in _verified:
            _prepare(directory, shared)
        # No symlinks: a planted link must not make us create or lock another file.
        flags, mode = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666 if shared else 0o600
        try:
            try:
                fd = os.open(self.path, flags, mode)
            except FileNotFoundError:  # the folder went away since we checked it: check (and create) it again
                _verified.discard(directory)
                _prepare(directory, shared)
                fd = os.open(self.path, flags, mode)
        except OSError as e:
            raise DeviceBusy(f"cannot open device lock {self.path}: {e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            os.close(fd)
            raise DeviceBusy(f"cannot lock {self.path}: {e}") from e
        return fd


class Synchronous:
    """A device whose work is synchronous (host, replay): no-op fences; ``exclusive`` holds its ``_lock``."""

    _lock: DeviceLock

    def flush(self) -> None:
        return None

    def sync(self) -> None:
        return None

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self._lock.hold()
