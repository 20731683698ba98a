"""Memory layouts of 2-D workload inputs, shared by the builtin operations' input builders.

- ``contiguous``: C order.
- ``transposed``: a transposed view of a C-ordered array (Fortran order), what ``x.T`` of a stored matrix gives.
- ``strided``: every other column of a twice-as-wide array: neither C- nor F-contiguous, inner stride 2.

Every function returns fresh arrays allocated with the given array module (``numpy`` or ``cupy``), so two calls
never share a buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LAYOUTS = ("contiguous", "transposed", "strided")


def arrange(xp: Any, values: np.ndarray, layout: str) -> Any:
    """A fresh ``xp`` array holding the 2-D host ``values`` (already in the target dtype) in ``layout``."""
    if values.ndim != 2:
        raise ValueError(f"arrange needs a 2-D array, got shape {values.shape}")
    if layout == "contiguous":
        return xp.array(values, order="C")
    if layout == "transposed":
        return xp.array(values.T, order="C").T
    if layout == "strided":
        rows, cols = values.shape
        base = xp.zeros((rows, 2 * cols), dtype=values.dtype)
        base[:, ::2] = xp.asarray(values)
        return base[:, ::2]
    raise ValueError(f"unknown layout {layout!r} (layouts: {', '.join(LAYOUTS)})")


def uniform(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    """Host values uniform in [low, high), drawn in float64 then cast (the same values for every dtype's
    precision, and on every device)."""
    return rng.uniform(low, high, size=shape).astype(dtype)


def normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> np.ndarray:
    """Host values from a normal distribution with standard deviation ``scale``, drawn in float64 then cast."""
    return (rng.standard_normal(size=shape) * scale).astype(dtype)


def layout_of(x: Any) -> str | None:
    """The inverse of :func:`arrange` for a 2-D NumPy or CuPy array: which layout it is in, or None when it is in
    none of them (a view with other strides). A C-contiguous array is ``contiguous`` even when it is also
    F-contiguous (one row or one column: the layouts coincide)."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != 2:
        return None
    if x.flags.c_contiguous:
        return "contiguous"
    if x.flags.f_contiguous:
        return "transposed"
    rows, cols = shape
    item = x.dtype.itemsize
    if x.strides == (2 * cols * item, 2 * item):
        return "strided"
    return None
