"""The host runtime: NumPy on ``cpu:N``. DEVICE timing is the CPU time the process spent (BLAS threads
included); END_TO_END is wall clock.

The host's execution regime is part of its fingerprint: the number of CPUs the process may run on and the sizes of
its thread pools (BLAS, OpenMP), as the process sees them (:func:`host_regime`). A decision measured on one core
with one BLAS thread is never served to a process with four cores and four threads.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from farm.runtimes.base import DeviceLock, Synchronous, T

# Every variable a numeric library reads for its pool size at start-up (OpenMP, OpenBLAS, MKL, BLIS, Accelerate,
# numexpr): set before the library loads, they size its pool; threadpoolctl resizes the pools already loaded.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


class HostClient(Synchronous):
    """``cpu:N``: the host as a device. Work is synchronous, so ``flush`` and ``sync`` only mark the fences."""

    backend = "host-numpy"
    device_kind = "cpu"

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.device_id = f"cpu:{index}"
        self._lock = DeviceLock(f"cpu-{index}")

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        yield

    def profile(self, fn: Callable[[], T]) -> tuple[T, float]:
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
        """The process's regime: ``cpus=N; blas=K (openblas Haswell); openmp=M`` (see :func:`host_regime`)."""
        return host_regime().text()

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


@dataclass(frozen=True)
class HostRegime:
    """The execution regime of this process on the host. ``cpus``: the size of its CPU set
    (``os.sched_getaffinity``); ``blas``: the largest BLAS pool loaded; ``openmp``: the largest OpenMP pool loaded,
    or, when none is loaded yet, the size one would start with (OMP_NUM_THREADS, else ``cpus``); ``libraries``: the
    BLAS implementations and the core types they chose (OPENBLAS_CORETYPE changes it)."""

    cpus: int
    blas: int
    openmp: int
    libraries: tuple[str, ...] = ()

    def text(self) -> str:
        kinds = f" ({', '.join(self.libraries)})" if self.libraries else ""
        return f"cpus={self.cpus}; blas={self.blas}{kinds}; openmp={self.openmp}"

    def to_dict(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "blas": self.blas, "openmp": self.openmp, "libraries": list(self.libraries)}


def cpu_set() -> frozenset[int]:
    """The CPUs this process may run on."""
    return frozenset(os.sched_getaffinity(0))


def host_regime() -> HostRegime:
    """Probe this process's regime: its CPU set and its loaded thread pools (through threadpoolctl)."""
    from threadpoolctl import threadpool_info

    return regime_from(len(cpu_set()), threadpool_info(), os.environ)


def regime_from(cpus: int, pools: list[dict[str, Any]], environ: Mapping[str, str]) -> HostRegime:
    """The regime for ``cpus`` CPUs and threadpoolctl's ``pools`` description (pure: tests pass fakes)."""
    blas = [p for p in pools if p.get("user_api") == "blas"]
    openmp = [p for p in pools if p.get("user_api") == "openmp"]
    libraries = sorted({" ".join(str(p[k]) for k in ("internal_api", "architecture") if p.get(k)) for p in blas})
    would_start = _leading_int(environ.get("OMP_NUM_THREADS", "")) or cpus
    return HostRegime(
        cpus=cpus,
        blas=max((int(p["num_threads"]) for p in blas), default=0),
        openmp=max((int(p["num_threads"]) for p in openmp), default=would_start),
        libraries=tuple(libraries),
    )


def regime_key() -> tuple[int, ...]:
    """A cheap summary that changes when the CPU set or a loaded pool's size changes (the environment memo's
    key); a pool that a library loads later is noticed only by a new probe (clear_environment_memo)."""
    return (len(cpu_set()), *(lib.get_num_threads() or 0 for lib in _controller().lib_controllers))


@cache
def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def limit_threads(cores: int) -> HostRegime:
    """Limit every thread pool of this process, and of the processes it starts, to ``cores`` threads: the
    environment for libraries not loaded yet, threadpoolctl for those already loaded. Returns the regime after."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    from threadpoolctl import threadpool_limits

    for variable in THREAD_VARIABLES:
        os.environ[variable] = str(cores)
    threadpool_limits(limits=cores)
    _controller.cache_clear()
    return host_regime()


def _leading_int(text: str) -> int:
    head = text.split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) > 0 else 0
