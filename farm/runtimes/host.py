"""The host runtime: NumPy on ``cpu:N``. DEVICE timing is the CPU time the process spent (BLAS threads
included); END_TO_END is wall clock. The execution regime (CPU set, BLAS and OpenMP pool sizes:
:func:`host_regime`) is part of its fingerprint (docs/deployment.md).
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

# What OpenMP, OpenBLAS, MKL, BLIS, Accelerate and numexpr read for their pool size when they load.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


class HostClient(Synchronous):
    """``cpu:N``: the host as a device (synchronous)."""

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
        machine, cores = platform.machine(), os.cpu_count()
        return f"{machine}; {_cpu_model()}; {cores} logical cores; numpy {np.__version__}; {_blas()}"

    def model(self) -> str:
        return _cpu_model()

    def driver_fingerprint(self) -> str | None:
        return f"{platform.system()} {platform.release()}; {_blas()}" if platform.release() else None

    def compiler(self) -> str:
        return f"{platform.python_implementation()} {sys.version.split()[0]}; numpy {np.__version__}"

    def runtime_options(self) -> str:
        """The process's regime: ``cpus=N; blas=K (openblas Haswell); openmp=M`` (see :func:`host_regime`)."""
        return host_regime().text()

    def __repr__(self) -> str:
        return f"HostClient({self.device_id})"


@cache
def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@cache
def _blas() -> str:
    try:
        config: Any = np.show_config(mode="dicts")
        blas = config.get("Build Dependencies", {}).get("blas", {})
        return f"{blas.get('name', '?')} {blas.get('version', '?')}"
    except Exception:
        return "unknown"


@dataclass(frozen=True)
class HostRegime:
    """``cpus``: the CPU set's size; ``blas``/``openmp``: the largest BLAS/OpenMP pool loaded (no OpenMP
    one: what it would start, OMP_NUM_THREADS else ``cpus``); ``libraries``: BLAS libraries, core types."""

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
    head = environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # "4,2": nested levels, the outer first
    would_start = int(head) if head.isdigit() and int(head) > 0 else cpus
    return HostRegime(cpus, max((int(p["num_threads"]) for p in blas), default=0),
                      max((int(p["num_threads"]) for p in openmp), default=would_start), tuple(libraries))


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
