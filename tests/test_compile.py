"""The compile stage of CUDA spaces, without a GPU: NVRTC (the nvidia-cuda-nvrtc-cu12 wheel) compiles each config of
matmul's ``gemm`` space, the cubin's resources prune what cannot launch, the verdicts and cubins go to the
content-addressed kernel cache (a directory, or a real redis-server), a second compile compiles nothing, and the
trial path loads the cached cubin. ``-m gpu``: the cached cubin runs on the device and matches cuBLAS."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from nvrtc_support import skip_without_nvrtc

from farm.arrays import array_signature
from farm.errors import ConfigError, FailureKind, TuneFailure
from farm.tunable import TunableSet
from farm_cli import main
from farm_kernels import matmul, reduce_sum, softmax, transpose
from farm_kernels.cuda import CudaProgram, cubin, karchive, kcache
from farm_kernels.cuda import compile as stage
from farm_kernels.cuda.spaces import kernel_space_of

ARCH = "sm_90"


@pytest.fixture(autouse=True)
def needs_nvrtc() -> None:
    skip_without_nvrtc()


def small_set(tiles: list[int], coarsen: list[int]) -> TunableSet:
    """matmul's CUDA set with a smaller gemm space (the same KernelSpace, so the same sources and keys)."""
    space = matmul.gemm_space()
    ts = TunableSet("matmul_small", signature=array_signature)
    ts.add(matmul.cupy_matmul, reference=True)
    ts.space(name="gemm", restrict=list(matmul.GEMM_SPACE_RESTRICT), tile=tiles, coarsen=coarsen)(
        matmul.gemm_space_candidate(space))
    return ts


def gemm_job(tile: int, coarsen: int, block: tuple[int, int, int] | None = None, shared_mem: int = 0) -> stage.CompileJob:
    space = matmul.gemm_space()
    config = {"tile": tile, "coarsen": coarsen}
    launch = space.launch(config)
    return stage.program_job(space.variant(config), ARCH, f"gemm[tile={tile},coarsen={coarsen}]",
                             space.entry_names(config), block or launch.block, shared_mem)


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[str, ...], Any, Any]]:
    """Every kernel launch as (entry point, the program's options, grid, block), nothing run on a device."""
    found: list[tuple[str, tuple[str, ...], Any, Any]] = []

    def function(self: CudaProgram, name: str) -> Any:
        return lambda grid, block, args, shared_mem=0: found.append((name, self.options, grid, block))

    monkeypatch.setattr(CudaProgram, "function", function)
    return found


# -- the space ------------------------------------------------------------------------------------------------


def test_the_cuda_matmul_set_declares_the_gemm_space_with_the_kernels_requirements_as_restrictions() -> None:
    ts = matmul.cuda_tunable()
    (space,) = ts.spaces
    assert kernel_space_of(space.fn) is not None
    feasible = [space.config(r) for r in space.feasible_ranks()]
    assert {"tile": 32, "coarsen": 4} in feasible
    assert {"tile": 64, "coarsen": 1} not in feasible  # 4096 threads
    assert {"tile": 8, "coarsen": 16} not in feasible  # 16 does not divide 8
    assert all(c["tile"] % c["coarsen"] == 0 and c["tile"] ** 2 // c["coarsen"] <= 1024 for c in feasible)


def test_a_space_config_launches_its_own_variant_with_the_block_its_defines_expect(launched: list[Any]) -> None:
    ts = matmul.cuda_tunable()
    a, b = np.ones((70, 33), np.float32), np.ones((33, 41), np.float32)
    ts.spaces[0].fn(a, b, tile=32, coarsen=4)
    ((name, options, grid, block),) = launched
    assert name == "gemm_space_f32"
    assert "-DGEMM_TILE=32" in options and "-DGEMM_CO=4" in options
    assert block == (32, 8, 1) and grid == (2, 3, 1)


def test_the_transpose_tiles_space_launches_a_tile_by_rows_block_over_the_whole_matrix(launched: list[Any]) -> None:
    (space,) = transpose.cuda_tunable().spaces
    assert kernel_space_of(space.fn) is not None
    out = space.fn(np.ones((70, 33), np.float64), tile=32, rows=8, pad=1)
    ((name, options, grid, block),) = launched
    assert out.shape == (33, 70) and name == "transpose_space_f64"
    assert {"-DTRANSPOSE_TILE=32", "-DTRANSPOSE_ROWS=8", "-DTRANSPOSE_PAD=1"} <= set(options)
    assert block == (32, 8, 1) and grid == (2, 3, 1)
    assert all(c["tile"] % c["rows"] == 0 for c in map(space.config, space.feasible_ranks()))


@pytest.mark.parametrize(("module", "inputs", "entry", "grid"), [
    (softmax, (np.ones((70, 33), np.float32),), "softmax_space_f32", (70, 1, 1)),
    (reduce_sum, (np.ones((70, 33), np.float16), 1), "reduce_space_f16", (70, 1, 1)),
])
def test_the_block_per_row_spaces_launch_one_block_of_threads_per_row(
        module: Any, inputs: tuple[Any, ...], entry: str, grid: tuple[int, int, int], launched: list[Any]) -> None:
    (space,) = module.cuda_tunable().spaces
    assert [space.config(r)["threads"] for r in space.feasible_ranks()] == [32, 64, 128, 256, 512, 1024]
    space.fn(*inputs, threads=256)
    ((name, options, got_grid, block),) = launched
    assert name == entry and block == (256, 1, 1) and got_grid == grid
    assert any(o.endswith("_BS=256") for o in options)


def test_the_variants_cubin_holds_only_the_space_entry_points_with_the_configs_resources() -> None:
    entry = stage.compile_job(gemm_job(32, 4))
    assert entry.status == "compiled", entry.reason
    assert set(cubin.kernels(entry.cubin)) == {"gemm_space_f16", "gemm_space_f32"}
    assert cubin.architecture(entry.cubin) == 90
    # 32 x 32 floats of A, 32 x 33 of B (+ sm_90's 1 KiB reservation).
    assert entry.resources["gemm_space_f32"]["shared"] >= (32 * 32 + 32 * 33) * 4


# -- verdicts -------------------------------------------------------------------------------------------------


def test_a_config_whose_registers_exceed_the_block_register_file_is_infeasible_with_the_numbers() -> None:
    # gemm[tile=64,coarsen=16] uses about 100 registers per thread; a 1024-thread launch needs 100 x 1024.
    entry = stage.compile_job(gemm_job(64, 16, block=(1024, 1, 1)))
    assert entry.status == "infeasible" and not entry.cubin
    registers = entry.resources["gemm_space_f32"]["registers"]
    assert registers * 1024 > 65536
    assert entry.reason.startswith("infeasible: gemm_space_f16: ")
    assert f"{registers} registers x 1024 threads" in entry.reason and "> 65536" in entry.reason


def test_spill_stores_are_read_per_entry_point_from_ptxas_report() -> None:
    log = ("ptxas info    : Function properties for k_f16\n"
           "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Function properties for k_f32\n"
           "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n")
    assert stage.spill_stores(log) == {"k_f16": 8, "k_f32": 0}
    entry = stage.compile_job(gemm_job(32, 4))
    assert entry.resources["gemm_space_f32"]["spill_stores"] == 0


def test_a_launch_whose_dynamic_shared_memory_exceeds_the_architecture_is_infeasible() -> None:
    entry = stage.compile_job(gemm_job(16, 1, shared_mem=300 * 1024))
    assert entry.status == "infeasible"
    assert f"> {cubin.LIMITS[ARCH].shared_per_block_optin} per block" in entry.reason


def test_a_tile_that_overflows_static_shared_memory_is_infeasible_from_ptxas_verdict() -> None:
    entry = stage.compile_job(gemm_job(128, 16))
    assert entry.status == "infeasible"
    assert "gemm_space_f32" in entry.reason and "uses too much shared data" in entry.reason


def test_a_compile_error_is_a_failed_verdict_with_nvrtcs_log_not_an_exception() -> None:
    broken = CudaProgram("broken.cu", text='extern "C" __global__ void k_f32() { undefined_symbol(); }')
    entry = stage.compile_job(stage.program_job(broken, ARCH, "broken", ("k_f32",)))
    assert entry.status == "failed" and not entry.cubin
    assert "NVRTC_ERROR_COMPILATION" in entry.reason and "undefined_symbol" in entry.reason


@pytest.mark.parametrize("change", ["text", "options", "arch", "version"])
def test_the_kernel_key_changes_with_each_input(change: str) -> None:
    base: dict[str, Any] = {"text": "k", "options": ("-DA=1",), "arch": "sm_90", "version": (12, 9)}
    other: dict[str, Any] = {"text": "k2", "options": ("-DA=2",), "arch": "sm_80", "version": (12, 8)}
    changed = dict(base, **{change: other[change]})
    keys = [kcache.kernel_key(d["text"], d["options"], d["arch"], d["version"]) for d in (base, changed)]
    assert keys[0] != keys[1] and all(len(k) == 64 for k in keys)
    assert kcache.kernel_key(base["text"], base["options"], base["arch"], base["version"]) == keys[0]


# -- the cache ------------------------------------------------------------------------------------------------


def test_a_second_compile_of_the_same_space_compiles_nothing_and_serves_every_config(tmp_path: Path) -> None:
    cache = kcache.DirectoryCache(tmp_path / "kernels")
    jobs = stage.jobs_for([small_set([16, 32], [4, 8])], ARCH)
    first = stage.compile_all(jobs, cache, processes=2)
    assert (first.configs, first.compiled, first.cached, first.failed) == (4, 4, 0, 0)
    again = stage.compile_all(jobs, cache, processes=2)
    assert (again.configs, again.compiled, again.cached) == (4, 0, 4)
    assert again.verdicts == first.verdicts
    assert set(again.to_json()) == {"configs", "compiled", "cached", "infeasible", "failed", "seconds"}
    for job in jobs:
        stored = cache.get(job.key)
        assert stored is not None and stored.status == "compiled"
        assert set(cubin.kernels(stored.cubin)) == set(job.entries)


def test_the_compile_pool_is_kept_between_stages_and_replaced_when_its_processes_died(tmp_path: Path) -> None:
    import os
    import signal

    jobs = stage.jobs_for([small_set([16, 32], [4])], ARCH)
    stage.compile_all(jobs, kcache.DirectoryCache(tmp_path / "a"), processes=2)
    pool = stage._pool(2)
    assert stage.compile_all(jobs, kcache.DirectoryCache(tmp_path / "b"), processes=2).compiled == 2
    assert stage._pool(2) is pool  # started once, kept
    for pid in list(pool._processes):  # a compile process killed (OOM, a crash in NVRTC): the pool is broken
        os.kill(pid, signal.SIGKILL)
    again = stage.compile_all(jobs, kcache.DirectoryCache(tmp_path / "c"), processes=2)
    assert (again.compiled, again.failed) == (2, 0) and stage._pool(2) is not pool


def test_a_directory_cache_entry_is_json_plus_cubin_and_a_corrupt_entry_names_its_file(tmp_path: Path) -> None:
    cache = kcache.DirectoryCache(tmp_path)
    entry = stage.compile_job(gemm_job(16, 2))
    cache.put(entry)
    meta_path = tmp_path / entry.key[:2] / f"{entry.key}.json"
    meta = json.loads(meta_path.read_text())
    assert meta["status"] == "compiled" and meta["cubin_bytes"] == len(entry.cubin)
    assert not list(tmp_path.rglob("*.tmp"))
    assert cache.get(entry.key) == entry
    meta_path.write_text('{"schema": 1, "status": "maybe"}')
    with pytest.raises(ConfigError, match=f"{meta_path}.*status"):
        cache.get(entry.key)


def test_a_redis_kernel_cache_stores_verdicts_and_cubins_for_the_fleet(redis_srv: Any, redis_db: Any) -> None:
    cache = kcache.open_cache(redis_url=redis_srv.url(1))
    jobs = stage.jobs_for([small_set([16, 128], [8, 16])], ARCH)  # 16x8, 16x16, 128x16 (static shared too big)
    first = stage.compile_all(jobs, cache, processes=1)
    assert (first.configs, first.compiled, first.infeasible) == (3, 3, 1)
    assert list(first.rejected()) == ["matmul_small gemm[tile=128,coarsen=16]"]
    assert list(first.rejected_configs("matmul_small")) == ["gemm[tile=128,coarsen=16]"]
    assert first.rejected_configs("matmul") == {}
    assert len(redis_db.keys(kcache.REDIS_PREFIX + "*")) == 3
    second = stage.compile_all(jobs, kcache.open_cache(redis_url=redis_srv.url(1)), processes=1)
    assert (second.compiled, second.cached, second.infeasible) == (0, 3, 1)


def test_the_trial_path_loads_the_cached_cubin_and_refuses_a_pruned_config(tmp_path: Path) -> None:
    cache = kcache.DirectoryCache(tmp_path)
    space = matmul.gemm_space()
    fits, pruned = space.variant({"tile": 16, "coarsen": 4}), space.variant({"tile": 128, "coarsen": 16})
    stage.compile_all(stage.jobs_for([small_set([16, 128], [4, 16])], ARCH), cache)
    loaded = stage.load_cubin(fits, ARCH, cache)
    assert loaded.key == stage.program_job(fits, ARCH).key and loaded.cubin
    with pytest.raises(TuneFailure, match="uses too much shared data") as refused:
        stage.load_cubin(pruned, ARCH, cache)
    assert refused.value.kind == FailureKind.REJECTED


def test_a_cache_miss_on_the_trial_path_compiles_once_and_stores(tmp_path: Path) -> None:
    cache = kcache.DirectoryCache(tmp_path)
    program = matmul.gemm_space().variant({"tile": 8, "coarsen": 2})
    first = stage.load_cubin(program, ARCH, cache)
    assert cache.get(first.key) == first
    assert stage.load_cubin(program, ARCH, cache) == first


# -- farm compile ---------------------------------------------------------------------------------------------


def test_farm_compile_prints_the_summary_as_json_and_a_second_run_compiles_nothing(tmp_path: Path) -> None:
    catalog = tmp_path / "c.toml"
    catalog.write_text('[[problems]]\noperation = "matmul"\ndevices = ["cuda"]\n'
                       'workloads = [{ m = 64, n = 64, k = 64, dtype = "float32" }]\n')
    args = ["compile", str(catalog), "--arch", ARCH, "--cache-dir", str(tmp_path / "k"), "--json", "--processes", "2"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    counts = json.loads(first.output)
    assert list(counts) == ["configs", "compiled", "cached", "infeasible", "failed", "seconds"]
    space = matmul.cuda_tunable().spaces[0]
    assert counts["configs"] == len(list(space.feasible_ranks())) == counts["compiled"]
    assert (counts["cached"], counts["infeasible"], counts["failed"]) == (0, 1, 0)
    second = json.loads(CliRunner().invoke(main, args).output)
    assert (second["compiled"], second["cached"], second["infeasible"]) == (0, counts["configs"], 1)
    # Another site: the exported kernels fill its empty cache, and its compile compiles nothing.
    exported = CliRunner().invoke(main, [*args, "--export", str(tmp_path / "kernels.parquet")])
    assert exported.exit_code == 0, exported.output
    site = kcache.DirectoryCache(tmp_path / "site")
    assert karchive.import_kernels(tmp_path / "kernels.parquet", site) == counts["configs"]
    there = stage.ensure_compiled([matmul.cuda_tunable()], ARCH, site)
    assert (there.compiled, there.cached, there.infeasible) == (0, counts["configs"], 1)


def test_a_kernel_archive_with_a_bad_row_stores_nothing_and_names_the_row(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    cache = kcache.DirectoryCache(tmp_path / "a")
    entries = [stage.compile_job(gemm_job(16, c)) for c in (2, 4)]
    for entry in entries:
        cache.put(entry)
    path = tmp_path / "k.parquet"
    assert karchive.export_kernels(cache, [e.key for e in entries], path) == 2
    table = pq.read_table(path)
    statuses = table.column("status").to_pylist()
    statuses[1] = "maybe"
    pq.write_table(table.set_column(1, "status", [statuses]).replace_schema_metadata(table.schema.metadata), path)
    empty = kcache.DirectoryCache(tmp_path / "b")
    with pytest.raises(ConfigError, match="row 1.*status"):
        karchive.import_kernels(path, empty)
    assert empty.get(entries[0].key) is None


def test_farm_compile_refuses_an_architecture_nvrtc_cannot_target(tmp_path: Path) -> None:
    catalog = tmp_path / "c.toml"
    catalog.write_text('[[problems]]\noperation = "matmul"\ndevices = ["cuda"]\nworkloads = [{ m = 8, n = 8, k = 8, dtype = "float32" }]\n')
    done = CliRunner().invoke(main, ["compile", str(catalog), "--arch", "sm_1", "--cache-dir", str(tmp_path)])
    assert done.exit_code == 2
    assert "sm_1" in done.output and "sm_90" in done.output


# -- on a device ----------------------------------------------------------------------------------------------


GPU_SPECS = {"matmul": dict(m=100, n=90, k=70), "transpose": dict(rows=100, cols=70), "softmax": dict(rows=100, cols=70),
             "reduce_sum": dict(rows=100, cols=70, axis=1)}


@pytest.mark.gpu
@pytest.mark.parametrize("operation", sorted(GPU_SPECS))
def test_on_the_device_each_space_config_runs_the_cached_cubin_and_matches_the_reference(operation: str, tmp_path: Path) -> None:
    import cupy

    from farm_kernels import registry

    arch = f"sm_{cupy.cuda.Device().compute_capability}"
    cache = kcache.DirectoryCache(tmp_path)
    op = registry.get(operation)
    ts = op.cuda
    summary = stage.ensure_compiled([ts], arch, cache)
    (space,) = ts.spaces
    ks = kernel_space_of(space.fn)
    assert ks is not None
    inputs = tuple(op.make(op.normalize(dict(GPU_SPECS[operation], dtype="float32"), devices="cuda"), cupy,
                           np.random.default_rng(0)))
    expected = ts[ts.stack_reference()].fn(*inputs)
    stage.use_kernel_cache(cache)
    try:
        ran = 0
        for rank in space.feasible_ranks():
            config = space.config(rank)
            if summary.verdicts[f"{ts.name} {space.config_name(config)}"][0] != "compiled":
                continue
            out = space.fn(*inputs, **config)
            assert cupy.allclose(out, expected, atol=1e-3, rtol=1e-3), config
            variant = ks.variant(config)
            assert variant.cubin_keys[cupy.cuda.Device().id] == stage.program_job(variant, arch).key
            ran += 1
        assert ran == summary.configs - summary.infeasible - summary.failed > 0
    finally:
        stage.use_kernel_cache(None)

def test_the_cubin_file_cupy_loads_is_the_directory_caches_own_or_a_copy_for_redis(
        tmp_path: Path, redis_srv: Any, redis_db: Any) -> None:
    program = matmul.gemm_space().variant({"tile": 16, "coarsen": 8})
    directory = kcache.DirectoryCache(tmp_path)
    entry = stage.load_cubin(program, ARCH, directory)
    assert stage.cubin_file(entry, directory) == directory.cubin_path(entry.key)
    fleet = kcache.open_cache(redis_url=redis_srv.url(1))
    from_redis = stage.load_cubin(program, ARCH, fleet)
    copy = stage.cubin_file(from_redis, fleet)
    assert copy.read_bytes() == entry.cubin and entry.key in copy.name


def test_space_variants_load_through_the_kernel_cache_that_farm_kernel_cache_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FARM_KERNEL_CACHE", raising=False)
    assert stage.kernel_cache() is None  # CuPy compiles the source itself, as before
    monkeypatch.setenv("FARM_KERNEL_CACHE", str(tmp_path))
    found = stage.kernel_cache()
    assert isinstance(found, kcache.DirectoryCache) and found.root == tmp_path
    explicit = kcache.DirectoryCache(tmp_path / "other")
    stage.use_kernel_cache(explicit)
    try:
        assert stage.kernel_cache() is explicit
    finally:
        stage.use_kernel_cache(None)
    assert matmul.gemm_space().variant({"tile": 16, "coarsen": 4}).loader is stage.load_module
    assert matmul.PROGRAM.loader is None  # the fixed candidates compile through CuPy


def test_a_variant_loads_the_cached_cubin_by_path_and_records_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy's side stood in for (the real load runs under -m gpu): what load_module hands RawModule."""
    loaded: list[dict[str, Any]] = []
    device = SimpleNamespace(id=0, compute_capability="90")
    cupy = SimpleNamespace(RawModule=lambda **kw: loaded.append(kw) or "module",
                           cuda=SimpleNamespace(Device=lambda: device))
    cache = kcache.DirectoryCache(tmp_path)
    monkeypatch.setenv("FARM_KERNEL_CACHE", str(tmp_path))
    program = matmul.gemm_space().variant({"tile": 16, "coarsen": 4})
    assert stage.load_module(program, cupy) == "module"
    key = stage.program_job(program, ARCH).key
    assert loaded == [{"path": str(cache.cubin_path(key))}] and program.cubin_keys == {0: key}
    pruned = matmul.gemm_space().variant({"tile": 128, "coarsen": 16})
    with pytest.raises(TuneFailure, match="uses too much shared data"):
        stage.load_module(pruned, cupy)
    assert len(loaded) == 1
