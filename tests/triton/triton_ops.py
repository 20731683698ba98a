"""The Triton tier's operation (``--kernels triton_ops``): triton_kernels.add_kernel with its four configs, the
reference a torch expression."""

from __future__ import annotations

from triton_kernels import CONFIGS, KEY, NAME, add_kernel, grid, make

import farm_triton
from farm_kernels import dim

__all__ = ["CONFIGS", "KEY", "NAME", "OPERATIONS", "add_kernel", "grid"]

OPERATIONS = [
    farm_triton.operation(
        NAME, add_kernel, configs=CONFIGS, key=KEY, grid=grid, inputs=make, outputs=("out_ptr",),
        reference=lambda x, y, out, n: x + y, fields=(dim("n"),), dtypes=("float32", "float64"),
    )
]
