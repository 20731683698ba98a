"""The CUDA programs compile with NVRTC (what CuPy's RawModule uses, with CuPy's options) to cubins for sm_80 and
sm_90; every entry point the candidates launch is in the cubin under its plain name; and every launch the
candidates make (example catalog workloads and odd/strided/float16 specs) fits the compiled kernel's registers,
shared memory and __launch_bounds__ on both architectures. No GPU needed: libnvrtc comes from the
nvidia-cuda-nvrtc-cu12 wheel of the dev extras. Without it the tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import importlib.util
import re
import struct
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from cuda_launches import catalog_workloads, extra_workloads, launch_configurations, record
from servers import IN_CI

from farm_kernels import bias_gelu, matmul, reduce_sum, softmax, transpose
from farm_kernels.cuda import COMMON, CudaProgram, cubin, nvrtc, source_text

ARCHS = ("sm_80", "sm_90")
PROGRAMS = {m.PROGRAM.filename: m.PROGRAM for m in (matmul, softmax, reduce_sum, transpose, bias_gelu)}
ALL_PROGRAMS = {**PROGRAMS, COMMON: CudaProgram(COMMON, text=source_text(COMMON))}
EM_CUDA = 190
SM90_RESERVED_SHARED = 1024  # sm_90 cubins count the per-block system reservation in .nv.shared.NAME


def require_nvrtc() -> None:
    """Skip without libnvrtc; under CI=true a missing library fails the test instead."""
    try:
        nvrtc.load()
    except nvrtc.NvrtcUnavailable as e:
        if IN_CI:
            pytest.fail(f"CI=true and NVRTC is missing: {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def compiled() -> dict[tuple[str, str], nvrtc.Compiled | nvrtc.NvrtcError]:
    """Every program compiled for every arch (with ptxas -v), once per module."""
    require_nvrtc()

    def one(job: tuple[str, str]) -> nvrtc.Compiled | nvrtc.NvrtcError:
        try:
            return nvrtc.compile_program(ALL_PROGRAMS[job[0]], job[1])
        except nvrtc.NvrtcError as e:
            return e

    jobs = [(f, a) for f in ALL_PROGRAMS for a in ARCHS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(one, jobs), strict=True))


def result(compiled: dict, filename: str, arch: str) -> nvrtc.Compiled:
    found = compiled[(filename, arch)]
    if isinstance(found, nvrtc.NvrtcError):
        pytest.fail(str(found))
    return found


@pytest.fixture(scope="module")
def launches() -> dict[tuple[str, tuple[int, ...], int], str]:
    """(entry point, block, dynamic shared bytes) of every launch on the catalog's and the extra workloads."""
    return launch_configurations(list(record(catalog_workloads() + extra_workloads())))


def test_nvrtc_targets_both_architectures() -> None:
    require_nvrtc()
    assert nvrtc.version() >= (12, 0)
    assert {80, 90} <= set(nvrtc.supported_archs())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("filename", sorted(ALL_PROGRAMS))
def test_every_program_compiles_with_nvrtc_and_cupys_options_to_a_cubin_without_warnings(compiled, filename: str, arch: str) -> None:
    found = result(compiled, filename, arch)
    assert found.options == (*ALL_PROGRAMS[filename].options, "-ftz=true", f"-arch={arch}",
                             "--device-as-default-execution-space", "--ptxas-options=-v")
    assert "warning" not in found.log.lower(), found.log
    machine = struct.unpack_from("<H", found.cubin, 0x12)[0]
    assert (found.cubin[:4], machine, cubin.architecture(found.cubin)) == (b"\x7fELF", EM_CUDA, int(arch[3:])), f"{filename}: not an {arch} cubin"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("filename", sorted(PROGRAMS))
def test_every_entry_point_the_candidates_launch_is_in_the_cubin_under_its_plain_name(compiled, filename: str, arch: str) -> None:
    defined = cubin.kernels(result(compiled, filename, arch).cubin)
    wanted = set(PROGRAMS[filename].entry_names())
    assert wanted, f"{filename}: no candidate launches a kernel of it"
    missing = sorted(wanted - set(defined))
    assert not missing, f"{filename} ({arch}) does not define {missing} (extern \"C\" missing? defined: {sorted(defined)})"
    mangled = sorted(name for name in defined if name.startswith("_Z"))
    assert not mangled, f"{filename} ({arch}): entry points with C++ names {mangled}: declare them extern \"C\""


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("filename", sorted(PROGRAMS))
def test_the_resources_read_from_the_cubin_match_ptxas_report(compiled, filename: str, arch: str) -> None:
    found = result(compiled, filename, arch)
    reported = {}
    for name, body in re.findall(r"Function properties for (\w+)\n(.*?)Compile time", found.log, re.S):
        registers = re.search(r"Used (\d+) registers", body)
        smem = re.search(r"(\d+) bytes smem", body)
        frame = re.search(r"(\d+) bytes stack frame", body)
        assert registers and frame, f"{name}: unexpected ptxas report {body!r}"
        reported[name] = (int(registers.group(1)), int(smem.group(1)) if smem else 0, int(frame.group(1)))
    read = cubin.kernels(found.cubin)
    reserved = SM90_RESERVED_SHARED if arch == "sm_90" else 0
    as_read = {k.name: (k.registers, k.shared - reserved if k.shared else 0, k.frame) for k in read.values()}
    assert as_read == reported


@pytest.mark.parametrize("arch", ARCHS)
def test_every_launch_of_every_candidate_fits_the_compiled_kernels_resources(compiled, launches, arch: str) -> None:
    resources = {}
    for filename in PROGRAMS:
        resources.update(cubin.kernels(result(compiled, filename, arch).cubin))
    limits = cubin.LIMITS[arch]
    problems = []
    for (name, block, shared_mem), where in sorted(launches.items()):
        kernel = resources[name]
        problems += [f"{where} ({name}, block {block}): {p}" for p in cubin.launch_problems(kernel, block, shared_mem, limits)]
        if kernel.frame:
            problems.append(f"{where} ({name}): {kernel.frame} bytes of stack frame (spills or a local array)")
    assert not problems, "\n".join(problems)
    launched = {name for name, _, _ in launches}
    assert launched == {name for p in PROGRAMS.values() for name in p.entry_names()}, "an entry point is never launched"


def test_a_launch_beyond_the_kernels_resources_is_reported(compiled) -> None:
    kernel = cubin.kernels(result(compiled, "matmul.cu", "sm_80").cubin)["gemm_coarse64x8_f32"]
    limits = cubin.LIMITS["sm_80"]
    assert kernel.max_threads == 512 and kernel.registers > 64
    assert cubin.launch_problems(kernel, (64, 8, 1), 0, limits) == []
    problems = cubin.launch_problems(kernel, (32, 32, 1), 0, limits)
    assert any("__launch_bounds__ 512" in p for p in problems) and any("> 65536 per block" in p for p in problems)
    assert any("shared memory" in p for p in cubin.launch_problems(kernel, (64, 8, 1), 200 * 1024, limits))
    fat = cubin.KernelResources("fat", registers=255, shared=49 * 1024, frame=0, max_threads=None)
    assert len(cubin.launch_problems(fat, (1024, 2, 1), 0, cubin.LIMITS["sm_90"])) == 3


def test_static_shared_memory_beyond_48_kib_is_rejected_by_nvrtc() -> None:
    require_nvrtc()
    text = 'extern "C" __global__ void big(float* y) { __shared__ float s[12289]; s[threadIdx.x] = 1; __syncthreads(); y[0] = s[7]; }'
    with pytest.raises(nvrtc.NvrtcError, match="big"):
        nvrtc.compile_text(text, "big.cu", "sm_90", ("-arch=sm_90",))


def test_a_missing_nvrtc_library_names_what_to_install(monkeypatch) -> None:
    monkeypatch.setenv(nvrtc.LIBRARY_ENV, "/nonexistent/libnvrtc.so.12")
    monkeypatch.setattr(nvrtc, "_library", None)
    with pytest.raises(nvrtc.NvrtcUnavailable, match="/nonexistent/libnvrtc.so.12"):
        nvrtc.load()
    monkeypatch.setattr(sys.modules[__name__], "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="CI=true and NVRTC is missing"):
        require_nvrtc()


@pytest.mark.skipif(importlib.util.find_spec("cupy_backends") is None, reason="CuPy is not installed")
def test_cupys_own_nvrtc_bindings_give_the_same_kernels(compiled) -> None:
    """Where CuPy is installed (no device needed for its raw NVRTC bindings), they build the same kernels."""
    cupy_nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    program = PROGRAMS["softmax.cu"]
    handle = cupy_nvrtc.createProgram(program.text, program.filename, [], [])
    try:
        cupy_nvrtc.compileProgram(handle, list(nvrtc.cupy_options(program, "sm_90")))
        theirs = cubin.kernels(cupy_nvrtc.getCUBIN(handle))
    finally:
        cupy_nvrtc.destroyProgram(handle)
    assert theirs == cubin.kernels(result(compiled, "softmax.cu", "sm_90").cubin)


@pytest.mark.gpu
def test_on_the_device_cupys_loaded_kernels_have_the_resources_read_from_the_cubin_and_fit_every_launch(launches) -> None:
    """What the driver says of each kernel CuPy compiled and loaded (RawModule) against the cubin read here."""
    import cupy

    require_nvrtc()
    arch = f"sm_{cupy.cuda.Device().compute_capability}"
    ours = {}
    for program in PROGRAMS.values():
        ours.update(cubin.kernels(nvrtc.compile_program(program, arch).cubin))
    problems = []
    for (name, block, _shared), where in sorted(launches.items()):
        program = next(p for p in PROGRAMS.values() if name in p.entry_names())
        function = program.function(name)
        threads = block[0] * block[1] * block[2]
        if threads > function.max_threads_per_block:
            problems.append(f"{where}: {threads} threads > the driver's {function.max_threads_per_block} for {name}")
        if function.num_regs != ours[name].registers:
            problems.append(f"{name}: {function.num_regs} registers on the device, {ours[name].registers} read here")
        if function.shared_size_bytes not in (ours[name].shared, ours[name].shared - SM90_RESERVED_SHARED):
            problems.append(f"{name}: {function.shared_size_bytes} bytes shared on the device, {ours[name].shared} read here")
    assert not problems, f"NVRTC {nvrtc.version()} here, CuPy {cupy.__version__}:\n" + "\n".join(problems)
