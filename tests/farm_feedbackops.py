"""Test-only operations for the fleet feedback tests (``--kernels farm_feedbackops``): one whose workload spec can
be rebuilt from its inputs (``spec_of``), one without (reported by signature only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from farm_testops import slow_reference, vectorized

from farm import TunableSet, array_signature
from farm_kernels.operation import Operation, dim


def make(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, ...]:
    return (xp.asarray(rng.random(spec["n"]), dtype=spec["dtype"]),)


def spec_of(inputs: tuple[Any, ...]) -> dict[str, Any]:
    (x,) = inputs
    return {"n": int(x.shape[0]), "dtype": str(x.dtype)}


def operation(name: str, inverse: Any) -> Operation:
    tunable = TunableSet(name, signature=array_signature)
    tunable.add(slow_reference, name="slow_reference", reference=True)
    tunable.add(vectorized, group=0)
    return Operation(name=name, host=tunable, cuda=None, fields=(dim("n"),), dtypes={"cpu": ("float64",)}, make=make,
                     spec_of=inverse)


OPERATIONS = (operation("feedbacktest_scale", spec_of), operation("feedbacktest_unsigned", None))
