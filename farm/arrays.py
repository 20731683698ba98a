"""Arrays across NumPy and CuPy: exact signatures, layout-preserving clones, readback and output comparison.

Nothing here imports CuPy: a device array has ``__cuda_array_interface__`` and is read back by its ``.get()``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.policy import Tolerance


def is_array(value: object) -> bool:
    return isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__")


def array_module(value: object) -> str:
    return "cupy" if hasattr(value, "__cuda_array_interface__") else "numpy"


def array_signature(*args: object) -> str:
    """An exact workload signature of positional arguments: dtype, shape and element strides of each array, the
    type and value of each scalar. Never bucketed: two shapes never share a signature."""
    parts = []
    for arg in args:
        if is_array(arg):
            a: Any = arg
            itemsize = a.dtype.itemsize
            if itemsize and all(s % itemsize == 0 for s in a.strides):
                strides: tuple[object, ...] = tuple(s // itemsize for s in a.strides)
            else:  # strides that are not whole elements stay in bytes, so two layouts never share a signature
                strides = ("bytes", *a.strides)
            parts.append(f"{array_module(a)}:{a.dtype.str}{a.shape}s{strides}")
        elif isinstance(arg, (bool, int, float, str)) or arg is None:
            parts.append(f"{type(arg).__name__}={arg!r}")
        else:
            raise TypeError(f"no exact signature for an argument of type {type(arg).__name__}")
    return ";".join(parts)


def array_key(*args: object) -> tuple[object, ...]:
    """A cheap hashable key equivalent to :func:`array_signature` (same arguments -> same key, and back)."""
    key: list[object] = []
    for arg in args:
        if is_array(arg):
            a: Any = arg
            key.append((type(a), a.dtype.str, a.shape, a.strides))
        else:
            key.append((type(arg), repr(arg)))  # repr: 0.0 and -0.0 are different workloads, as in the signature
    return tuple(key)


def clone(value: Any) -> Any:
    """A fresh copy with the same dtype, shape AND strides (a non-contiguous view stays a strided view)."""
    if isinstance(value, (tuple, list)):
        return (tuple if isinstance(value, tuple) else list)(clone(v) for v in value)
    if not is_array(value):
        return value
    if value.flags.c_contiguous or value.flags.f_contiguous:
        return value.copy(order="K")
    root = value
    while getattr(root, "base", None) is not None and is_array(root.base):
        root = root.base
    if isinstance(value, np.ndarray):
        fresh = root.copy(order="K") if (root.flags.c_contiguous or root.flags.f_contiguous) else None
        if fresh is not None and fresh.strides == root.strides:
            offset = value.__array_interface__["data"][0] - root.__array_interface__["data"][0]
            return np.ndarray(value.shape, value.dtype, buffer=fresh, offset=offset, strides=value.strides)
        return _restride(value)
    # CuPy: rebuild the view on a copy of the owning buffer.
    xp = __import__("cupy")
    fresh = root.copy()
    offset = value.data.ptr - root.data.ptr
    return xp.ndarray(value.shape, value.dtype, memptr=fresh.data + offset, strides=value.strides)


def _restride(value: np.ndarray) -> np.ndarray:
    """Copy ``value`` into a fresh buffer spanning exactly its strided extent, keeping its strides."""
    if value.size == 0:
        return np.empty_like(value)
    low = sum(min(0, (n - 1) * s) for n, s in zip(value.shape, value.strides, strict=True))
    high = sum(max(0, (n - 1) * s) for n, s in zip(value.shape, value.strides, strict=True)) + value.itemsize
    buffer = np.empty(high - low, dtype=np.uint8)
    fresh = np.ndarray(value.shape, value.dtype, buffer=buffer, offset=-low, strides=value.strides)
    fresh[...] = value  # overlapping strides alias the same elements in both arrays, so the copy is exact
    return fresh


def to_host(value: Any) -> np.ndarray:
    return np.asarray(value.get() if hasattr(value, "__cuda_array_interface__") else value)


def nbytes(value: Any) -> int:
    if isinstance(value, (tuple, list)):
        return sum(nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 8))


@dataclass(frozen=True)
class OutputCheck:
    """A candidate's output compared with the reference's. ``supported`` False: too large to read back
    (validation UNSUPPORTED); ``problem``: why it is wrong (shape, dtype, structure, NaN/Inf, tolerance)."""

    supported: bool
    problem: str | None
    max_abs_error: float
    max_rel_error: float

    @property
    def passed(self) -> bool:
        return self.supported and self.problem is None


def compare_outputs(expected: Any, actual: Any, tolerance: Tolerance) -> OutputCheck:
    """Compare outputs leaf by leaf: ``|actual - expected| <= absolute + relative * |expected|`` everywhere."""
    if nbytes(expected) + nbytes(actual) > tolerance.max_bytes:
        return OutputCheck(False, None, math.nan, math.nan)
    return _compare(expected, actual, tolerance, "output")


def _wrong(problem: str) -> OutputCheck:
    return OutputCheck(True, problem, math.nan, math.nan)


def _compare(expected: Any, actual: Any, tol: Tolerance, where: str) -> OutputCheck:
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return _wrong(f"{where}: expected a sequence of {len(expected)}, got {_describe(actual)}")
        max_abs = max_rel = 0.0
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            check = _compare(e, a, tol, f"{where}[{i}]")
            if check.problem is not None:
                return check
            max_abs, max_rel = max(max_abs, check.max_abs_error), max(max_rel, check.max_rel_error)
        return OutputCheck(True, None, max_abs, max_rel)
    if is_array(expected) and not is_array(actual):
        return _wrong(f"{where}: expected an array, got {_describe(actual)}")
    e, a = to_host(expected), to_host(actual)
    if e.shape != a.shape:
        return _wrong(f"{where}: shape {a.shape} != reference shape {e.shape}")
    if e.dtype != a.dtype:
        return _wrong(f"{where}: dtype {a.dtype} != reference dtype {e.dtype}")
    if a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
        return _wrong(f"{where}: contains NaN or Inf")
    if a.dtype.kind in "fc" and not np.all(np.isfinite(e)):
        return _wrong(f"{where}: the reference output contains NaN or Inf")
    if a.size == 0:
        return OutputCheck(True, None, 0.0, 0.0)
    e64 = e.astype(np.complex128 if e.dtype.kind == "c" else np.float64)
    diff, scale = np.abs(a.astype(e64.dtype) - e64), np.abs(e64)
    max_abs = float(diff.max())
    max_rel = float((diff / np.maximum(scale, np.finfo(np.float64).tiny)).max())
    problem = None
    if not np.all(diff <= tol.absolute + tol.relative * scale):
        problem = (f"{where}: values differ beyond tolerance (max abs error {max_abs:.3g}, max rel error "
                   f"{max_rel:.3g}; absolute {tol.absolute:g}, relative {tol.relative:g})")
    return OutputCheck(True, problem, max_abs, max_rel)


def _describe(value: Any) -> str:
    if is_array(value):
        return f"array {value.dtype}{value.shape}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return f"a sequence of {len(value)}"
    return type(value).__name__
