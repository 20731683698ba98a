"""transpose: the out-of-place transpose of a 2-D array into a fresh C-contiguous array.

Spec: ``rows``, ``cols`` (1..65536), ``dtype`` (cpu: float32, float64; cuda: float16, float32, float64),
``layout`` (contiguous | strided), ``seed``. A transposed layout is not offered: its transpose is already
C-contiguous, and the reference would return a view of the input.

Host candidates (reference ``numpy.ascontiguousarray(a.T)``): ``a.T.copy()``, an assignment into a fresh array,
a space of tile-by-tile copies (rows x cols tiles, each of 16..128), and a space of row-block
copies (4..256 rows of ``a`` at a time, written as columns of the result) that keep the source block in cache. CUDA candidates (reference
``cupy.ascontiguousarray(a.T)``): a naive one-thread-per-element kernel and shared-memory tiled kernels (16, 32 and
64 tiles padded against bank conflicts, and an unpadded 32 tile), and the ``tiles`` space (group 2: tile side 16..64 x
block rows 4..32 x padding, NVRTC defines of the same source; compiled ahead of the GPU by ``farm compile``).

Exact: every candidate must reproduce the reference bit for bit.
"""

from __future__ import annotations

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
from farm_kernels.operation import Operation, choice, dim

NAME = "transpose"
LAYOUTS = ("contiguous", "strided")
HOST_DTYPES = ("float32", "float64")
CUDA_DTYPES = ("float16", "float32", "float64")


def tolerance(a: Any) -> Tolerance:
    """A copy: exact."""
    return Tolerance(absolute=0.0, relative=0.0)


# -- host ---------------------------------------------------------------------------------------------------


def ascontiguous_transpose(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.T)


def copy_transposed(a: np.ndarray) -> np.ndarray:
    return a.T.copy(order="C")


def assign_into(a: np.ndarray) -> np.ndarray:
    out = np.empty((a.shape[1], a.shape[0]), dtype=a.dtype)
    out[...] = a.T
    return out


def tiles(a: np.ndarray, *, rows: int, cols: int) -> np.ndarray:
    """Copy ``rows`` x ``cols`` tiles of ``a``: each source tile and its destination fit in cache together."""
    height, width = a.shape
    out = np.empty((width, height), dtype=a.dtype)
    for i in range(0, height, rows):
        for j in range(0, width, cols):
            out[j : j + cols, i : i + rows] = a[i : i + rows, j : j + cols].T
    return out


def row_blocks(a: np.ndarray, *, height: int) -> np.ndarray:
    """Copy ``height`` rows of ``a`` at a time into ``height`` columns of the result: the block of source rows
    stays in cache while the copy walks the destination's rows."""
    rows, cols = a.shape
    out = np.empty((cols, rows), dtype=a.dtype)
    for i in range(0, rows, height):
        out[:, i : i + height] = a[i : i + height].T
    return out


def host_tunable() -> TunableSet:
    """The host candidate set (a fresh one on every call)."""
    ts = TunableSet(NAME, signature=array_signature, tolerance=tolerance)
    ts.add(ascontiguous_transpose, reference=True)
    ts.add(copy_transposed, group=0)
    ts.add(assign_into, group=0)
    ts.space(group=0, height=[4, 8, 16, 32, 64, 128, 256])(row_blocks)
    # Tiles from one cache line of float32 wide to 128 KiB of float64 (128 x 128 x 8), square or not; the set
    # stays within the default max_candidates (32) the farm's planner applies to every config it lists.
    ts.space(group=1, rows=[16, 32, 64, 128], cols=[16, 32, 64, 128])(tiles)
    return ts


# -- CUDA ---------------------------------------------------------------------------------------------------

PROGRAM = CudaProgram("transpose.cu")


@dataclass(frozen=True)
class TransposeLaunch:
    """A block of ``threads_x`` x ``threads_y`` threads covers a ``tile_x`` x ``tile_y`` (columns x rows) patch."""

    kernel: str
    threads_x: int
    threads_y: int
    tile_x: int
    tile_y: int

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.threads_x, self.threads_y, 1)

    def grid(self, rows: int, cols: int) -> tuple[int, int, int]:
        return (cdiv(cols, self.tile_x), cdiv(rows, self.tile_y), 1)


TRANSPOSE_LAUNCHES = {
    "naive": TransposeLaunch("transpose_naive", 32, 8, 32, 8),
    "tiled_32_padded": TransposeLaunch("transpose_tiled32", 32, 8, 32, 32),
    "tiled_32_unpadded": TransposeLaunch("transpose_tiled32_nopad", 32, 8, 32, 32),
    "tiled_16_padded": TransposeLaunch("transpose_tiled16", 16, 16, 16, 16),
    "tiled_64_padded": TransposeLaunch("transpose_tiled64", 64, 8, 64, 64),
}


def cupy_ascontiguous_transpose(a: Any) -> Any:
    return array_module(a).ascontiguousarray(a.T)


def transpose_kernel(kernel: CudaKernel, launch: TransposeLaunch) -> Callable[[Any], Any]:
    """A CUDA candidate launching one kernel of ``cuda/transpose.cu`` with ``launch``."""

    def transpose(a: Any) -> Any:
        return _transpose_run(kernel, launch, a)

    return transpose


def _transpose_run(kernel: CudaKernel, launch: TransposeLaunch, a: Any) -> Any:
    xp = array_module(a)
    rows, cols = a.shape
    out = xp.empty((cols, rows), dtype=a.dtype)
    s0, s1 = element_strides(a)
    kernel.launch(a.dtype, launch.grid(rows, cols), launch.block, (a, out, i32(rows), i32(cols), i64(s0), i64(s1)))
    return out


def tiles_space(program: CudaProgram = PROGRAM) -> KernelSpace:
    """The tiled transpose of ``cuda/transpose.cu`` as a space: ``-DTRANSPOSE_TILE``, ``_ROWS``, ``_PAD``."""
    return KernelSpace(
        program, "transpose_space", CUDA_DTYPES,
        defines=lambda c: {"TRANSPOSE_TILE": c["tile"], "TRANSPOSE_ROWS": c["rows"], "TRANSPOSE_PAD": c["pad"]},
        launch=lambda c: SpaceLaunch((c["tile"], c["rows"], 1)),
    )


def tiles_candidate(space: KernelSpace) -> Callable[..., Any]:
    """The space's candidate: ``fn(a, tile=..., rows=..., pad=...)`` launches the config's compiled variant."""

    def tiles(a: Any, *, tile: int, rows: int, pad: int) -> Any:
        config = {"tile": tile, "rows": rows, "pad": pad}
        return _transpose_run(space.kernel(config), TransposeLaunch("transpose_space", tile, rows, tile, tile), a)

    return attach(tiles, space)


# Tile side x block rows (each thread copies tile / rows elements of a column) x padding against bank conflicts.
# 24 configs: with the reference and the plain candidates the set stays within the planner's max_candidates.
TILE_SIDES = [16, 32, 64]
TILE_ROWS = [4, 8, 16, 32]
TILE_RESTRICT = ["tile % rows == 0", "tile * rows <= 1024"]


def cuda_tunable(program: CudaProgram = PROGRAM, launches: Mapping[str, TransposeLaunch] = TRANSPOSE_LAUNCHES) -> TunableSet:
    """The CUDA candidate set; constructible without CuPy."""
    ts = TunableSet(NAME, signature=array_signature, generate=cuda_generate, tolerance=tolerance)
    ts.add(cupy_ascontiguous_transpose, reference=True)
    for name, launch in launches.items():
        kernel = program.kernel(launch.kernel, CUDA_DTYPES)
        group = 0 if name in ("naive", "tiled_32_padded") else 1
        ts.add(transpose_kernel(kernel, launch), name=name, group=group, identity=program.identity(kernel, launch))
    space = tiles_space(program)
    ts.space(name="tiles", group=2, identity=space.identity(), restrict=list(TILE_RESTRICT),
             tile=list(TILE_SIDES), rows=list(TILE_ROWS), pad=[0, 1])(tiles_candidate(space))
    return ts


# -- workloads ----------------------------------------------------------------------------------------------


def make_inputs(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any]:
    """a (rows, cols), uniform in [-1, 1), laid out as ``spec["layout"]`` says."""
    return (arrange(xp, uniform(rng, (spec["rows"], spec["cols"]), spec["dtype"]), spec["layout"]),)


def elements(spec: Mapping[str, Any]) -> int:
    result: int = spec["rows"] * spec["cols"] * (2 if spec["layout"] == "strided" else 1)
    return result


def spec_of(inputs: tuple[Any, ...]) -> dict[str, Any] | None:
    """The inverse of make_inputs: a's shape, dtype and layout (a transposed input matches no spec)."""
    (a,) = inputs
    return {"rows": a.shape[0], "cols": a.shape[1], "dtype": str(a.dtype), "layout": layout_of(a)}


OPERATION = Operation(
    name=NAME,
    host=host_tunable(),
    cuda=cuda_tunable(),
    fields=(dim("rows"), dim("cols"), choice("layout", LAYOUTS, default="contiguous", help="memory layout of a")),
    dtypes={"cpu": HOST_DTYPES, "cuda": CUDA_DTYPES},
    make=make_inputs,
    spec_of=spec_of,
    elements=elements,
    description="out-of-place 2-D transpose into a C-contiguous array",
)

OPERATIONS = (OPERATION,)
