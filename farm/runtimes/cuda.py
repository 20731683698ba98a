"""The CUDA runtime: CuPy on ``cuda:N``, one stream per client, CUDA events for DEVICE timing.

Importing this module never touches CuPy or a GPU; creating a :class:`CudaClient` does, and raises TuneFailure
UNAVAILABLE with "no CUDA device" (or how to install CuPy) when it cannot.
The fingerprint's parts, and why NVML (``nvidia-ml-py``) goes on workers and applications alike or on neither:
docs/farm.md and docs/deployment.md.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from farm.errors import TuneFailure
from farm.runtimes.base import DeviceLock, T

INSTALL_HINT = "install CuPy for your CUDA version, e.g. pip install 'tuning-farm[cuda]' (cupy-cuda12x)"


def import_cupy() -> Any:
    """CuPy, or TuneFailure UNAVAILABLE saying how to install it."""
    try:
        import cupy
    except ImportError as e:
        raise TuneFailure.unavailable(f"no CUDA device: CuPy is not installed ({INSTALL_HINT})") from e
    return cupy


def device_count() -> int:
    """Visible CUDA devices; 0 without CuPy, driver or device."""
    try:
        return int(import_cupy().cuda.runtime.getDeviceCount())
    except Exception:
        return 0


class CudaClient:
    """``cuda:N`` (N counts visible devices: after CUDA_VISIBLE_DEVICES pinning the one device is cuda:0)."""

    backend = "cuda-cupy"
    device_kind = "cuda"

    def __init__(self, index: int = 0) -> None:
        cupy = import_cupy()
        count = device_count()
        if count == 0:
            raise TuneFailure.unavailable("no CUDA device: the CUDA runtime reports no visible device")
        if not 0 <= index < count:
            raise TuneFailure.unavailable(f"no CUDA device cuda:{index}: {count} device(s) visible")
        self._cupy = cupy
        self.index = index
        self.device_id = f"cuda:{index}"
        self.device = cupy.cuda.Device(index)
        with self.device:
            self.stream = cupy.cuda.Stream(non_blocking=True)
        bus = cupy.cuda.runtime.deviceGetPCIBusId(index).replace(":", "-").replace(".", "-")
        self._lock = DeviceLock(f"cuda-{bus}")

    def flush(self) -> None:
        return None  # CuPy submits at launch; nothing is queued on the host side

    def sync(self) -> None:
        try:
            with self.device:
                self.stream.synchronize()
        except Exception as e:
            raise TuneFailure.device(f"CUDA synchronization failed on {self.device_id}: {e}") from e

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self._lock.hold()

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        with self.device, self.stream:
            yield

    def profile(self, fn: Callable[[], T]) -> tuple[T, float]:
        cuda = self._cupy.cuda
        with self.device, self.stream:
            start, end = cuda.Event(), cuda.Event()
            start.record(self.stream)
            out = fn()
            end.record(self.stream)
        try:
            end.synchronize()
        except Exception as e:
            raise TuneFailure.device(f"CUDA event synchronization failed on {self.device_id}: {e}") from e
        return out, cuda.get_elapsed_time(start, end) / 1e3

    def properties_fingerprint(self) -> str:
        return _properties(self.index)

    def model(self) -> str:
        return _properties(self.index).split(";")[0]

    def driver_fingerprint(self) -> str | None:
        return driver_text(self._cupy)

    def compiler(self) -> str:
        return compiler_text(self._cupy)

    def runtime_options(self) -> str:
        return f"allocator={type(self._cupy.get_default_memory_pool()).__name__}"

    def __repr__(self) -> str:
        return f"CudaClient({self.device_id})"


COMPUTE_MODES = {0: "default", 1: "exclusive-thread", 2: "prohibited", 3: "exclusive-process"}


@cache
def _properties(index: int) -> str:
    import cupy

    rt = cupy.cuda.runtime
    return properties_text(rt.getDeviceProperties(index), mig_profile(rt.deviceGetPCIBusId(index), index))


def properties_text(p: dict[str, Any], mig: str) -> str:
    """The device-class part of the fingerprint from CuPy's ``getDeviceProperties`` dict (pure)."""
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    mode = p.get("computeMode")
    return (
        f"{name}; sm_{p['major']}{p['minor']}; {p['multiProcessorCount']} SMs; "
        f"{p['totalGlobalMem']} bytes; {p.get('clockRate', '?')} kHz; "
        f"compute mode {COMPUTE_MODES.get(mode, str(mode)) if mode is not None else 'unknown'}; {mig}"
    )


def driver_text(cupy: Any) -> str | None:
    """CUDA driver and runtime versions, or None when the driver cannot say."""
    rt = cupy.cuda.runtime
    try:
        return f"cuda driver {rt.driverGetVersion()}; runtime {rt.runtimeGetVersion()}"
    except Exception:
        return None


def compiler_text(cupy: Any) -> str:
    """CuPy and NVRTC versions."""
    try:
        nvrtc = ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
    except Exception:
        nvrtc = "unknown"
    return f"cupy {cupy.__version__}; nvrtc {nvrtc}"


def mig_profile(pci_bus_id: str, index: int = 0, nvml: Any = None) -> str:
    """``mig off``, ``mig <profile>`` (``mig 1g.18gb``: visible device ``index`` of the MIG-... instances
    in CUDA_VISIBLE_DEVICES), ``mig on`` (profile not visible) or ``mig unknown`` (no ``nvml``: pynvml)."""
    try:
        if nvml is None:
            nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:
        return "mig unknown"
    try:
        handle = nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        if not current:
            return "mig off"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        uuids = [v.strip() for v in visible if v.strip().startswith("MIG-")]
        if index >= len(uuids):
            return "mig on"
        name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByUUID(uuids[index]))
        name = name.decode() if isinstance(name, bytes) else str(name)
        return f"mig {name.rpartition(' MIG ')[2] or name}"
    except Exception:
        return "mig unknown"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
