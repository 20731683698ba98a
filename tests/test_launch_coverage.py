"""Launch arithmetic, checked without a device: a NumPy model of each kernel's blockIdx/threadIdx mapping.

For every CUDA candidate and every workload (the example catalog's CUDA problems as written, and odd-sized,
strided and transposed specs in every CUDA dtype, float16 included: tests/cuda_launches.py), the recorded launch
(grid, block, arguments) is run through a model of its kernel's index arithmetic, transcribed from
kernels/cuda/*.cu, which yields

- every output element each thread writes: each must be written exactly once, none outside the output;
- where each written value comes from (element offsets into the inputs, the way the kernel computes them from the
  element strides it is given): gathered from the input's real memory, they must reproduce the operand the
  operation defines (e.g. ``a.T`` for a transpose), so a stride mix-up or a read outside the view fails;
- for reductions (softmax rows, sums), which elements each output reduces: each element exactly once;
- for kernels that stage a tile in shared memory: the block's threads stage every element that is later read.

A model is written per kernel family with the template parameters taken from the entry point's name, while the
launch's blockDim comes from the candidate, so a candidate launching a kernel with a block its template does not
expect shows up as gaps or duplicates.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda_launches import Launch, all_cuda_dtypes, catalog_workloads, extra_workloads, record

WORKLOADS = catalog_workloads() + extra_workloads()
SAMPLE = 48  # rows/outputs whose full read pattern is gathered, in the largest workloads


def ids(workload: tuple[str, dict[str, Any]]) -> str:
    name, spec = workload
    return name + "-" + "-".join(f"{k}{v}" for k, v in spec.items())


def footprint(a: np.ndarray) -> np.ndarray:
    """The memory a kernel may read through ``a``'s pointer: a 1-D view from its first element to its last."""
    assert all(s > 0 for s in a.strides), "the models assume positive strides"
    extent = 1 + sum((n - 1) * s // a.itemsize for n, s in zip(a.shape, a.strides, strict=True))
    return np.lib.stride_tricks.as_strided(a, shape=(extent,), strides=(a.itemsize,), writeable=False)


def gather(where: str, a: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The elements at element ``offsets`` from ``a``'s pointer; fails on an offset outside ``a``'s memory."""
    flat = footprint(a)
    bad = (offsets < 0) | (offsets >= flat.size)
    assert not bad.any(), f"{where}: reads outside the input (offsets {offsets[bad][:5]}, extent {flat.size})"
    return flat[offsets]


def written_once(where: str, writes: np.ndarray, size: int) -> None:
    outside = (writes < 0) | (writes >= size)
    assert not outside.any(), f"{where}: writes outside the output: {writes[outside][:5]}"
    counts = np.bincount(writes, minlength=size)
    assert (counts == 1).all(), f"{where}: {(counts == 0).sum()} outputs never written, {(counts > 1).sum()} written twice"


def once_each(where: str, indices: np.ndarray, size: int, what: str) -> None:
    counts = np.bincount(indices, minlength=size) if indices.size else np.zeros(size, dtype=int)
    assert counts.size == size and (counts == 1).all(), f"{where}: {what} not each visited once: {counts[:8]}"


def template(name: str) -> tuple[int, ...]:
    """The integers of an entry point's family name: gemm_coarse64x8 -> (64, 8)."""
    return tuple(int(v) for v in re.findall(r"\d+", name))


def threads_1d(launch: Launch) -> np.ndarray:
    """Global thread ids of a 1-D launch."""
    assert launch.grid[1:] == (1, 1) and launch.block[1:] == (1, 1), f"{launch.where}: not a 1-D launch"
    return np.arange(launch.grid[0] * launch.block[0], dtype=np.int64)


def strided_loop(start: np.ndarray, stride: int, end: int) -> np.ndarray:
    """Every value ``start + t * stride < end`` of a loop ``for (i = start; i < end; i += stride)``, all starts."""
    steps = max(0, -(-(end - int(start.min(initial=end))) // stride))
    values = (start[None, :] + stride * np.arange(steps, dtype=np.int64)[:, None]).ravel()
    return values[values < end]


# -- models --------------------------------------------------------------------------------------------------


def model_gemm(launch: Launch) -> None:
    a, b, c = launch.args[:3]
    m, n, k, sa_m, sa_k, sb_k, sb_n, sc_m, sc_n = (int(v) for v in launch.args[3:])
    tile, co = (template(launch.base) + (1,))[:2] if "tiled" in launch.base else template(launch.base)
    rows_per_pass = tile // co
    bdx, bdy, _ = launch.block
    ty, j = np.meshgrid(np.arange(bdy), np.arange(co), indexing="ij")
    staged_rows = (ty + j * rows_per_pass).ravel()
    once_each(launch.where, staged_rows, tile, "tile rows staged in shared memory")
    assert bdx == tile, f"{launch.where}: blockDim.x {bdx} != TILE {tile}: the tile's columns are not all staged"
    # Writes: thread (tx, ty) of block (bx, by) writes C[by * TILE + ty + j * ROWS, bx * TILE + tx], j < CO.
    rows = (np.arange(launch.grid[1])[:, None] * tile + staged_rows[None, :]).ravel()
    cols = (np.arange(launch.grid[0])[:, None] * tile + np.arange(bdx)[None, :]).ravel()
    rows, cols = rows[rows < m], cols[cols < n]
    written_once(launch.where, (rows[:, None] * sc_m + cols[None, :] * sc_n).ravel(), c.size)
    # Reads: a row of A at (r, kk) and a column of B at (kk, col), through the element strides.
    kk = np.arange(k)
    pick_r = np.unique(np.r_[rows[:SAMPLE], rows[-SAMPLE:]])
    pick_c = np.unique(np.r_[cols[:SAMPLE], cols[-SAMPLE:]])
    assert np.array_equal(gather(launch.where, a, pick_r[:, None] * sa_m + kk[None, :] * sa_k), a[pick_r]), launch.where
    assert np.array_equal(gather(launch.where, b, kk[:, None] * sb_k + pick_c[None, :] * sb_n), b[:, pick_c]), launch.where


def row_owners(launch: Launch, rows: int) -> np.ndarray:
    """Which row each warp (warp kernels) or block (block kernels) owns; each row must be owned once."""
    if launch.base in ("softmax_warp", "softmax_online", "reduce_warp"):
        assert launch.block[0] % 32 == 0, f"{launch.where}: a warp kernel needs whole warps"
        owners = threads_1d(launch)[::32] >> 5
    else:
        owners = np.arange(launch.grid[0], dtype=np.int64)
    owners = owners[owners < rows]
    once_each(launch.where, owners, rows, "rows")
    return owners


def lanes(launch: Launch) -> tuple[np.ndarray, int]:
    """The threads that sweep one row and their stride: a warp's 32 lanes, or a block's threads with the
    template's BS (a block larger than BS revisits elements, a smaller one skips them)."""
    if launch.base in ("softmax_warp", "softmax_online", "reduce_warp"):
        return np.arange(32, dtype=np.int64), 32
    bs = template(launch.base)[0] if template(launch.base) else launch.block[0]
    if launch.base.startswith(("softmax_block", "reduce_shuffle")):
        assert launch.block[0] % 32 == 0 and launch.block[0] <= 1024, f"{launch.where}: block_reduce needs whole warps"
    return np.arange(launch.block[0], dtype=np.int64), bs


def model_softmax(launch: Launch) -> None:
    x, y = launch.args[:2]
    rows, cols, sr, sc = (int(v) for v in launch.args[2:])
    owners = row_owners(launch, rows)
    start, stride = lanes(launch)
    columns = strided_loop(start, stride, cols)
    once_each(launch.where, columns, cols, "columns of a row")
    # Every pass reads x[row * sr + j * sc] and the last writes y[row * cols + j] for the same j.
    written_once(launch.where, (owners[:, None] * cols + columns[None, :]).ravel(), y.size)
    pick = np.unique(np.r_[owners[:SAMPLE], owners[-SAMPLE:]])
    got = gather(launch.where, x, pick[:, None] * sr + columns[None, :] * sc)
    assert np.array_equal(got, x[pick][:, columns]), f"{launch.where}: rows read through the strides are not x's"


def model_reduce(launch: Launch) -> None:
    x, y = launch.args[:2]
    n_out, length, s_out, s_in = (int(v) for v in launch.args[2:])
    axis = int(launch.inputs[1])
    if launch.base == "reduce_serial":
        owners = threads_1d(launch)
        owners = owners[owners < n_out]
        once_each(launch.where, owners, n_out, "outputs")
        elements = np.arange(length, dtype=np.int64)
    else:
        owners = row_owners(launch, n_out)
        start, stride = lanes(launch)
        if launch.base.startswith("reduce_tree"):
            assert launch.block[0] == stride, f"{launch.where}: the shared tree of {stride} needs {stride} threads"
        elements = strided_loop(start, stride, length)
    once_each(launch.where, elements, length, "summed elements of an output")
    written_once(launch.where, owners, y.size)
    pick = np.unique(np.r_[owners[:SAMPLE], owners[-SAMPLE:]])
    logical = x if axis == 1 else x.T
    got = gather(launch.where, x, pick[:, None] * s_out + elements[None, :] * s_in)
    assert np.array_equal(got, logical[pick][:, elements]), f"{launch.where}: outputs sum the wrong elements"


def model_transpose(launch: Launch) -> None:
    a, out = launch.args[:2]
    rows, cols, s0, s1 = (int(v) for v in launch.args[2:])
    bdx, bdy, _ = launch.block
    gx, gy, _ = launch.grid
    if launch.base == "transpose_naive":
        # c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y * blockDim.y + threadIdx.y
        c = np.arange(gx * bdx, dtype=np.int64)
        r = np.arange(gy * bdy, dtype=np.int64)
        r, c = r[r < rows], c[c < cols]
        src_r, src_c = np.broadcast_arrays(r[:, None], c[None, :])
        writes = (src_c * rows + src_r).ravel()
    else:
        tile = template(launch.base)[0]
        assert bdx == tile, f"{launch.where}: blockDim.x {bdx} != TILE {tile}"
        j = strided_loop(np.arange(bdy, dtype=np.int64), template_rows(launch.base), tile)
        once_each(launch.where, j, tile, "tile rows")
        # Block (bx, by) stages tile[j][tx] = in[by*TILE + j, bx*TILE + tx], then writes
        # out[(bx*TILE + j) * rows + by*TILE + tx] = tile[tx][j] = in[by*TILE + tx, bx*TILE + j].
        r0 = (np.arange(gy, dtype=np.int64) * tile)[:, None, None, None]
        c0 = (np.arange(gx, dtype=np.int64) * tile)[None, :, None, None]
        tx = np.arange(bdx, dtype=np.int64)[None, None, :, None]
        jj = j[None, None, None, :]
        src_r, src_c = np.broadcast_arrays(r0 + tx, c0 + jj)
        keep = (src_r < rows) & (src_c < cols)
        src_r, src_c = src_r[keep], src_c[keep]
        writes = src_c * rows + src_r
    written_once(launch.where, writes, out.size)
    emulated = np.empty(out.size, dtype=out.dtype)
    emulated[writes] = gather(launch.where, a, (src_r * s0 + src_c * s1).ravel())
    assert np.array_equal(emulated.reshape(out.shape), a.T), f"{launch.where}: the emulated output is not a.T"


def template_rows(base: str) -> int:
    """ROWS of a tiled transpose: the block's y extent its template loops with."""
    return {"transpose_tiled32": 8, "transpose_tiled32_nopad": 8, "transpose_tiled16": 16, "transpose_tiled64": 8}[base]


def model_bias_gelu(launch: Launch) -> None:
    x, bias, out = launch.args[:3]
    rows, cols, sr, sc, sb = (int(v) for v in launch.args[3:])
    bdx, bdy, _ = launch.block
    if launch.base == "bias_gelu_flat":
        idx = strided_loop(threads_1d(launch), launch.grid[0] * bdx, rows * cols)
        r, c = idx // cols, idx % cols
    elif launch.base == "bias_gelu_vec4":
        groups = -(-cols // 4)
        g = strided_loop(threads_1d(launch), launch.grid[0] * bdx, rows * groups)
        r, c = np.repeat(g // groups, 4), (np.repeat(g % groups, 4) * 4 + np.tile(np.arange(4), g.size))
        r, c = r[c < cols], c[c < cols]
    elif launch.base == "bias_gelu_rows":
        r_blocks = np.arange(launch.grid[0], dtype=np.int64)
        r_blocks = r_blocks[r_blocks < rows]
        cs = strided_loop(np.arange(bdx, dtype=np.int64), bdx, cols)
        r, c = (a.ravel() for a in np.broadcast_arrays(r_blocks[:, None], cs[None, :]))
    else:  # bias_gelu_tile: c = blockIdx.x * 32 + threadIdx.x; rows r0 + j, j = threadIdx.y; j < 32; j += blockDim.y
        assert bdx == 32, f"{launch.where}: the 32-wide bias tile needs blockDim.x == 32"
        j = strided_loop(np.arange(bdy, dtype=np.int64), bdy, 32)
        once_each(launch.where, j, 32, "tile rows")
        cb = (np.arange(launch.grid[0], dtype=np.int64) * 32)[:, None] + np.arange(32)[None, :]
        rb = (np.arange(launch.grid[1], dtype=np.int64) * 32)[:, None] + j[None, :]
        cb, rb = cb.ravel(), rb.ravel()
        r, c = (a.ravel() for a in np.broadcast_arrays(rb[rb < rows][:, None], cb[cb < cols][None, :]))
    writes = r * cols + c
    written_once(launch.where, writes, out.size)
    for operand, offsets, expected in ((x, r * sr + c * sc, x), (bias, c * sb, np.broadcast_to(bias, x.shape))):
        emulated = np.zeros(out.size, dtype=operand.dtype)
        emulated[writes] = gather(launch.where, operand, offsets)
        assert np.array_equal(emulated.reshape(out.shape), expected), f"{launch.where}: reads the wrong elements"


MODELS = {
    "gemm": model_gemm, "softmax": model_softmax, "reduce": model_reduce, "transpose": model_transpose,
    "bias_gelu": model_bias_gelu,
}


def model_for(base: str) -> Any:
    for prefix, model in MODELS.items():
        if base.startswith(prefix):
            return model
    raise AssertionError(f"no index model for kernel family {base}")


def launches_of(workload: tuple[str, dict[str, Any]]) -> Iterator[Launch]:
    yield from record([workload])


@pytest.mark.parametrize("workload", WORKLOADS, ids=[ids(w) for w in WORKLOADS])
def test_every_candidates_launch_covers_its_output_exactly_once_and_reads_its_operands(workload) -> None:
    bases = set()
    for launch in launches_of(workload):
        model_for(launch.base)(launch)
        bases.add(launch.base)
    assert bases, f"{workload}: no CUDA candidate launched"


def test_the_table_covers_every_kernel_family_every_cuda_dtype_odd_sizes_and_strided_layouts() -> None:
    from farm_kernels import bias_gelu, matmul, reduce_sum, softmax, transpose

    families = {n.rsplit("_", 1)[0] for m in (matmul, softmax, reduce_sum, transpose, bias_gelu) for n in m.PROGRAM.entry_names()}
    for base in families:
        model_for(base)
    assert {spec["dtype"] for _, spec in WORKLOADS} == all_cuda_dtypes()
    assert any(spec.get("layout") == "strided" for _, spec in WORKLOADS)
    assert any(all(v % 2 for k, v in spec.items() if k in ("m", "n", "k", "rows", "cols")) for _, spec in WORKLOADS)


def test_a_block_its_template_does_not_expect_is_caught() -> None:
    """The models are not vacuous: a reduce_tree256 launched with 512 threads sums every element twice."""
    launch = next(iter(record([("reduce_sum", dict(rows=5, cols=700, axis=1, dtype="float32"))])))
    assert launch.base == "reduce_tree128"
    model_reduce(launch)
    wrong = Launch(**{**launch.__dict__, "block": (256, 1, 1)})
    with pytest.raises(AssertionError, match="each visited once|needs 128 threads"):
        model_reduce(wrong)
    gemm = next(iter(record([("matmul", dict(m=33, n=17, k=9, dtype="float32"))])))
    with pytest.raises(AssertionError, match="never written|staged"):
        model_gemm(Launch(**{**gemm.__dict__, "grid": (gemm.grid[0], gemm.grid[1] - 1, 1)}))


def test_a_stride_mix_up_is_caught() -> None:
    """A kernel addressing a strided input with its strides swapped reads the wrong elements (or outside)."""
    launch = next(iter(record([("transpose", dict(rows=13, cols=7, layout="strided", dtype="float32"))])))
    model_transpose(launch)
    swapped = (*launch.args[:4], launch.args[5], launch.args[4])
    with pytest.raises(AssertionError, match="not a.T|outside the input"):
        model_transpose(Launch(**{**launch.__dict__, "args": swapped}))
