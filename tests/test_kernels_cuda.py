"""The CUDA candidates: their sources compile (nvcc --ptx, sm_80 and sm_90), their launches match the compiled
kernels (checked without a GPU), and, on a device (-m gpu), their outputs match the references."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cuda_launches import Launch, extra_workloads, record

import farm
from farm.errors import FailureKind, TuneFailure
from farm_kernels import bias_gelu, matmul, reduce_sum, registry, softmax, transpose
from farm_kernels.cuda import SOURCE_DIR, CudaProgram

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("sm_80", "sm_90")
PROGRAMS = {m.PROGRAM.filename: m.PROGRAM for m in (matmul, softmax, reduce_sum, transpose, bias_gelu)}
SOURCES = sorted(p.name for p in SOURCE_DIR.glob("*.cu"))
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")


def program_text(filename: str) -> str:
    """What the runtime compiles for a .cu file: common.cu alone, or common.cu + the file."""
    return PROGRAMS[filename].text if filename in PROGRAMS else (SOURCE_DIR / filename).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Compiled:
    returncode: int
    stderr: str
    ptx: str


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Compiled]:
    """Every .cu of kernels/cuda compiled with nvcc --ptx for every arch (in parallel, once per module)."""
    if NVCC is None:
        pytest.skip("nvcc is not on the PATH")
    folder = tmp_path_factory.mktemp("ptx")

    def compile_one(job: tuple[str, str]) -> Compiled:
        filename, arch = job
        source = folder / f"{arch}_{filename}"
        source.write_text(program_text(filename), encoding="utf-8")
        out = source.with_suffix(".ptx")
        options = PROGRAMS[filename].options if filename in PROGRAMS else ()
        done = subprocess.run(
            [NVCC, "--ptx", f"-arch={arch}", *options, str(source), "-o", str(out)],
            capture_output=True, text=True, timeout=240,
        )
        return Compiled(done.returncode, done.stderr, out.read_text(encoding="utf-8") if out.exists() else "")

    jobs = [(f, a) for f in SOURCES for a in ARCHS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(jobs, pool.map(compile_one, jobs), strict=True))


def entries(ptx: str) -> dict[str, tuple[list[str], int | None]]:
    """Entry name -> (parameter types, .maxntid thread count or None)."""
    found = {}
    for match in re.finditer(r"\.entry\s+(\w+)\(\s*(.*?)\)\s*(\.maxntid\s+(\d+),\s*(\d+),\s*(\d+))?", ptx, re.S):
        params = re.findall(r"\.param\s+\.(\w+)", match.group(2))
        maxntid = int(match.group(4)) * int(match.group(5)) * int(match.group(6)) if match.group(3) else None
        found[match.group(1)] = (params, maxntid)
    return found


def test_every_cu_file_belongs_to_a_program_or_is_the_common_prelude() -> None:
    assert set(SOURCES) == {"common.cu", *PROGRAMS}
    for program in PROGRAMS.values():
        assert program.text.startswith((SOURCE_DIR / "common.cu").read_text(encoding="utf-8"))
        assert program.entry_names(), f"{program.filename}: no candidate launches a kernel of it"


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("filename", SOURCES)
def test_every_cuda_source_compiles_to_ptx_without_warnings(compiled, filename: str, arch: str) -> None:
    result = compiled[(filename, arch)]
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    if filename in PROGRAMS:
        defined = entries(result.ptx)
        missing = [name for name in PROGRAMS[filename].entry_names() if name not in defined]
        assert not missing, f"{filename} ({arch}) does not define {missing}"


def test_the_cuda_sets_are_built_planned_and_checksummed_without_importing_cupy() -> None:
    code = (
        "import sys\n"
        "from farm_kernels import registry\n"
        "registry.ensure_loaded()\n"
        "for n in registry.names():\n"
        "    ts = registry.get(n).tunable('cuda')\n"
        "    assert list(ts.plan()) and ts.checksum() and ts.stack_reference() == 0\n"
        "print('cupy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_launching_a_cuda_kernel_without_cupy_is_unavailable_with_the_install_hint() -> None:
    kernel = matmul.PROGRAM.kernel("gemm_tiled16", matmul.CUDA_DTYPES)
    with pytest.raises(TuneFailure) as raised:
        kernel.launch(np.float32, (1, 1, 1), (16, 16, 1), ())
    assert raised.value.kind is FailureKind.UNAVAILABLE and "no CUDA device" in raised.value.message


def test_a_cuda_candidates_identity_covers_source_options_and_launch_configuration() -> None:
    base = matmul.cuda_tunable().checksum()
    assert matmul.cuda_tunable().checksum() == base
    edited = CudaProgram("matmul.cu", text=matmul.PROGRAM.text + "\n// an edit\n")
    assert matmul.cuda_tunable(program=edited).checksum() != base
    assert matmul.cuda_tunable(program=CudaProgram("matmul.cu", options=("-std=c++17", "-use_fast_math"))).checksum() != base
    launches = dict(matmul.GEMM_LAUNCHES, tiled_32=matmul.GemmLaunch("gemm_tiled32", 32, 2))
    assert matmul.cuda_tunable(launches=launches).checksum() != base
    grids = dict(bias_gelu.GELU_LAUNCHES, fused_flat=("bias_gelu_flat", (128, 1, 1), bias_gelu._flat_grid))
    assert bias_gelu.cuda_tunable(launches=grids).checksum() != bias_gelu.cuda_tunable().checksum()


# -- launches, checked without a GPU ------------------------------------------------------------------------
#
# tests/cuda_launches.py records every candidate's launch on NumPy inputs; each recorded launch is checked against
# what the .cu files assume (tests/test_launch_coverage.py emulates the index arithmetic of each launch, and
# tests/test_nvrtc.py checks the launches against the resources of the NVRTC-compiled kernels).

# Block shapes the kernels' templates fix (a tile loop, a shared buffer of BS floats, a 32-wide bias tile).
FIXED_BLOCKS = {
    "gemm_tiled16": (16, 16, 1), "gemm_tiled32": (32, 32, 1), "gemm_coarse32x4": (32, 8, 1),
    "gemm_coarse64x4": (64, 16, 1), "gemm_coarse64x8": (64, 8, 1),
    "softmax_block128": (128, 1, 1), "softmax_block256": (256, 1, 1), "softmax_block512": (512, 1, 1),
    "reduce_tree128": (128, 1, 1), "reduce_tree256": (256, 1, 1), "reduce_tree512": (512, 1, 1),
    "transpose_tiled32": (32, 8, 1), "transpose_tiled32_nopad": (32, 8, 1), "transpose_tiled16": (16, 16, 1),
    "transpose_tiled64": (64, 8, 1),
}
WARP_KERNELS = {"softmax_warp", "softmax_online", "reduce_warp", "reduce_shuffle", "bias_gelu_tile"}


def covers(base: str, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> bool:
    """Whether the launch reaches every output (grid-stride kernels cover any grid)."""
    gx, gy, _ = grid
    bx, by, _ = block
    if base.startswith("gemm"):
        m, n = int(args[3]), int(args[4])
        return gx * bx >= n and gy * bx >= m  # a TILE x TILE tile per block, TILE = blockDim.x
    if base in ("softmax_warp", "softmax_online", "reduce_warp"):
        return gx * bx // 32 >= int(args[2])
    if base.startswith(("softmax_block", "reduce_tree", "reduce_shuffle", "bias_gelu_rows")):
        return gx >= int(args[2] if base.startswith(("softmax", "reduce")) else args[3])
    if base == "reduce_serial":
        return gx * bx >= int(args[2])
    if base == "transpose_naive":
        return gx * bx >= int(args[3]) and gy * by >= int(args[2])
    if base.startswith("transpose_tiled"):
        return gx * bx >= int(args[3]) and gy * bx >= int(args[2])
    if base == "bias_gelu_tile":
        return gx * 32 >= int(args[4]) and gy * 32 >= int(args[3])
    return base in ("bias_gelu_flat", "bias_gelu_vec4")


@pytest.fixture(scope="module")
def launches() -> list[Launch]:
    return list(record(extra_workloads(), check_reference=True))


def test_every_cuda_candidate_launches_one_kernel_that_covers_its_output_with_the_block_its_template_fixes(launches) -> None:
    assert {launch.base for launch in launches} >= set(FIXED_BLOCKS) | WARP_KERNELS
    for launch in launches:
        assert launch.block == FIXED_BLOCKS.get(launch.base, launch.block), launch.where
        if launch.base in WARP_KERNELS:
            assert launch.block[0] % 32 == 0, launch.where
        if launch.base == "bias_gelu_tile":
            assert launch.block[0] == 32, launch.where
        assert covers(launch.base, launch.grid, launch.block, launch.args), f"{launch.where}: grid {launch.grid}"


KERNEL_DTYPES = {"f16": np.float16, "f32": np.float32, "f64": np.float64}
PARAM_TYPES = {np.int32: ("u32", "s32"), np.int64: ("u64", "s64"), np.float32: ("f32",)}


@needs_nvcc
def test_every_cuda_launch_passes_arguments_of_the_widths_and_dtypes_its_compiled_kernel_declares(compiled, launches) -> None:
    defined = {}
    for filename in PROGRAMS:
        defined.update(entries(compiled[(filename, "sm_80")].ptx))
    for launch in launches:
        params, maxntid = defined[launch.name]
        assert len(params) == len(launch.args), f"{launch.where}: {len(launch.args)} arguments for {params}"
        suffix = KERNEL_DTYPES[launch.name.rsplit("_", 1)[1]]
        for position, (arg, param) in enumerate(zip(launch.args, params, strict=True)):
            if isinstance(arg, np.ndarray):
                assert param == "u64" and arg.dtype == suffix, f"{launch.where}: argument {position}"
            else:
                assert param in PARAM_TYPES[type(arg)], f"{launch.where}: argument {position} {type(arg)} for .{param}"
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        assert maxntid is None or threads <= maxntid, f"{launch.where}: {threads} threads > .maxntid {maxntid}"


# -- on a device ------------------------------------------------------------------------------------------

GPU_SPECS: dict[str, list[dict[str, Any]]] = {
    "matmul": [dict(m=1, n=1, k=1), dict(m=31, n=7, k=257, layout="a_transposed"), dict(m=257, n=131, k=509),
               dict(m=130, n=67, k=33, layout="strided"), dict(m=65, n=129, k=64, layout="transposed")],
    "softmax": [dict(rows=1, cols=1), dict(rows=13, cols=4099, layout="strided"), dict(rows=1031, cols=31),
                dict(rows=257, cols=513, layout="transposed")],
    "reduce_sum": [dict(rows=1, cols=1, axis=1), dict(rows=13, cols=20011, axis=1, layout="strided"),
                   dict(rows=1031, cols=13, axis=0, layout="transposed"), dict(rows=509, cols=257, axis=0)],
    "transpose": [dict(rows=1, cols=1), dict(rows=13, cols=1031, layout="strided"), dict(rows=1031, cols=257)],
    "bias_gelu_fusion": [dict(rows=1, cols=1), dict(rows=13, cols=1031, layout="strided"),
                         dict(rows=257, cols=33, layout="transposed"), dict(rows=512, cols=3072)],
}


@pytest.fixture(scope="module")
def cuda_client() -> Any:
    from farm.runtimes.cuda import CudaClient

    return CudaClient(0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_SPECS))
def test_every_cuda_candidate_matches_the_reference_on_the_device(cuda_client, name: str) -> None:
    registry.ensure_loaded()
    op = registry.get(name)
    ts = op.cuda
    for spec in GPU_SPECS[name]:
        for dtype in op.dtypes["cuda"]:
            full = dict(spec, dtype=dtype)
            inputs = op.build(full, cuda_client)
            tolerance = ts.tolerance_for(inputs, farm.Tolerance())
            with cuda_client.activate():
                expected = ts[ts.stack_reference()].fn(*ts.generate_inputs(inputs))
            for impl in ts.implementations[1:]:
                trial = ts.generate_inputs(inputs)
                with cuda_client.activate():
                    out = impl.fn(*trial)
                cuda_client.sync()
                check = farm.compare_outputs(expected, out, tolerance)
                assert check.passed, f"{name} {impl.name} {full}: {check.problem}"
                for before, after in zip(inputs, trial, strict=True):
                    if hasattr(before, "get"):
                        assert np.array_equal(before.get(), after.get()), f"{name} {impl.name}: modified its input"


@pytest.mark.gpu
def test_the_small_gpu_benchmark_tunes_every_cuda_workload_of_the_catalog(cuda_client, capsys) -> None:
    spec = importlib.util.spec_from_file_location("kernels_bench", ROOT / "bench" / "kernels_host.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    # Registered before it runs: its dataclasses look their module up in sys.modules (else AttributeError).
    sys.modules.setdefault("kernels_bench", bench)
    spec.loader.exec_module(bench)
    catalog = tomllib.loads((ROOT / "examples" / "catalog.toml").read_text(encoding="utf-8"))
    catalog["policy"] = dict(catalog.get("policy", {}), samples=3, warmups=1)
    registry.ensure_loaded()
    rows = bench.tune(catalog, cuda_client)
    with capsys.disabled():
        print("\n" + bench.render(rows))
    assert rows and all(not row.rejected for row in rows), [(r.workload, r.rejected) for r in rows if r.rejected]
