"""softmax over the rows of a 2-D array: ``y[i, j] = exp(x[i, j] - max_j x[i]) / sum_j exp(x[i, j] - max_j x[i])``.

Spec: ``rows``, ``cols`` (1..65536), ``dtype`` (cpu: float32, float64; cuda: float16, float32), ``layout``
(contiguous | transposed | strided), ``seed``. Input values are normal with standard deviation 3 (logits).

Host candidates (reference: the numerically stable three-pass form, max then exp-sum then divide): an in-place
form that writes every pass into one ``out=`` buffer, the same multiplying by the reciprocal of the row sums, row
sums through BLAS (a matrix-vector product with ones), a space of online forms that make a single pass over column chunks
(64..2048 wide) with a running max and rescaled sum, and a space of row-chunked forms that keep a block of rows
(16 KiB..1 MiB) in cache through all three passes. CUDA candidates (reference: the three-pass form in CuPy, in float32 for float16 inputs): warp-per-row
(three passes and online single pass) and block-per-row kernels with 128, 256 and 512 threads, and the ``block``
space (group 2: 32..1024 threads per row, an NVRTC define of the same source; compiled ahead of the GPU by
``farm compile``).
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
    RowLaunch,
    array_module,
    cuda_generate,
    element_strides,
    i32,
    i64,
)
from farm_kernels.cuda.spaces import BLOCK_THREADS, KernelSpace, attach, row_block_space
from farm_kernels.layout import LAYOUTS, arrange, layout_of, normal
from farm_kernels.operation import Operation, choice, dim

NAME = "softmax"
HOST_DTYPES = ("float32", "float64")
CUDA_DTYPES = ("float16", "float32")


def tolerance(x: Any) -> Tolerance:
    """Outputs lie in [0, 1]; the row sum's rounding error grows with the row length (the sums' order differs)."""
    if x.dtype == np.float16:
        return Tolerance(absolute=1e-4, relative=4e-3)  # one float16 rounding of a float result
    eps = float(np.finfo(x.dtype).eps)
    return Tolerance(absolute=8 * eps, relative=8 * eps * math.sqrt(x.shape[-1]) + 16 * eps)


# -- host ---------------------------------------------------------------------------------------------------


def three_pass(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    result: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return result


def inplace(x: np.ndarray) -> np.ndarray:
    # One output buffer for all three passes: no exp temporary, no separate quotient.
    out: np.ndarray = np.subtract(x, x.max(axis=-1, keepdims=True))
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)
    return out


def inplace_reciprocal(x: np.ndarray) -> np.ndarray:
    # A multiply by rows-many reciprocals is cheaper than rows * cols divisions.
    out: np.ndarray = np.subtract(x, np.max(x, axis=-1, keepdims=True))
    np.exp(out, out=out)
    sums = np.add.reduce(out, axis=-1, keepdims=True)
    np.reciprocal(sums, out=sums)
    out *= sums
    return out


def matvec_sum(x: np.ndarray) -> np.ndarray:
    # Row sums as a BLAS matrix-vector product: multithreaded and vectorized, where np.sum of short rows is not.
    out: np.ndarray = np.subtract(x, x.max(axis=-1, keepdims=True))
    np.exp(out, out=out)
    sums = out @ np.ones(out.shape[-1], dtype=out.dtype)
    out /= sums[:, None]
    return out


def online(x: np.ndarray, *, chunk: int) -> np.ndarray:
    # Single pass over column chunks: a running max and a sum rescaled whenever the max grows, then one
    # normalizing pass. exp(-inf - m) is 0, so the first chunk needs no special case.
    rows, cols = x.shape
    top = np.full((rows, 1), -np.inf, dtype=x.dtype)
    total = np.zeros((rows, 1), dtype=x.dtype)
    for j in range(0, cols, chunk):
        block = x[:, j : j + chunk]
        new = np.maximum(top, block.max(axis=1, keepdims=True))
        total *= np.exp(top - new)
        total += np.exp(block - new).sum(axis=1, keepdims=True)
        top = new
    out: np.ndarray = np.subtract(x, top)
    np.exp(out, out=out)
    out /= total
    return out


def row_chunks(x: np.ndarray, *, kib: int) -> np.ndarray:
    """The three passes over blocks of rows of about ``kib`` KiB, so each block stays in cache."""
    out = np.empty(x.shape, dtype=x.dtype)
    step = max(1, (kib << 10) // (x.shape[1] * x.itemsize))
    for i in range(0, x.shape[0], step):
        block, o = x[i : i + step], out[i : i + step]
        np.subtract(block, block.max(axis=1, keepdims=True), out=o)
        np.exp(o, out=o)
        o /= o.sum(axis=1, keepdims=True)
    return out


def host_tunable() -> TunableSet:
    """The host candidate set (a fresh one on every call)."""
    ts = TunableSet(NAME, signature=array_signature, tolerance=tolerance)
    ts.add(three_pass, reference=True)
    ts.add(inplace, group=0)
    ts.add(inplace_reciprocal, group=0)
    ts.add(matvec_sum, group=0)
    ts.space(group=1, chunk=[64, 128, 256, 512, 1024, 2048])(online)
    ts.space(group=1, kib=[16, 32, 64, 128, 256, 512, 1024])(row_chunks)
    return ts


# -- CUDA ---------------------------------------------------------------------------------------------------

PROGRAM = CudaProgram("softmax.cu")


SOFTMAX_LAUNCHES = {
    "warp_per_row": RowLaunch("softmax_warp", 256, 8),
    "warp_online": RowLaunch("softmax_online", 256, 8),
    "block_per_row_128": RowLaunch("softmax_block128", 128, 1),
    "block_per_row_256": RowLaunch("softmax_block256", 256, 1),
    "block_per_row_512": RowLaunch("softmax_block512", 512, 1),
}


def cupy_three_pass(x: Any) -> Any:
    xp = array_module(x)
    # float16 in float32: the trusted result must not lose the 11-bit format's precision in x - max.
    v = x.astype(np.float32) if x.dtype == np.float16 else x
    e = xp.exp(v - v.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype, copy=False)


def softmax_kernel(kernel: CudaKernel, launch: RowLaunch) -> Callable[[Any], Any]:
    """A CUDA candidate launching one kernel of ``cuda/softmax.cu`` with ``launch``."""

    def row_softmax(x: Any) -> Any:
        return _softmax_run(kernel, launch, x)

    return row_softmax


def _softmax_run(kernel: CudaKernel, launch: RowLaunch, x: Any) -> Any:
    xp = array_module(x)
    rows, cols = x.shape
    y = xp.empty((rows, cols), dtype=x.dtype)
    sr, sc = element_strides(x)
    kernel.launch(x.dtype, launch.grid(rows), (launch.threads, 1, 1), (x, y, i32(rows), i32(cols), i64(sr), i64(sc)))
    return y


def block_candidate(space: KernelSpace) -> Callable[..., Any]:
    """The ``block`` space's candidate: one block of ``threads`` per row (``-DSOFTMAX_BS``)."""

    def block(x: Any, *, threads: int) -> Any:
        return _softmax_run(space.kernel({"threads": threads}), RowLaunch("softmax_space", threads, 1), x)

    return attach(block, space)


def cuda_tunable(program: CudaProgram = PROGRAM, launches: Mapping[str, RowLaunch] = SOFTMAX_LAUNCHES) -> TunableSet:
    """The CUDA candidate set; constructible without CuPy."""
    ts = TunableSet(NAME, signature=array_signature, generate=cuda_generate, tolerance=tolerance)
    ts.add(cupy_three_pass, reference=True)
    for name, launch in launches.items():
        kernel = program.kernel(launch.kernel, CUDA_DTYPES)
        group = 0 if launch.per_block > 1 else 1
        ts.add(softmax_kernel(kernel, launch), name=name, group=group, identity=program.identity(kernel, launch))
    space = row_block_space(program, "softmax_space", CUDA_DTYPES, "SOFTMAX_BS")
    # The block-wide reductions combine whole warps; CUDA blocks hold at most 1024 threads.
    ts.space(name="block", group=2, identity=space.identity(), restrict="threads % 32 == 0 and threads <= 1024",
             threads=list(BLOCK_THREADS))(block_candidate(space))
    return ts


# -- workloads ----------------------------------------------------------------------------------------------


def make_inputs(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any]:
    """x (rows, cols): normal logits with standard deviation 3, laid out as ``spec["layout"]`` says."""
    return (arrange(xp, normal(rng, (spec["rows"], spec["cols"]), spec["dtype"], scale=3.0), spec["layout"]),)


def elements(spec: Mapping[str, Any]) -> int:
    result: int = spec["rows"] * spec["cols"] * (2 if spec["layout"] == "strided" else 1)
    return result


def spec_of(inputs: tuple[Any, ...]) -> dict[str, Any] | None:
    """The inverse of make_inputs: x's shape, dtype and layout."""
    (x,) = inputs
    return {"rows": x.shape[0], "cols": x.shape[1], "dtype": str(x.dtype), "layout": layout_of(x)}


OPERATION = Operation(
    name=NAME,
    host=host_tunable(),
    cuda=cuda_tunable(),
    fields=(
        dim("rows", "independent rows"),
        dim("cols", "length of each row (the softmax axis)"),
        choice("layout", LAYOUTS, default="contiguous", help="memory layout of x"),
    ),
    dtypes={"cpu": HOST_DTYPES, "cuda": CUDA_DTYPES},
    make=make_inputs,
    spec_of=spec_of,
    elements=elements,
    description="softmax over the last axis of a 2-D array",
)

OPERATIONS = (OPERATION,)
