"""reduce_sum: the sum of a 2-D array along one axis; inputs ``(a, axis)``.

Spec: ``rows``, ``cols`` (1..65536), ``axis`` (0 or 1, default 1), ``dtype`` (cpu: float32, float64; cuda:
float16, float32), ``layout`` (contiguous | transposed | strided), ``seed``. Values are uniform in [-1, 1).

Host candidates (reference ``numpy.sum``): ``numpy.add.reduce`` (the ufunc without ``sum``'s Python wrapper), a
matrix-vector product with ones (BLAS), ``einsum``, float64 accumulation then a cast, an explicit pairwise
(halving) tree, a space of chunked accumulations (partial sums
32..4096 long), and the last element of ``cumsum``. CUDA candidates
(reference ``cupy.sum``, accumulated in float32 for float16): block-per-output shared-memory trees with 128, 256
and 512 threads, a block-per-output warp-shuffle reduction, warp-per-output and thread-per-output kernels, and the
``tree`` space (group 2: 32..1024 threads per block, an NVRTC define of the same source; compiled ahead of the GPU
by ``farm compile``).
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
from farm_kernels.layout import LAYOUTS, arrange, layout_of, uniform
from farm_kernels.operation import Operation, SpecField, choice, dim

NAME = "reduce_sum"
HOST_DTYPES = ("float32", "float64")
CUDA_DTYPES = ("float16", "float32")


def host_tolerance(a: np.ndarray, axis: int) -> Tolerance:
    """Summing n values in another order: about eps * n * max|a| for zero-mean data, eps * sqrt(n) relative to
    a large sum; both are allowed ~10x."""
    eps = float(np.finfo(a.dtype).eps)
    n = a.shape[axis]
    magnitude = float(np.abs(a).max()) if a.size else 0.0
    return Tolerance(absolute=8 * eps * n * magnitude, relative=8 * eps * math.sqrt(n))


def cuda_tolerance(a: Any, axis: int) -> Tolerance:
    """As on the host, for inputs of magnitude about one, with float accumulation; float16 adds one rounding."""
    eps = float(np.finfo(np.float32).eps)
    n = a.shape[axis]
    if a.dtype == np.float16:
        return Tolerance(absolute=8 * eps * n + 1e-4, relative=2e-3)
    return Tolerance(absolute=8 * eps * n, relative=8 * eps * math.sqrt(n))


# -- host ---------------------------------------------------------------------------------------------------


def numpy_sum(a: np.ndarray, axis: int) -> np.ndarray:
    result: np.ndarray = np.sum(a, axis=axis)
    return result


def add_reduce(a: np.ndarray, axis: int) -> np.ndarray:
    # The ufunc reduction itself: np.sum's dispatch wrapper costs microseconds on small arrays.
    result: np.ndarray = np.add.reduce(a, axis=axis)
    return result


def matvec_ones(a: np.ndarray, axis: int) -> np.ndarray:
    # A BLAS matrix-vector product with a vector of ones: vectorized and multithreaded along either axis.
    ones = np.ones(a.shape[axis], dtype=a.dtype)
    return a @ ones if axis == 1 else ones @ a


def einsum(a: np.ndarray, axis: int) -> np.ndarray:
    result: np.ndarray = np.einsum("ij->i" if axis == 1 else "ij->j", a)
    return result


def float64_accumulate(a: np.ndarray, axis: int) -> np.ndarray:
    result: np.ndarray = np.add.reduce(a, axis=axis, dtype=np.float64).astype(a.dtype)
    return result


def pairwise_halving(a: np.ndarray, axis: int) -> np.ndarray:
    # An explicit pairwise tree along the axis: each level adds the two halves (an odd last row joins row 0).
    x = a if axis == 0 else a.T
    while x.shape[0] > 1:
        half = x.shape[0] // 2
        level = x[:half] + x[half : 2 * half]
        if x.shape[0] % 2:
            level[0] += x[-1]
        x = level
    result: np.ndarray = x[0].copy()  # a fresh array even when the axis has length one (x[0] is then a view of a)
    return result


def chunked(a: np.ndarray, axis: int, *, chunk: int) -> np.ndarray:
    # Partial sums of chunk-long slices accumulated into one vector: short inner reductions, one running total.
    n = a.shape[axis]
    total = np.zeros(a.shape[1 - axis], dtype=a.dtype)
    for p in range(0, n, chunk):
        total += (a[p : p + chunk] if axis == 0 else a[:, p : p + chunk]).sum(axis=axis)
    return total


def cumsum_last(a: np.ndarray, axis: int) -> np.ndarray:
    result: np.ndarray = np.cumsum(a, axis=axis).take(-1, axis=axis)
    return result


def host_tunable() -> TunableSet:
    """The host candidate set (a fresh one on every call)."""
    ts = TunableSet(NAME, signature=array_signature, tolerance=host_tolerance)
    ts.add(numpy_sum, reference=True)
    ts.add(add_reduce, group=0)
    ts.add(matvec_ones, group=0)
    ts.add(einsum, group=0)
    ts.add(float64_accumulate, group=1)
    ts.add(pairwise_halving, group=1)
    ts.space(group=1, chunk=[32, 64, 128, 256, 512, 1024, 4096])(chunked)
    ts.add(cumsum_last, group=2)
    return ts


# -- CUDA ---------------------------------------------------------------------------------------------------

PROGRAM = CudaProgram("reduce_sum.cu")


REDUCE_LAUNCHES = {
    "tree_128": RowLaunch("reduce_tree128", 128, 1),
    "tree_256": RowLaunch("reduce_tree256", 256, 1),
    "tree_512": RowLaunch("reduce_tree512", 512, 1),
    "shuffle_256": RowLaunch("reduce_shuffle", 256, 1),
    "warp_per_output": RowLaunch("reduce_warp", 256, 8),
    "thread_per_output": RowLaunch("reduce_serial", 256, 256),
}


def cupy_sum(a: Any, axis: int) -> Any:
    if a.dtype == np.float16:
        return a.sum(axis=axis, dtype=np.float32).astype(np.float16)
    return array_module(a).sum(a, axis=axis)


def reduce_kernel(kernel: CudaKernel, launch: RowLaunch) -> Callable[[Any, int], Any]:
    """A CUDA candidate launching one kernel of ``cuda/reduce_sum.cu`` with ``launch``."""

    def reduce(a: Any, axis: int) -> Any:
        return _reduce_run(kernel, launch, a, axis)

    return reduce


def _reduce_run(kernel: CudaKernel, launch: RowLaunch, a: Any, axis: int) -> Any:
    xp = array_module(a)
    strides = element_strides(a)
    n_out, length = a.shape[1 - axis], a.shape[axis]
    y = xp.empty((n_out,), dtype=a.dtype)
    args = (a, y, i32(n_out), i32(length), i64(strides[1 - axis]), i64(strides[axis]))
    kernel.launch(a.dtype, launch.grid(n_out), (launch.threads, 1, 1), args)
    return y


def tree_candidate(space: KernelSpace) -> Callable[..., Any]:
    """The ``tree`` space's candidate: one block of ``threads`` per output, a shared-memory tree (``-DREDUCE_BS``)."""

    def tree(a: Any, axis: int, *, threads: int) -> Any:
        return _reduce_run(space.kernel({"threads": threads}), RowLaunch("reduce_space", threads, 1), a, axis)

    return attach(tree, space)


def cuda_tunable(program: CudaProgram = PROGRAM, launches: Mapping[str, RowLaunch] = REDUCE_LAUNCHES) -> TunableSet:
    """The CUDA candidate set; constructible without CuPy."""
    ts = TunableSet(NAME, signature=array_signature, generate=cuda_generate, tolerance=cuda_tolerance)
    ts.add(cupy_sum, reference=True)
    for name, launch in launches.items():
        kernel = program.kernel(launch.kernel, CUDA_DTYPES)
        group = 0 if launch.per_block == 1 else 1
        ts.add(reduce_kernel(kernel, launch), name=name, group=group, identity=program.identity(kernel, launch))
    space = row_block_space(program, "reduce_space", CUDA_DTYPES, "REDUCE_BS")
    # The tree halves a power-of-2 block; CUDA blocks hold at most 1024 threads.
    ts.space(name="tree", group=2, identity=space.identity(), restrict="threads in (32, 64, 128, 256, 512, 1024)",
             threads=list(BLOCK_THREADS))(tree_candidate(space))
    return ts


# -- workloads ----------------------------------------------------------------------------------------------


def make_inputs(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, int]:
    """a (rows, cols), uniform in [-1, 1), laid out as ``spec["layout"]`` says, and the axis."""
    a = uniform(rng, (spec["rows"], spec["cols"]), spec["dtype"])
    return arrange(xp, a, spec["layout"]), spec["axis"]


def elements(spec: Mapping[str, Any]) -> int:
    result: int = spec["rows"] * spec["cols"] * (2 if spec["layout"] == "strided" else 1)
    return result


def spec_of(inputs: tuple[Any, ...]) -> dict[str, Any] | None:
    """The inverse of make_inputs: a's shape, dtype and layout, and the axis."""
    a, axis = inputs
    return {"rows": a.shape[0], "cols": a.shape[1], "axis": int(axis), "dtype": str(a.dtype), "layout": layout_of(a)}


OPERATION = Operation(
    name=NAME,
    host=host_tunable(),
    cuda=cuda_tunable(),
    fields=(
        dim("rows"),
        dim("cols"),
        SpecField("axis", int, default=1, choices=(0, 1), help="the axis summed over"),
        choice("layout", LAYOUTS, default="contiguous", help="memory layout of a"),
    ),
    dtypes={"cpu": HOST_DTYPES, "cuda": CUDA_DTYPES},
    make=make_inputs,
    spec_of=spec_of,
    elements=elements,
    description="sum of a 2-D array along one axis",
)

OPERATIONS = (OPERATION,)
