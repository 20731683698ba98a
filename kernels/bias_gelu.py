"""bias_gelu_fusion: ``gelu(x + bias)`` for a 2-D ``x`` (rows, cols) and a bias of length cols, GELU in its tanh
form ``0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3)))``. A fused graph: the name says "fusion", so the core
tunes it with scope GRAPH.

Spec: ``rows``, ``cols`` (1..65536), ``dtype`` (cpu: float32, float64; cuda: float16, float32), ``layout`` (of x:
contiguous | transposed | strided; the bias is always contiguous), ``seed``. x and bias are standard normal.

Host candidates (reference: unfused, the bias add then GELU as separate array expressions with a temporary per
step): a fused in-place chain over two buffers, the same through the identity ``(1 + tanh z) / 2 = sigmoid(2z)``
(one exp instead of a tanh), and a space of the in-place chain over blocks of rows
(16 KiB..2 MiB). CUDA
candidates (reference: the unfused chain in CuPy, in float32 for float16): one-kernel fusions with one element per
thread, four per thread, a block per row, and 32 x 32 tiles with the bias staged in shared memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from farm.arrays import array_signature
from farm.policy import Tolerance
from farm.tunable import TunableSet
from farm_kernels.cuda import (
    CudaKernel,
    CudaProgram,
    array_module,
    cdiv,
    cuda_generate,
    element_strides,
    i32,
    i64,
)
from farm_kernels.layout import LAYOUTS, arrange, layout_of, normal
from farm_kernels.operation import Operation, choice, code_identity, dim

NAME = "bias_gelu_fusion"
HOST_DTYPES = ("float32", "float64")
CUDA_DTYPES = ("float16", "float32")
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


def host_tolerance(x: np.ndarray, bias: np.ndarray) -> Tolerance:
    """tanh against exp forms and different rounding orders: a few ulps of 1 + tanh, scaled by |y|."""
    eps = float(np.finfo(x.dtype).eps)
    magnitude = (float(np.abs(x).max()) if x.size else 0.0) + (float(np.abs(bias).max()) if bias.size else 0.0)
    return Tolerance(absolute=8 * eps * max(1.0, magnitude), relative=16 * eps)


def cuda_tolerance(x: Any, bias: Any) -> Tolerance:
    """For inputs of magnitude about one (the spec's generator); float16 adds one rounding of a float result."""
    if x.dtype == np.float16:
        return Tolerance(absolute=1e-3, relative=4e-3)
    return Tolerance(absolute=1e-5, relative=1e-5)


# -- host ---------------------------------------------------------------------------------------------------


def unfused(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    y = x + bias
    result: np.ndarray = 0.5 * y * (1.0 + np.tanh(SQRT_2_OVER_PI * (y + CUBIC * y * y * y)))
    return result


def gelu_into(y: np.ndarray, t: np.ndarray) -> np.ndarray:
    """GELU of ``y`` written into ``t`` (same shape; ``y`` is left intact), with no other temporary."""
    np.multiply(y, y, out=t)
    t *= CUBIC
    t += 1.0
    t *= y
    t *= SQRT_2_OVER_PI
    np.tanh(t, out=t)
    t += 1.0
    t *= y
    t *= 0.5
    return t


def fused_inplace(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    y = np.add(x, bias)
    return gelu_into(y, np.empty_like(y))


def fused_sigmoid(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    # y (1 + tanh z) / 2 = y / (1 + exp(-2z)), z = sqrt(2/pi) y (1 + 0.044715 y^2): one exp replaces a tanh.
    y = np.add(x, bias)
    t: np.ndarray = np.multiply(y, y)
    t *= -2.0 * SQRT_2_OVER_PI * CUBIC
    t -= 2.0 * SQRT_2_OVER_PI
    t *= y
    # exp must not overflow (a warning, and inf / inf): past the limit the quotient is 0 to working precision.
    np.minimum(t, math.log(float(np.finfo(t.dtype).max)) - 1.0, out=t)
    np.exp(t, out=t)
    t += 1.0
    np.divide(y, t, out=t)
    return t


def fused_row_chunks(x: np.ndarray, bias: np.ndarray, *, kib: int) -> np.ndarray:
    """The fused chain over blocks of rows of about ``kib`` KiB: both buffers of a block stay in cache."""
    rows, cols = x.shape
    out = np.empty((rows, cols), dtype=np.result_type(x, bias))
    step = max(1, (kib << 10) // (cols * out.itemsize))
    scratch = np.empty((min(step, rows), cols), dtype=out.dtype)
    for i in range(0, rows, step):
        block = out[i : i + step]
        y = np.add(x[i : i + step], bias, out=scratch[: block.shape[0]])
        gelu_into(y, block)
    return out


def host_tunable() -> TunableSet:
    """The host candidate set (a fresh one on every call)."""
    ts = TunableSet(NAME, signature=array_signature, tolerance=host_tolerance)
    ts.add(unfused, reference=True)
    ts.add(fused_inplace, group=0, identity=code_identity(gelu_into))
    ts.add(fused_sigmoid, group=0)
    ts.space(group=1, kib=[16, 32, 64, 128, 256, 512, 1024, 2048], identity=code_identity(gelu_into))(fused_row_chunks)
    return ts


# -- CUDA ---------------------------------------------------------------------------------------------------

PROGRAM = CudaProgram("bias_gelu.cu")
THREADS = 256
MAX_BLOCKS = 1 << 16  # grid-stride kernels: enough blocks to fill any GPU, few enough to amortize the loop


def cupy_unfused(x: Any, bias: Any) -> Any:
    xp = array_module(x)
    if x.dtype == np.float16:
        return cupy_unfused(x.astype(np.float32), bias.astype(np.float32)).astype(np.float16)
    y = x + bias
    return 0.5 * y * (1.0 + xp.tanh(SQRT_2_OVER_PI * (y + CUBIC * y * y * y)))


def _flat_grid(rows: int, cols: int) -> tuple[int, int, int]:
    return (min(cdiv(rows * cols, THREADS), MAX_BLOCKS), 1, 1)


def _vec4_grid(rows: int, cols: int) -> tuple[int, int, int]:
    return (min(cdiv(rows * cdiv(cols, 4), THREADS), MAX_BLOCKS), 1, 1)


def _rows_grid(rows: int, cols: int) -> tuple[int, int, int]:
    return (rows, 1, 1)


def _tile_grid(rows: int, cols: int) -> tuple[int, int, int]:
    return (cdiv(cols, 32), cdiv(rows, 32), 1)


# name -> (kernel, block, grid rule); the grid rules' source is part of each candidate's identity.
GELU_LAUNCHES: dict[str, tuple[str, tuple[int, int, int], Callable[[int, int], tuple[int, int, int]]]] = {
    "fused_flat": ("bias_gelu_flat", (THREADS, 1, 1), _flat_grid),
    "fused_vec4": ("bias_gelu_vec4", (THREADS, 1, 1), _vec4_grid),
    "fused_block_per_row": ("bias_gelu_rows", (THREADS, 1, 1), _rows_grid),
    "fused_tile_32": ("bias_gelu_tile", (32, 8, 1), _tile_grid),
}


def gelu_kernel(
    kernel: CudaKernel, block: tuple[int, int, int], grid: Callable[[int, int], tuple[int, int, int]]
) -> Callable[[Any, Any], Any]:
    """A CUDA candidate launching one kernel of ``cuda/bias_gelu.cu``."""

    def fused(x: Any, bias: Any) -> Any:
        xp = array_module(x)
        rows, cols = x.shape
        out = xp.empty((rows, cols), dtype=x.dtype)
        sr, sc = element_strides(x)
        (sb,) = element_strides(bias)
        args = (x, bias, out, i32(rows), i32(cols), i64(sr), i64(sc), i64(sb))
        kernel.launch(x.dtype, grid(rows, cols), block, args)
        return out

    return fused


def cuda_tunable(
    program: CudaProgram = PROGRAM,
    launches: Mapping[str, tuple[str, tuple[int, int, int], Callable[[int, int], tuple[int, int, int]]]] = GELU_LAUNCHES,
) -> TunableSet:
    """The CUDA candidate set; constructible without CuPy."""
    ts = TunableSet(NAME, signature=array_signature, generate=cuda_generate, tolerance=cuda_tolerance)
    ts.add(cupy_unfused, reference=True)
    for name, (base, block, grid) in launches.items():
        kernel = program.kernel(base, CUDA_DTYPES)
        launch = f"block={block}; grid={code_identity(grid, threads=THREADS, max_blocks=MAX_BLOCKS)}"
        group = 0 if name in ("fused_flat", "fused_vec4") else 1
        ts.add(gelu_kernel(kernel, block, grid), name=name, group=group, identity=program.identity(kernel, launch))
    return ts


# -- workloads ----------------------------------------------------------------------------------------------


def make_inputs(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, Any]:
    """x (rows, cols) laid out as ``spec["layout"]`` says, and a contiguous bias (cols,); both standard normal."""
    x = normal(rng, (spec["rows"], spec["cols"]), spec["dtype"])
    bias = normal(rng, (spec["cols"],), spec["dtype"])
    return arrange(xp, x, spec["layout"]), xp.array(bias)


def elements(spec: Mapping[str, Any]) -> int:
    result: int = spec["rows"] * spec["cols"] * (2 if spec["layout"] == "strided" else 1)
    return result


def spec_of(inputs: tuple[Any, ...]) -> dict[str, Any] | None:
    """The inverse of make_inputs: x's shape, dtype and layout (the bias must be a contiguous (cols,) vector)."""
    x, bias = inputs
    if getattr(bias, "shape", None) != (x.shape[1],) or bias.dtype != x.dtype or not bias.flags.c_contiguous:
        return None
    return {"rows": x.shape[0], "cols": x.shape[1], "dtype": str(x.dtype), "layout": layout_of(x)}


OPERATION = Operation(
    name=NAME,
    host=host_tunable(),
    cuda=cuda_tunable(),
    fields=(
        dim("rows"),
        dim("cols", "features: the length of the bias"),
        choice("layout", LAYOUTS, default="contiguous", help="memory layout of x"),
    ),
    dtypes={"cpu": HOST_DTYPES, "cuda": CUDA_DTYPES},
    make=make_inputs,
    spec_of=spec_of,
    elements=elements,
    description="fused bias add and tanh-approximated GELU",
)

OPERATIONS = (OPERATION,)
