"""The host runtime: NumPy on ``cpu:N``. DEVICE timing is the CPU time the process spent (BLAS threads
included); END_TO_END is wall clock."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import numpy as np

from farm.runtimes.base import DeviceLock

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE")


class HostClient:
    """``cpu:N``: the host as a device. Work is synchronous, so ``flush`` and ``sync`` only mark the fences."""

    backend = "host-numpy"
    device_kind = "cpu"

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.device_id = f"cpu:{index}"
        self._lock = DeviceLock(f"cpu-{index}")

    def flush(self) -> None:
        return None

    def sync(self) -> None:
        return None

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self._lock.hold()

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        yield

    def profile(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        start = time.process_time()
        out = fn()
        return out, time.process_time() - start

    def properties_fingerprint(self) -> str:
        return _properties()

    def model(self) -> str:
        return _cpu_model()

    def driver_fingerprint(self) -> str | None:
        return _driver()

    def compiler(self) -> str:
        return f"{platform.python_implementation()} {sys.version.split()[0]}; numpy {np.__version__}"

    def runtime_options(self) -> str:
        return ";".join(f"{v}={os.environ.get(v, '')}" for v in _THREAD_VARIABLES)

    def __repr__(self) -> str:
        return f"HostClient({self.device_id})"


@cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@cache
def _blas() -> str:
    try:
        config: Any = np.show_config(mode="dicts")
        blas = config.get("Build Dependencies", {}).get("blas", {})
        return f"{blas.get('name', '?')} {blas.get('version', '?')}"
    except Exception:
        return "unknown"


@cache
def _properties() -> str:
    return f"{platform.machine()}; {_cpu_model()}; {os.cpu_count()} logical cores; numpy {np.__version__}; {_blas()}"


@cache
def _driver() -> str | None:
    if not platform.release():
        return None
    return f"{platform.system()} {platform.release()}; {_blas()}"
