"""CUDA sources of the builtin operations (``*.cu`` in this folder) and their lazy loader.

A :class:`CudaProgram` is one ``.cu`` file with ``common.cu`` prepended, plus the NVRTC options it is compiled
with. Nothing here imports CuPy until a kernel is launched: the first launch on a device compiles the program
with ``cupy.RawModule`` and keeps the module for that device. A program with a ``loader`` (the variants of a
CUDA space, :mod:`farm_kernels.cuda.spaces`) loads through it instead: the cubin the compile stage stored in the
kernel cache, so no NVRTC runs on the trial path (:mod:`farm_kernels.cuda.compile`). A candidate's code identity
(:meth:`CudaProgram.identity`) is the program text, the options, the kernel name and the launch configuration,
so changing any of them changes the tunable set's checksum.

The candidates take their array module from their inputs (:func:`array_module`): CuPy for device arrays, NumPy
for host arrays. That lets the tests drive every CUDA candidate's Python side without a GPU, with
:meth:`CudaKernel.launch` replaced by a recorder that checks each launch against the compiled PTX.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from farm.arrays import clone
from farm.errors import TuneFailure
from farm.identity import fields

SOURCE_DIR = Path(__file__).resolve().parent
COMMON = "common.cu"
DEFAULT_OPTIONS = ("-std=c++17",)
SUFFIXES = {"float16": "f16", "float32": "f32", "float64": "f64"}


def source_text(filename: str) -> str:
    """The text of one ``.cu`` file of this folder."""
    return (SOURCE_DIR / filename).read_text(encoding="utf-8")


class CudaProgram:
    """One compilation unit: ``common.cu`` + ``filename`` (or an explicit ``text``), compiled with ``options``."""

    def __init__(self, filename: str, options: Sequence[str] = DEFAULT_OPTIONS, text: str | None = None,
                 loader: Callable[[CudaProgram, Any], Any] | None = None) -> None:
        self.filename = filename
        self.loader = loader
        self.options = tuple(options)
        self.text = text if text is not None else f"{source_text(COMMON)}\n{source_text(filename)}"
        self.kernels: dict[str, CudaKernel] = {}
        self._modules: dict[int, Any] = {}
        self._functions: dict[tuple[int, str], Any] = {}
        self._lock = threading.Lock()
        self.cubin_keys: dict[int, str] = {}  # device id -> the kernel cache key of the cubin loaded there

    def kernel(self, base: str, dtypes: Sequence[str]) -> CudaKernel:
        """The kernel family ``base`` with one ``extern "C"`` entry per dtype: ``{base}_{f16|f32|f64}``."""
        with self._lock:
            found = self.kernels.get(base)
            if found is None:
                found = self.kernels[base] = CudaKernel(self, base, tuple(dtypes))
            return found

    def entry_names(self) -> tuple[str, ...]:
        """Every entry point the candidates launch (what the PTX must define)."""
        return tuple(name for k in self.kernels.values() for name in k.names())

    def identity(self, kernel: CudaKernel, launch: object) -> str:
        """A candidate's CUDA code identity: source text, compile options, kernel and launch configuration."""
        return fields([self.filename, self.text, " ".join(self.options), kernel.base, repr(launch)])

    def function(self, name: str) -> Any:
        """The compiled kernel ``name`` on the current CuPy device (compiling the program there on first use)."""
        from farm.runtimes.cuda import import_cupy

        cupy = import_cupy()
        key = (cupy.cuda.Device().id, name)
        with self._lock:
            found = self._functions.get(key)
            if found is None:
                try:
                    module = self._modules.get(key[0])
                    if module is None:
                        module = self._modules[key[0]] = self._load(cupy)
                    found = self._functions[key] = module.get_function(name)
                except Exception as e:
                    raise TuneFailure.rejected(f"{self.filename}: cannot load {name} (options {self.options}): {e}") from e
        return found

    def _load(self, cupy: Any) -> Any:
        """The program's module on the current device: through ``loader`` when the program has one (a space's
        variant: the kernel cache's cubin, farm_kernels.cuda.compile.load_module), else CuPy compiles the source."""
        if self.loader is not None:
            return self.loader(self, cupy)
        return cupy.RawModule(code=self.text, options=self.options)

    def __repr__(self) -> str:
        return f"CudaProgram({self.filename!r}, options={self.options!r})"


class CudaKernel:
    """A kernel family of a program: one entry point per supported dtype."""

    def __init__(self, program: CudaProgram, base: str, dtypes: tuple[str, ...]) -> None:
        unknown = [d for d in dtypes if d not in SUFFIXES]
        if unknown:
            raise ValueError(f"{base}: no kernel suffix for dtypes {unknown}")
        self.program = program
        self.base = base
        self.dtypes = dtypes

    def name(self, dtype: Any) -> str:
        """The entry point for ``dtype``; INVALID_INPUT for a dtype the kernel was not written for."""
        key = np.dtype(dtype).name
        if key not in self.dtypes:
            raise TuneFailure.invalid(f"kernel {self.base} has no {key} variant ({', '.join(self.dtypes)})")
        return f"{self.base}_{SUFFIXES[key]}"

    def names(self) -> tuple[str, ...]:
        return tuple(self.name(d) for d in self.dtypes)

    def launch(self, dtype: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], shared_mem: int = 0) -> None:
        """Launch the ``dtype`` entry point on the current device and stream. A grid or block outside CUDA's
        limits is INVALID_INPUT before anything is launched (the candidate then does not cover this shape)."""
        name = self.name(dtype)
        check_launch(name, grid, block)
        self.program.function(name)(grid, block, args, shared_mem=shared_mem)

    def __repr__(self) -> str:
        return f"CudaKernel({self.program.filename}:{self.base})"


MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024


def check_launch(name: str, grid: Sequence[int], block: Sequence[int]) -> None:
    """INVALID_INPUT unless ``grid`` and ``block`` (three positive extents each) fit CUDA's launch limits."""
    ok = len(grid) == 3 and len(block) == 3 and all(isinstance(v, int) and v >= 1 for v in (*grid, *block))
    ok = ok and all(g <= m for g, m in zip(grid, MAX_GRID, strict=True))
    ok = ok and all(b <= m for b, m in zip(block, MAX_BLOCK, strict=True)) and block[0] * block[1] * block[2] <= MAX_THREADS
    if not ok:
        raise TuneFailure.invalid(f"{name}: launch grid {tuple(grid)} / block {tuple(block)} is outside CUDA's limits")


def array_module(x: Any) -> Any:
    """``cupy`` for a device array, ``numpy`` otherwise (CuPy is imported only for a device array)."""
    if hasattr(x, "__cuda_array_interface__"):
        from farm.runtimes.cuda import import_cupy

        return import_cupy()
    return np


def element_strides(a: Any) -> tuple[int, ...]:
    """Strides in elements (kernels index with element strides, so every layout works without a copy)."""
    return tuple(s // a.itemsize for s in a.strides)


def cdiv(a: int, b: int) -> int:
    """Ceiling division: blocks needed to cover ``a`` items ``b`` at a time."""
    return -(-a // b)


@dataclass(frozen=True)
class RowLaunch:
    """A one-dimensional launch: ``per_block`` rows (or outputs) per block of ``threads`` threads."""

    kernel: str
    threads: int
    per_block: int

    def grid(self, rows: int) -> tuple[int, int, int]:
        return (cdiv(rows, self.per_block), 1, 1)


def i32(value: int) -> np.int32:
    """A kernel ``int`` argument (CuPy passes NumPy scalars with their exact width)."""
    return np.int32(value)


def i64(value: int) -> np.int64:
    """A kernel ``long long`` argument."""
    return np.int64(value)


def cuda_generate(*inputs: Any) -> tuple[Any, ...]:
    """Fresh layout-preserving copies of CUDA inputs for one trial (the CUDA sets' ``generate``).

    Each device array is copied on its own device, and the copy is completed before returning: the trial runner
    builds trial inputs outside the client's stream context, and the candidates then run on the client's
    non-blocking stream, which does not wait for work queued on another stream.
    """
    out = []
    for value in inputs:
        if hasattr(value, "__cuda_array_interface__"):
            from farm.runtimes.cuda import import_cupy

            cupy = import_cupy()
            with value.device:
                copy = clone(value)
                cupy.cuda.get_current_stream().synchronize()
            out.append(copy)
        else:
            out.append(clone(value))
    return tuple(out)
