"""Compile a :class:`~farm_kernels.cuda.CudaProgram` with NVRTC, as CuPy does, without CuPy and without a GPU.

CuPy's ``RawModule`` compiles with NVRTC (not nvcc). This module loads ``libnvrtc`` through ``ctypes`` (the
``nvidia-cuda-nvrtc-cu12`` wheel ships it; no driver or device is needed) and compiles a program's text with the
options CuPy adds for a device of the given architecture (see ``cupy/cuda/compiler.py``:
``_compile_with_cache_cuda`` adds ``-ftz=true``, ``_compile_using_nvrtc_no_warning`` adds ``-arch=sm_XX`` and
``--device-as-default-execution-space``), so the cubin is the one a device would load. The resources of its
kernels come from :mod:`farm_kernels.cuda.cubin`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from farm.errors import NvrtcError, NvrtcUnavailable
from farm_kernels.cuda import CudaProgram

# What cupy/cuda/compiler.py appends to a RawModule's options for an architecture NVRTC can target directly.
CUPY_OPTIONS = ("-ftz=true", "--device-as-default-execution-space")
LIBRARY_ENV = "FARM_NVRTC_LIBRARY"

_lock = threading.Lock()
_library: ctypes.CDLL | None = None


def library_path() -> str | None:
    """Where libnvrtc is: ``$FARM_NVRTC_LIBRARY``, an NVIDIA wheel (``nvidia-cuda-nvrtc-cu12`` and the like, any
    layout under the ``nvidia`` package), the toolkit under ``$CUDA_HOME`` or ``/usr/local/cuda``, or the system's."""
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        return explicit
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    folders = [Path(f) for f in (spec.submodule_search_locations or ())] if spec is not None else []
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for folder in folders:
        found = sorted(p for p in folder.glob("*/lib/libnvrtc.so.*") if ".alt." not in p.name and p.name.count(".") == 2)
        if found:
            return str(found[-1])
    toolkit = sorted(p for p in Path(home, "lib64").glob("libnvrtc.so.*") if p.name.count(".") == 2)
    return str(toolkit[-1]) if toolkit else ctypes.util.find_library("nvrtc")


def load() -> ctypes.CDLL:
    """libnvrtc, loaded once; :class:`NvrtcUnavailable` naming what was tried when it cannot be loaded."""
    global _library
    with _lock:
        if _library is None:
            path = library_path()
            if path is None:
                raise NvrtcUnavailable(
                    "libnvrtc not found: pip install nvidia-cuda-nvrtc-cu12 (the dev extras include it) "
                    f"or set {LIBRARY_ENV}"
                )
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                raise NvrtcUnavailable(f"cannot load libnvrtc from {path}: {e}") from e
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            _library = lib
        return _library


def version() -> tuple[int, int]:
    """NVRTC's (major, minor)."""
    lib = load()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def supported_archs() -> tuple[int, ...]:
    """The compute capabilities this NVRTC can compile for (e.g. 80, 90)."""
    lib = load()
    count = ctypes.c_int()
    _check(lib, lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)), "nvrtcGetNumSupportedArchs")
    archs = (ctypes.c_int * count.value)()
    _check(lib, lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
    return tuple(archs)


@dataclass(frozen=True)
class Compiled:
    """One program compiled for one architecture: its cubin, NVRTC's log (with ptxas' ``-v`` report) and the
    options it was compiled with."""

    filename: str
    arch: str
    options: tuple[str, ...]
    cubin: bytes
    log: str


def cupy_options(program: CudaProgram, arch: str) -> tuple[str, ...]:
    """The options CuPy's RawModule compiles ``program`` with on a device of architecture ``arch`` (``sm_90``)."""
    return (*program.options, *CUPY_OPTIONS[:1], f"-arch={arch}", *CUPY_OPTIONS[1:])


def compile_program(program: CudaProgram, arch: str, verbose: bool = True) -> Compiled:
    """Compile ``program`` to a cubin for ``arch`` (``sm_80``, ``sm_90``) with CuPy's options; ``verbose`` adds
    ``--ptxas-options=-v`` so the log reports each kernel's registers and memory. :class:`NvrtcError` with the
    log when NVRTC rejects the program."""
    options = cupy_options(program, arch)
    return compile_text(program.text, program.filename, arch, options + (("--ptxas-options=-v",) if verbose else ()))


def compile_text(text: str, filename: str, arch: str, options: tuple[str, ...]) -> Compiled:
    lib = load()
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), filename.encode(), 0, None, None), "nvrtcCreateProgram")
    try:
        argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        status = lib.nvrtcCompileProgram(prog, len(options), argv)
        # NVRTC's log may hold NULs inside (ptxas' part after the front end's): none belongs in a verdict's text.
        log = _read(lib, prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").decode(errors="replace").replace("\x00", "")
        if status != 0:
            raise NvrtcError(f"{filename} ({arch}, options {' '.join(options)}): {_message(lib, status)}\n{log}")
        cubin = _read(lib, prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if not cubin:
        raise NvrtcError(f"{filename} ({arch}): NVRTC produced no cubin (is {arch} a real architecture?)")
    return Compiled(filename, arch, options, cubin, log)


def _read(lib: ctypes.CDLL, prog: ctypes.c_void_p, size_fn: str, get_fn: str) -> bytes:
    size = ctypes.c_size_t()
    _check(lib, getattr(lib, size_fn)(prog, ctypes.byref(size)), size_fn)
    buffer = ctypes.create_string_buffer(size.value)
    _check(lib, getattr(lib, get_fn)(prog, buffer), get_fn)
    return buffer.raw[: size.value]


def _message(lib: ctypes.CDLL, status: int) -> str:
    text = lib.nvrtcGetErrorString(status)
    return text.decode() if text else f"NVRTC status {status}"


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        raise NvrtcError(f"{what}: {_message(lib, status)}")
