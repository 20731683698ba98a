"""Test-only operations for the command line's tests (``--kernels farm_uxops``): one whose reference always fails
(the problem cannot be decided) and one slow enough to watch a progress bar and to interrupt."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from farm import TunableSet, array_signature
from farm_kernels.operation import Operation, dim


def broken_reference(x):
    raise RuntimeError("the reference itself is broken")


def doubled(x):
    return x + x


def slow_reference(x):
    time.sleep(0.02)
    return x * 2.0


def slow_candidate(x):
    time.sleep(0.02)
    return x + x


def make(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, ...]:
    return (xp.asarray(rng.random(spec["n"]), dtype=spec["dtype"]),)


def operation(name: str, reference: Any, candidates: list[Any]) -> Operation:
    tunable = TunableSet(name, signature=array_signature)
    tunable.add(reference, name=reference.__name__, reference=True)
    for group, fn in enumerate(candidates):
        tunable.add(fn, name=f"{fn.__name__}_{group}", group=group)
    return Operation(name=name, host=tunable, cuda=None, fields=(dim("n"),), dtypes={"cpu": ("float64",)}, make=make)


OPERATIONS = (
    operation("uxtest_broken", broken_reference, [doubled]),
    operation("uxtest_slow", slow_reference, [slow_candidate] * 4),
)
