"""A test-only operation with a tuning space, for the embedded farm's end-to-end run (``--kernels farm_spaceops``).

Every config is correct except ``chunk=7`` (a wrong output, so a trap that must never win); the reference is a
slow element-by-element loop, so the vectorized configs win clearly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from farm import TunableSet, array_signature
from farm_kernels.operation import Operation, dim


def slow_reference(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = x[i] * 2.0
    return out


def chunked(x, *, chunk, twice):
    if chunk == 7:
        return x * 3.0  # the trap
    out = np.empty_like(x)
    for start in range(0, x.shape[0], chunk):
        part = x[start:start + chunk]
        out[start:start + chunk] = part + part if twice else part * 2.0
    return out


def make(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, ...]:
    return (xp.asarray(rng.random(spec["n"]), dtype=spec["dtype"]),)


CHUNKS = (7, 256, 1024, 4096)


def operations(chunks: tuple[int, ...] = CHUNKS) -> tuple[Operation, ...]:
    """The operation with its space over ``chunks`` (a test grows the space with a module of its own that
    passes more values: the same family, as the same code with more values is)."""
    tunable = TunableSet("farmtest_space", signature=array_signature)
    tunable.add(slow_reference, name="slow_reference", reference=True)
    tunable.space(chunk=list(chunks), twice=[False, True], restrict="chunk >= 256 or not twice")(chunked)
    return (Operation(name="farmtest_space", host=tunable, cuda=None, fields=(dim("n"),),
                      dtypes={"cpu": ("float64",)}, make=make),)


OPERATIONS = operations()
