"""A real Triton kernel for the Triton tier (``--kernels triton_ops``): a masked vector add with four configs.

``config0`` (32-element blocks) is slow under the interpreter, ``config1`` (48) cannot compile (a block must be a
power of two: a verdict, never a crash), ``config2``/``config3`` are fast; the reference is a torch expression.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import farm_triton
from farm_kernels import dim

NAME = "farmtriton_add"
KEY = ["n"]
CONFIGS = [
    triton.Config({"BLOCK": 32}, num_warps=1, num_stages=1),
    triton.Config({"BLOCK": 48}, num_warps=2, num_stages=1),
    triton.Config({"BLOCK": 1024}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK": 2048}, num_warps=8, num_stages=2),
]


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def grid(meta, x, y, out, n):
    return (triton.cdiv(n, meta["BLOCK"]),)


def make(spec, device, generator):
    dtype = getattr(torch, spec["dtype"])
    x = torch.rand(spec["n"], generator=generator, device=device, dtype=dtype)
    y = torch.rand(spec["n"], generator=generator, device=device, dtype=dtype)
    return x, y, torch.empty_like(x), spec["n"]


OPERATIONS = [
    farm_triton.operation(
        NAME, add_kernel, configs=CONFIGS, key=KEY, grid=grid, inputs=make, outputs=("out_ptr",),
        reference=lambda x, y, out, n: x + y, fields=(dim("n"),), dtypes=("float32", "float64"),
    )
]
