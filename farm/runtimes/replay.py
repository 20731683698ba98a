"""The replay device: a recorded tuning space served as a device (``replay:N``), on a simulated clock.

:mod:`farm.replay` loads a recording; this is the device its trials run on. A recorded config launched inside
:meth:`ReplayClient.activate` advances that client's clock by a seeded draw from its recorded samples.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from farm.errors import ReplayFailure, TuneFailure
from farm.identity import fields
from farm.runtimes.base import DeviceLock, Synchronous, T

Key = tuple[Any, ...]


@dataclass(frozen=True)
class Recorded:
    """One recorded config, in seconds (``mean``: inf for a failure); ``failure``: compile, runtime, None."""

    times: tuple[float, ...]
    mean: float
    compile_seconds: float
    failure: str | None


class Recording(Protocol):
    """What the device needs of a recording (:class:`farm.replay.Recording`)."""

    path: Path
    digest: str
    device_name: str
    kernel_name: str
    configs: dict[Key, Recorded]


_active = threading.local()


def active_client() -> ReplayClient | None:
    return getattr(_active, "client", None)


class ReplayClient(Synchronous):
    """A recording served as a device (``replay:N``); see the module docstring. ``simulated``: the runtime
    adapter times it by its profile whatever the timing (it has no wall clock worth measuring)."""

    backend = "replay"
    device_kind = "replay"
    simulated = True

    def __init__(self, recording: Recording, seed: int = 0, index: int = 0) -> None:
        self.recording = recording
        self.seed = seed
        self.index = index
        self.device_id = f"replay:{index}"
        self.device_seconds = 0.0
        self.compile_seconds = 0.0
        self._rng = random.Random(seed)
        self._built: set[Key] = set()
        self._last: float | None = None
        self._lock = DeviceLock(f"replay-{recording.digest[:16]}-{index}")

    @property
    def clock(self) -> float:
        """The simulated clock: seconds the device has run since this client was made."""
        return self.device_seconds

    def build(self, key: Key) -> Recorded:
        """Compile a config (its recorded compile time, charged once per config); raises for a recorded
        compile failure. Off the device: the farm's compile stage calls it ahead of the trials."""
        recorded = self.recording.configs.get(key)
        if recorded is None:
            raise TuneFailure.rejected(f"config {key} was not recorded in {self.recording.path.name}")
        if key not in self._built:
            self._built.add(key)
            self.compile_seconds += recorded.compile_seconds
        if recorded.failure == "compile":
            raise ReplayFailure(f"compile failed as recorded (CompilationFailedConfig) for {key}")
        return recorded

    def run(self, key: Key) -> float:
        """Run a config once: a time drawn from its recorded samples, charged to the clock."""
        recorded = self.build(key)
        if recorded.failure == "runtime":
            raise ReplayFailure(f"launch failed as recorded (RuntimeFailedConfig) for {key}")
        seconds = self._rng.choice(recorded.times)
        self.device_seconds += seconds
        self._last = seconds
        return seconds

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        previous = active_client()
        _active.client = self
        try:
            yield
        finally:
            _active.client = previous

    def profile(self, fn: Callable[[], T]) -> tuple[T, float]:
        self._last = None
        with self.activate():
            out = fn()
        if self._last is None:
            raise TuneFailure.rejected("the candidate launched no recorded kernel on the replay device")
        return out, self._last

    def properties_fingerprint(self) -> str:
        return fields([self.recording.device_name, self.recording.kernel_name, f"sha256:{self.recording.digest}"])

    def model(self) -> str:
        return self.recording.device_name

    def driver_fingerprint(self) -> str | None:
        return f"replay of sha256:{self.recording.digest}"

    def compiler(self) -> str:
        return "recorded (Kernel Tuner cache file)"

    def runtime_options(self) -> str:
        return ""

    def __repr__(self) -> str:
        return f"ReplayClient({self.recording.path.name}, seed={self.seed}, {self.device_id})"
