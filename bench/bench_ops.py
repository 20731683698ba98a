"""Operations for the farm benchmarks: trivial candidates, so the farm's own costs dominate.

``bench_trivial``: one array of ``n`` elements (problem ``n`` costs more as ``n`` grows). ``bench_flat``: the same
candidates on an array of ``FLAT_ELEMENTS`` elements whatever the problem; its ``index`` is a scalar argument, so
every index is its own workload (signature, cache key) at the same cost: catalogs of any size cost the same per
problem, and only the farm's own cost per decision can change with their size."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from farm import TunableSet, array_signature
from farm_kernels.operation import Operation, SpecField, dim

trivial = TunableSet("bench_trivial", signature=array_signature)


@trivial.reference
def copy(x):
    return x.copy()


@trivial.candidate
def add_zero(x):
    return x + 0.0


def make(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, ...]:
    return (xp.asarray(rng.random(spec["n"]), dtype=spec["dtype"]),)


FLAT_ELEMENTS = 64
flat = TunableSet("bench_flat", signature=array_signature)


@flat.reference
def flat_copy(x, index):
    return x.copy()


@flat.candidate
def flat_add_zero(x, index):
    return x + 0.0


def make_flat(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, ...]:
    return (xp.asarray(rng.random(FLAT_ELEMENTS), dtype=spec["dtype"]), spec["index"])


OPERATIONS = (Operation(name="bench_trivial", host=trivial, cuda=None, fields=(dim("n"),),
                        dtypes={"cpu": ("float64",)}, make=make),
              Operation(name="bench_flat", host=flat, cuda=None,
                        fields=(SpecField("index", int, minimum=0, help="which problem (not its size)"),),
                        dtypes={"cpu": ("float64",)}, make=make_flat))
