"""``bench_space`` grown by one ``tile`` value (bench/spaces.py's ``grow`` part): the same reference and config
code as bench/bench_ops.py, so the same family, with 8 configs more (tile=13, depth 1-8)."""

from __future__ import annotations

from bench_ops import make, space_config, space_reference

from farm import TunableSet, array_signature
from farm_kernels.operation import Operation, dim

TILES = list(range(1, 14))

space = TunableSet("bench_space", signature=array_signature)
space.reference(space_reference)
space.space(tile=TILES, depth=list(range(1, 9)))(space_config)

OPERATIONS = (Operation(name="bench_space", host=space, cuda=None, fields=(dim("n"),), dtypes={"cpu": ("float64",)},
                        make=make),)
