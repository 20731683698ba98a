"""A BLAS-bound test operation for the regime tests (loaded with ``--kernels farm_regimeops``).

The reference multiplies with ``einsum`` without BLAS (C loops, single-threaded); the candidate ``blas_matmul``
hands the same product to BLAS, tens of times faster in any regime, so the winner does not depend on noise;
``einsum_twice`` is correct and always slower than the reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from farm import TunableSet, array_signature
from farm_kernels.operation import Operation, dim


def einsum_loops(a, b):
    return np.einsum("ij,jk->ik", a, b, optimize=False)


def blas_matmul(a, b):
    return a @ b


def einsum_twice(a, b):
    np.einsum("ij,jk->ik", a, b, optimize=False)
    return np.einsum("ij,jk->ik", a, b, optimize=False)


def make(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, ...]:
    n = spec["n"]
    return tuple(xp.asarray(rng.random((n, n)), dtype=spec["dtype"]) for _ in range(2))


def _tunable() -> TunableSet:
    tunable = TunableSet("regimetest_blas", signature=array_signature)
    tunable.add(einsum_loops, name="einsum_loops", reference=True)
    tunable.add(blas_matmul, group=0)
    tunable.add(einsum_twice, group=0)
    return tunable


OPERATIONS = (
    Operation(name="regimetest_blas", host=_tunable(), cuda=None, fields=(dim("n"),),
              dtypes={"cpu": ("float64",)}, make=make),
)
