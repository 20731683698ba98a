"""A config space: every combination of meta-parameter values, ``num_warps`` and ``num_stages``, as Triton configs.

    CONFIGS = farm_triton.space({"BLOCK_M": [64, 128], "BLOCK_N": [32, 64]}, num_warps=[4, 8], num_stages=[2, 3])

The order is fixed (meta-parameters in the given order, then ``num_warps``, then ``num_stages``, each varying
slowest first), so every process builds the same list: the list is part of the farm's key.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from farm.errors import TuneFailure
from farm_triton.deps import import_triton


def space(meta: Mapping[str, Sequence[Any]], *, num_warps: Sequence[int] = (4,),
          num_stages: Sequence[int] = (3,)) -> list[Any]:
    """Every combination as a ``triton.Config``; INVALID_INPUT naming the axis when one has no values."""
    triton = import_triton()
    axes: dict[str, Sequence[Any]] = {**meta, "num_warps": num_warps, "num_stages": num_stages}
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise TuneFailure.invalid(f"farm_triton.space: {name} must be a non-empty list of values, got {values!r}")
    configs = []
    for combo in itertools.product(*axes.values()):
        chosen = dict(zip(axes, combo, strict=True))
        warps, stages = chosen.pop("num_warps"), chosen.pop("num_stages")
        configs.append(triton.Config(chosen, num_warps=warps, num_stages=stages))
    return configs
