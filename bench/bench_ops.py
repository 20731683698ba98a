"""Operations for the farm overhead benchmark: trivial candidates, so the farm's own costs dominate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from farm import TunableSet, array_signature
from farm_kernels.operation import Operation, dim

trivial = TunableSet("bench_trivial", signature=array_signature)


@trivial.reference
def copy(x):
    return x.copy()


@trivial.candidate
def add_zero(x):
    return x + 0.0


def make(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, ...]:
    return (xp.asarray(rng.random(spec["n"]), dtype=spec["dtype"]),)


OPERATIONS = (Operation(name="bench_trivial", host=trivial, cuda=None, fields=(dim("n"),),
                        dtypes={"cpu": ("float64",)}, make=make),)
