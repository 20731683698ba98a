"""Operations for the farm benchmarks: trivial candidates, so the farm's own costs dominate.

``bench_trivial``: one array of ``n`` elements (problem ``n`` costs more as ``n`` grows). ``bench_flat``: the same
candidates on an array of ``FLAT_ELEMENTS`` elements whatever the problem; its ``index`` is a scalar argument, so
every index is its own workload (signature, cache key) at the same cost: catalogs of any size cost the same per
problem, and only the farm's own cost per decision can change with their size. ``bench_space``: a space of 96
configs whose cost is a known function of the parameters (a busy wait of ``space_cost(...)`` seconds against the
reference's ``SPACE_REFERENCE``), so that a space search's wall time is its trials' and the farm's speedup with
more workers shows."""

from __future__ import annotations

import time
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


SPACE_REFERENCE = 0.020  # seconds of the reference; every config takes 50-80 % of it


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def space_cost(tile: int, depth: int) -> float:
    """A config's seconds: a known function of its parameters, one optimum (tile * depth % 7 == 0)."""
    return SPACE_REFERENCE * (0.5 + 0.05 * (tile * depth % 7))


space = TunableSet("bench_space", signature=array_signature)


@space.reference
def space_reference(x):
    busy(SPACE_REFERENCE)
    return x.copy()


@space.space(tile=list(range(1, 13)), depth=list(range(1, 9)))
def space_config(x, *, tile, depth):
    busy(space_cost(tile, depth))
    return x.copy()


OPERATIONS = (Operation(name="bench_trivial", host=trivial, cuda=None, fields=(dim("n"),),
                        dtypes={"cpu": ("float64",)}, make=make),
              Operation(name="bench_flat", host=flat, cuda=None,
                        fields=(SpecField("index", int, minimum=0, help="which problem (not its size)"),),
                        dtypes={"cpu": ("float64",)}, make=make_flat),
              Operation(name="bench_space", host=space, cuda=None, fields=(dim("n"),),
                        dtypes={"cpu": ("float64",)}, make=make))
