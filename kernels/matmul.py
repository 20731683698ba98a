"""matmul: ``C = A @ B`` for 2-D ``A`` (m, k) and ``B`` (k, n).

Spec: ``m``, ``n``, ``k`` (1..65536), ``dtype`` (cpu: float32, float64; cuda: float16, float32), ``layout``
(contiguous | a_transposed | b_transposed | transposed | strided: which operands are transposed views, or both
strided views), ``seed``. Input values are uniform in [-1, 1).

Host candidates (reference ``numpy.matmul``): ``numpy.dot`` (less dispatch overhead on tiny products), the
transposed product ``(B^T A^T)^T`` (hands BLAS transposed operands as C-ordered ones), ``dot`` of contiguous
copies, ``tensordot``, ``einsum`` and a space of row-panel products (panel heights
8..512). CUDA candidates (reference
``cupy.matmul``, cuBLAS): tiled GEMMs with 16 x 16 and 32 x 32 tiles, and thread-coarsened GEMMs (32 x 32 tiles,
4 outputs per thread; 64 x 64 tiles, 4 and 8 outputs per thread) from ``cuda/matmul.cu``, and the ``gemm`` space
(group 2: tile 8..128 x outputs per thread 1..16, compile-time constants of the same source through NVRTC
defines; compiled ahead of the GPU by ``farm compile``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
from farm_kernels.cuda.spaces import KernelSpace, attach
from farm_kernels.cuda.spaces import Launch as SpaceLaunch
from farm_kernels.layout import arrange, layout_of, uniform
from farm_kernels.operation import Operation, choice, code_identity, dim  # noqa: F401  (code_identity: see row_panels)

NAME = "matmul"
LAYOUTS = ("contiguous", "a_transposed", "b_transposed", "transposed", "strided")
HOST_DTYPES = ("float32", "float64")
CUDA_DTYPES = ("float16", "float32")


def _magnitude(x: np.ndarray) -> float:
    return float(np.abs(x).max()) if x.size else 0.0


def host_tolerance(a: np.ndarray, b: np.ndarray) -> Tolerance:
    """Each output sums k products in an order that differs between candidates: the rounding error grows with k
    and with the operands' magnitudes (a typical error is about eps * k / 3 * |A| |B|; this allows ~100x)."""
    eps = float(np.finfo(a.dtype).eps)
    k = a.shape[1]
    return Tolerance(absolute=32 * eps * k * _magnitude(a) * _magnitude(b), relative=32 * eps * math.sqrt(k))


def cuda_tolerance(a: Any, b: Any) -> Tolerance:
    """As on the host, for inputs of magnitude about one (the spec's generator); float16 outputs round to 11
    bits, and cuBLAS may accumulate float16 products in lower precision than the kernels' float."""
    k = a.shape[1]
    if a.dtype == np.float16:
        return Tolerance(absolute=4e-3 * math.sqrt(k), relative=1e-2)
    eps = float(np.finfo(np.float32).eps)
    return Tolerance(absolute=32 * eps * k, relative=32 * eps * math.sqrt(k))


# -- host ---------------------------------------------------------------------------------------------------


def numpy_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    result: np.ndarray = np.matmul(a, b)
    return result


def numpy_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # np.dot skips the gufunc machinery of np.matmul: less fixed cost, which dominates tiny products.
    result: np.ndarray = np.dot(a, b)
    return result


def transposed_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # (B^T A^T)^T: an F-ordered A becomes a C-ordered A^T, so BLAS gets the layout it prefers without a copy.
    # The result is the transposed view of a fresh array: same values, Fortran order.
    result: np.ndarray = np.matmul(b.T, a.T).T
    return result


def contiguous_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # Copy strided operands once so BLAS runs on packed rows.
    result: np.ndarray = np.dot(np.ascontiguousarray(a), np.ascontiguousarray(b))
    return result


def tensordot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.tensordot(a, b, axes=1)


def einsum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    result: np.ndarray = np.einsum("ik,kj->ij", a, b, optimize=True)
    return result


def panels(a: np.ndarray, b: np.ndarray, *, height: int) -> np.ndarray:
    """A blocked product: ``height`` rows of C at a time, each panel one BLAS call written in place."""
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.result_type(a, b))
    for i in range(0, a.shape[0], height):
        np.matmul(a[i : i + height], b, out=out[i : i + height])
    return out


def row_panels(height: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """One panel height as a plain candidate (register it with ``identity=code_identity(height=...)``); the
    host set tunes the heights as the ``row_panels`` space."""
    return functools.partial(panels, height=height)


def host_tunable() -> TunableSet:
    """The host candidate set (a fresh one on every call)."""
    ts = TunableSet(NAME, signature=array_signature, tolerance=host_tolerance)
    ts.add(numpy_matmul, reference=True)
    ts.add(numpy_dot, group=0)
    ts.add(transposed_product, group=0)
    ts.add(contiguous_dot, group=0)
    ts.add(tensordot, group=1)
    ts.add(einsum, group=1)
    # Panel heights from a few rows (cache-resident panels of a tall A) to whole blocks BLAS splits itself.
    ts.space(name="row_panels", group=2, height=[8, 16, 32, 64, 128, 256, 512])(panels)
    return ts


# -- CUDA ---------------------------------------------------------------------------------------------------

PROGRAM = CudaProgram("matmul.cu")


@dataclass(frozen=True)
class GemmLaunch:
    """A GEMM kernel's launch configuration: ``tile`` x ``tile`` outputs per block, ``coarsen`` per thread."""

    kernel: str
    tile: int
    coarsen: int = 1

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.tile, self.tile // self.coarsen, 1)

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return (cdiv(n, self.tile), cdiv(m, self.tile), 1)


GEMM_LAUNCHES = {
    "tiled_16": GemmLaunch("gemm_tiled16", 16),
    "tiled_32": GemmLaunch("gemm_tiled32", 32),
    "coarse_32x4": GemmLaunch("gemm_coarse32x4", 32, 4),
    "coarse_64x4": GemmLaunch("gemm_coarse64x4", 64, 4),
    "coarse_64x8": GemmLaunch("gemm_coarse64x8", 64, 8),
}


def cupy_matmul(a: Any, b: Any) -> Any:
    return array_module(a).matmul(a, b)  # cuBLAS


def gemm(kernel: CudaKernel, launch: GemmLaunch) -> Callable[[Any, Any], Any]:
    """A CUDA candidate launching one GEMM kernel of ``cuda/matmul.cu`` with ``launch``."""

    def tiled_gemm(a: Any, b: Any) -> Any:
        return _gemm_run(kernel, launch, a, b)

    return tiled_gemm


def _gemm_run(kernel: CudaKernel, launch: GemmLaunch, a: Any, b: Any) -> Any:
    xp = array_module(a)
    m, k = a.shape
    n = b.shape[1]
    c = xp.empty((m, n), dtype=a.dtype)
    sa, sb, sc = element_strides(a), element_strides(b), element_strides(c)
    args = (a, b, c, i32(m), i32(n), i32(k), i64(sa[0]), i64(sa[1]), i64(sb[0]), i64(sb[1]), i64(sc[0]), i64(sc[1]))
    kernel.launch(a.dtype, launch.grid(m, n), launch.block, args)
    return c


def gemm_space(program: CudaProgram = PROGRAM) -> KernelSpace:
    """The GEMM space of ``cuda/matmul.cu``: ``-DGEMM_TILE=tile -DGEMM_CO=coarsen``, block tile x tile/coarsen."""
    return KernelSpace(
        program, "gemm_space", CUDA_DTYPES,
        defines=lambda c: {"GEMM_TILE": c["tile"], "GEMM_CO": c["coarsen"]},
        launch=lambda c: SpaceLaunch((c["tile"], c["tile"] // c["coarsen"], 1)),
    )


def gemm_space_candidate(space: KernelSpace) -> Callable[..., Any]:
    """The space's candidate: ``fn(a, b, tile=..., coarsen=...)`` launches the config's compiled variant."""

    def gemm(a: Any, b: Any, *, tile: int, coarsen: int) -> Any:
        return _gemm_run(space.kernel({"tile": tile, "coarsen": coarsen}), GemmLaunch("gemm_space", tile, coarsen), a, b)

    return attach(gemm, space)


# Tiles from 8 to 128, 1 to 16 outputs per thread. The restrictions are what the kernel itself needs (the tile
# rows split evenly among the threads, a block within CUDA's 1024 threads); registers and shared memory (a
# 128 x 128 tile does not fit 48 KiB of static shared memory) are judged from the cubin by the compile stage.
GEMM_TILES = [8, 16, 32, 64, 128]
GEMM_COARSEN = [1, 2, 4, 8, 16]
GEMM_SPACE_RESTRICT = ["tile % coarsen == 0", "tile * (tile // coarsen) <= 1024"]


def cuda_tunable(program: CudaProgram = PROGRAM, launches: Mapping[str, GemmLaunch] = GEMM_LAUNCHES) -> TunableSet:
    """The CUDA candidate set; constructible without CuPy (kernels compile on first launch, or come from the
    kernel cache the compile stage filled: farm_kernels.cuda.compile)."""
    ts = TunableSet(NAME, signature=array_signature, generate=cuda_generate, tolerance=cuda_tolerance)
    ts.add(cupy_matmul, reference=True)
    for name, launch in launches.items():
        kernel = program.kernel(launch.kernel, CUDA_DTYPES)
        group = 0 if launch.coarsen == 1 else 1
        ts.add(gemm(kernel, launch), name=name, group=group, identity=program.identity(kernel, launch))
    space = gemm_space(program)
    ts.space(name="gemm", group=2, identity=space.identity(), restrict=list(GEMM_SPACE_RESTRICT),
             tile=list(GEMM_TILES), coarsen=list(GEMM_COARSEN))(gemm_space_candidate(space))
    return ts


# -- workloads ----------------------------------------------------------------------------------------------


def make_inputs(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, Any]:
    """A (m, k) and B (k, n), uniform in [-1, 1), laid out as ``spec["layout"]`` says."""
    m, n, k, dtype, layout = spec["m"], spec["n"], spec["k"], spec["dtype"], spec["layout"]
    a = uniform(rng, (m, k), dtype)
    b = uniform(rng, (k, n), dtype)
    a_layout = {"a_transposed": "transposed", "transposed": "transposed", "strided": "strided"}.get(layout, "contiguous")
    b_layout = {"b_transposed": "transposed", "transposed": "transposed", "strided": "strided"}.get(layout, "contiguous")
    return arrange(xp, a, a_layout), arrange(xp, b, b_layout)


def elements(spec: Mapping[str, Any]) -> int:
    # A strided operand's base array is twice as wide.
    factor = 2 if spec["layout"] == "strided" else 1
    result: int = max(spec["m"] * spec["k"] * factor, spec["k"] * spec["n"] * factor, spec["m"] * spec["n"])
    return result


_MATMUL_LAYOUTS = {
    ("contiguous", "contiguous"): "contiguous", ("transposed", "contiguous"): "a_transposed",
    ("contiguous", "transposed"): "b_transposed", ("transposed", "transposed"): "transposed",
    ("strided", "strided"): "strided",
}


def spec_of(inputs: tuple[Any, ...]) -> dict[str, Any] | None:
    """The inverse of make_inputs: m, n, k from A (m, k) and B (k, n), their dtype and their layouts' pair."""
    a, b = inputs
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        return None
    layout = _MATMUL_LAYOUTS.get((str(layout_of(a)), str(layout_of(b))))
    if layout is None:
        return None
    return {"m": a.shape[0], "n": b.shape[1], "k": a.shape[1], "dtype": str(a.dtype), "layout": layout}


OPERATION = Operation(
    name=NAME,
    host=host_tunable(),
    cuda=cuda_tunable(),
    fields=(
        dim("m", "rows of A and C"),
        dim("n", "columns of B and C"),
        dim("k", "columns of A, rows of B"),
        choice("layout", LAYOUTS, default="contiguous", help="which operands are transposed or strided views"),
    ),
    dtypes={"cpu": HOST_DTYPES, "cuda": CUDA_DTYPES},
    make=make_inputs,
    spec_of=spec_of,
    elements=elements,
    description="C = A @ B",
)

OPERATIONS = (OPERATION,)
