"""Test-only operations for the fleet feedback tests (``--kernels farm_feedbackops``): one whose workload spec can
be rebuilt from its inputs (``spec_of``), one without (reported by signature only), and one whose fastest candidate
("degrading") becomes slower than the reference while the file named by FARM_TEST_DEGRADED_FILE exists (a
regression the farm can measure too); "steady" stays between the two."""

from __future__ import annotations

import os
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


def degrading(x):
    """Vectorized, until FARM_TEST_DEGRADED_FILE exists: then three element-wise passes (correct, but slower than
    the reference by far more than regression_ratio)."""
    marker = os.environ.get("FARM_TEST_DEGRADED_FILE")
    if marker and os.path.exists(marker):
        for _ in range(2):
            slow_reference(x)
        return slow_reference(x)
    return x + x


def steady(x):
    """Chunks of 64 elements: well ahead of the reference, well behind a vectorized pass."""
    out = np.empty_like(x)
    for start in range(0, x.shape[0], 64):
        out[start:start + 64] = x[start:start + 64] * 2.0
    return out


def degrading_operation() -> Operation:
    tunable = TunableSet("feedbacktest_degrading", signature=array_signature)
    tunable.add(slow_reference, name="slow_reference", reference=True)
    tunable.add(degrading, group=0)
    tunable.add(steady, group=0)
    return Operation(name="feedbacktest_degrading", host=tunable, cuda=None, fields=(dim("n"),),
                     dtypes={"cpu": ("float64",)}, make=make, spec_of=spec_of)


OPERATIONS = (operation("feedbacktest_scale", spec_of), operation("feedbacktest_unsigned", None), degrading_operation())
