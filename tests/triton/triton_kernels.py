"""The Triton tier's kernel as an application has it: plain Triton, nothing of the farm (tests/triton/app_add.py
imports only this). ``config0`` (32-element blocks) is slow under the interpreter, ``config1`` (48) cannot compile
(a block must be a power of two), ``config2``/``config3`` are fast."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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


