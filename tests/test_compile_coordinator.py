"""The coordinator compiles a run's CUDA spaces before it sends their trials (farm_coordinator.precompile), without a
GPU: NVRTC (the nvidia-cuda-nvrtc-cu12 wheel) compiles every config of matmul's ``gemm`` space into a kernel cache,
a second run compiles nothing, the configs the stage rejects become REJECTED verdicts naming why and are never
planned or asked, a target without an architecture gets a note; ``farm tune --arch`` refuses a bad architecture;
a GPU worker's default kernel cache is a pure choice."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from nvrtc_support import skip_without_nvrtc

from farm.policy import StackPolicy
from farm.trials import Outcome, TrialVerdict
from farm_cli import main
from farm_coordinator import precompile
from farm_coordinator.catalog import Catalog, load_catalog
from farm_coordinator.plan import Target, expand
from farm_coordinator.spacestrategy import SpaceSearch, parse_group
from farm_fleet.protocol import GroupResult
from farm_kernels import matmul
from farm_kernels.cuda import kcache
from farm_kernels.cuda.compile import CompileJob, CompileSummary
from farm_workers.worker import kernel_cache_location

ARCH = "sm_90"
H200 = "NVIDIA H200; sm_90; 132 SMs; 150754820096 bytes; 1980000 kHz; compute mode default; mig off; cuda driver 12080"
PRUNED = "gemm[tile=128,coarsen=16]"  # its static shared memory exceeds every architecture's: ptxas refuses it
CATALOG = ('[[problems]]\noperation = "matmul"\ndevices = ["cuda"]\n'
           'workloads = [{ m = 64, n = 64, k = 64, dtype = "float32" }]\n')


def catalog_at(path: Path, policy: str = "") -> Catalog:
    path.write_text(f"[policy]\n{policy}\n{CATALOG}")
    return load_catalog(path, ())


def gpu(digest: str = "a" * 16, fingerprint: str = H200) -> Target:
    return Target(digest, fingerprint, "cuda", ("w0",))


class Counting:
    """A compiler that records each call's job count (around the real local one)."""

    def __init__(self, inner: precompile.Compiler) -> None:
        self.inner = inner
        self.calls: list[int] = []

    def __call__(self, jobs: Sequence[CompileJob]) -> CompileSummary:
        self.calls.append(len(jobs))
        return self.inner(jobs)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, precompile.Precompiled, precompile.Precompiled]:
    """The matmul catalog's compile stage run twice into one directory cache (the first compiles, the second not)."""
    skip_without_nvrtc()
    root = tmp_path_factory.mktemp("precompile")
    cache = kcache.DirectoryCache(root / "kernels")
    catalog = catalog_at(root / "c.toml")
    first = precompile.precompile(catalog, [gpu()], precompile.local_compiler(cache, 2), cache_name="dir")
    second = precompile.precompile(catalog, [gpu()], precompile.local_compiler(cache, 2))
    return root, first, second


def feasible_configs() -> list[str]:
    space = matmul.cuda_tunable().spaces[0]
    return [space.config_name(space.config(r)) for r in space.feasible_ranks()]


# -- the architecture -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fingerprint", "arch"), [
    (H200, "sm_90"),
    ("NVIDIA A100-SXM4-80GB; sm_80; 108 SMs; 1 bytes; ? kHz; compute mode default; mig 1g.10gb", "sm_80"),
    ("sm_120; nothing else", "sm_120"),
    ("host x86_64; 2 cpus; blas 1 threads", None),
    ("NVIDIA H200; sm_90a-like text; 132 SMs", None),
])
def test_the_architecture_is_read_from_a_cuda_fingerprint(fingerprint: str, arch: str | None) -> None:
    assert precompile.arch_of(fingerprint) == arch


def test_without_an_architecture_no_compile_stage_runs_and_a_note_says_so(tmp_path: Path) -> None:
    def never(jobs: Sequence[CompileJob]) -> CompileSummary:
        raise AssertionError("nothing should be compiled")

    done = precompile.precompile(catalog_at(tmp_path / "c.toml"), [gpu(fingerprint="NVIDIA H200; 132 SMs")], never)
    assert done.rejected == {} and done.summaries == {}
    (note,) = done.notes
    assert "a" * 16 in note and "--arch" in note and "not compiled ahead" in note


def test_a_run_without_cuda_targets_or_cuda_spaces_compiles_nothing(tmp_path: Path) -> None:
    def never(jobs: Sequence[CompileJob]) -> CompileSummary:
        raise AssertionError("nothing should be compiled")

    catalog = catalog_at(tmp_path / "c.toml")
    assert precompile.precompile(catalog, [Target("h" * 16, "host", "cpu")], never) == precompile.Precompiled()
    host_only = tmp_path / "h.toml"
    host_only.write_text('[[problems]]\noperation = "matmul"\ndevices = ["cpu"]\n'
                         'workloads = [{ m = 8, n = 8, k = 8, dtype = "float32" }]\n')
    assert precompile.compilable_sets(load_catalog(host_only, ())) == {}
    assert list(precompile.compilable_sets(catalog)) == ["matmul"]


# -- the stage ------------------------------------------------------------------------------------------------


def test_every_config_is_compiled_into_the_cache_and_a_second_run_compiles_nothing(compiled: Any) -> None:
    root, first, second = compiled
    configs = len(feasible_configs())
    summary = first.summaries[ARCH]
    assert (summary.configs, summary.compiled, summary.cached, summary.infeasible) == (configs, configs, 0, 1)
    again = second.summaries[ARCH]
    assert (again.configs, again.compiled, again.cached) == (configs, 0, configs)
    cache = kcache.DirectoryCache(root / "kernels")
    assert all(cache.get(key) is not None for key in summary.keys)
    assert any(f"{configs} configs, {configs} compiled" in note and "(kernel cache dir)" in note for note in first.notes)


def test_a_rejected_config_is_a_verdict_naming_why_and_is_never_planned(compiled: Any, tmp_path: Path) -> None:
    _, first, second = compiled
    rejected = first.for_target("a" * 16, "matmul")
    assert list(rejected) == [PRUNED] and rejected[PRUNED].startswith("infeasible: ")
    assert "uses too much shared data" in rejected[PRUNED] and "\x00" not in rejected[PRUNED]
    assert second.rejected == first.rejected  # a cached verdict rejects as the fresh one did
    (problem,) = expand(catalog_at(tmp_path / "c.toml"), [gpu()], "run", rejected=first.rejected)
    sent = {name for task in problem.tasks for name, _ in task.candidates}
    assert PRUNED not in sent and set(feasible_configs()) - {PRUNED} <= sent
    (verdict,) = [o for o in problem.skipped if o.name == PRUNED]
    assert verdict.verdict is TrialVerdict.REJECTED and verdict.note == rejected[PRUNED]
    assert verdict.failure == f"rejected: {rejected[PRUNED]}"  # the decision's note for the candidate
    # Another target (another architecture's verdicts, or none) plans every config.
    (other,) = expand(catalog_at(tmp_path / "c.toml"), [gpu("b" * 16)], "run", rejected=first.rejected)
    assert PRUNED in {name for task in other.tasks for name, _ in task.candidates}


def test_a_space_search_never_asks_a_rejected_config(compiled: Any, tmp_path: Path) -> None:
    _, first, _ = compiled
    catalog = catalog_at(tmp_path / "c.toml", "max_configs = 100")
    (problem,) = expand(catalog, [gpu()], "run", rejected=first.rejected)
    assert all(parse_group(t.group) is None for t in problem.tasks)  # the space is the strategy's, not the plan's
    assert [o.name for o in problem.skipped if o.verdict is TrialVerdict.REJECTED] == [PRUNED]
    roster = matmul.cuda_tunable().roster()
    search = SpaceSearch(StackPolicy(max_configs=100), lambda op, kind: roster)
    told = {t.group: GroupResult("run", problem.problem_id, t.group, "ok") for t in problem.tasks}
    asked = {a.candidates[0][0] for a in search.propose(problem, told, frozenset(), 100)}
    assert asked == set(feasible_configs()) - {PRUNED}


def test_an_explicit_architecture_nvrtc_cannot_target_is_an_error_not_a_note(tmp_path: Path) -> None:
    skip_without_nvrtc()
    from farm.errors import ConfigError

    with pytest.raises(ConfigError, match="sm_1"):
        precompile.precompile(catalog_at(tmp_path / "c.toml"), [gpu()], precompile.local_compiler(
            kcache.DirectoryCache(tmp_path), 1), arch="sm_1")
    done = precompile.precompile(catalog_at(tmp_path / "c.toml"), [gpu(fingerprint="X; sm_1; 1 SMs")],
                                 precompile.local_compiler(kcache.DirectoryCache(tmp_path), 1))
    (note,) = done.notes
    assert note.startswith("sm_1 (fingerprint ") and "not compiled ahead" in note and done.rejected == {}


def test_the_fleet_compiler_uses_the_compile_queue_only_when_compile_workers_answer(tmp_path: Path) -> None:
    skip_without_nvrtc()
    from farm_fleet.settings import Settings

    cache = kcache.DirectoryCache(tmp_path)
    settings = Settings.from_env(broker_url="redis://127.0.0.1:1/0", redis_url="redis://127.0.0.1:1/1")
    local = Counting(precompile.fleet_compiler(settings, cache, 1, online=lambda: False))
    done = precompile.precompile(catalog_at(tmp_path / "c.toml"), [gpu()], local)
    assert local.calls == [len(feasible_configs())]
    assert done.summaries[ARCH].compiled == len(feasible_configs())  # no compile worker: compiled here


# -- farm tune --arch ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("arch", "says"), [("sm_1", "sm_90"), ("90", "must be a real architecture")])
def test_farm_tune_refuses_a_bad_architecture_before_anything_runs(arch: str, says: str, tmp_path: Path) -> None:
    skip_without_nvrtc()
    catalog = tmp_path / "c.toml"
    catalog.write_text(CATALOG)
    done = CliRunner().invoke(main, ["tune", str(catalog), "--arch", arch, "--cache-dir", str(tmp_path / "d")])
    assert done.exit_code == 2, done.output
    assert arch in done.output and says in done.output and "--arch" in done.output
    assert not (tmp_path / "d").exists()


# -- the GPU worker's kernel cache -----------------------------------------------------------------------------


@pytest.mark.parametrize(("device_kind", "redis_url", "env", "expected"), [
    ("cpu", "redis://r:6379/1", {}, None),  # a host worker loads no cubin
    ("cpu", None, {"FARM_KERNEL_CACHE": "/k"}, None),
    ("cuda", "redis://r:6379/1", {}, "redis://r:6379/1"),  # the fleet's kernel cache
    ("cuda", "redis://r:6379/1", {"FARM_KERNEL_CACHE": "/k"}, "/k"),  # configured explicitly
    ("cuda", "redis://r:6379/1", {"FARM_KERNEL_CACHE": "redis://other/2"}, "redis://other/2"),
    ("cuda", None, {"FARM_KERNEL_CACHE": ""}, "DEFAULT"),  # no fleet Redis: the local default directory
    ("cuda", None, {}, "DEFAULT"),
])
def test_a_gpu_worker_loads_from_the_fleet_kernel_cache_unless_one_is_configured(
        device_kind: str, redis_url: str | None, env: dict[str, str], expected: str | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FARM_KERNEL_CACHE", raising=False)
    default = kcache.default_location()
    assert kernel_cache_location(device_kind, redis_url, env) == (default if expected == "DEFAULT" else expected)


def test_a_redis_kernel_cache_describes_itself_without_its_password() -> None:
    assert kcache.RedisCache("redis://:s3cret@r:6379/1").describe() == "redis://:***@r:6379/1"
    assert kcache.RedisCache("redis://r:6379/1").describe() == "redis://r:6379/1"


# -- the run ----------------------------------------------------------------------------------------------------


class OneGpuFleet:
    """A fleet of one CUDA fingerprint (the run's Fleet port), no device behind it."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def targets(self) -> list[Target]:
        return [self.target]

    def queue(self, target: Target) -> str:
        return "q"

    def confirmer(self, target: Target, exclude: str | None) -> None:
        return None

    def alive(self, worker_id: str, incarnation: str = "") -> bool:
        return True


def test_a_run_compiles_before_it_sends_and_never_sends_a_rejected_config(compiled: Any, tmp_path: Path) -> None:
    from rich.console import Console

    from farm.stores.local import FARM, LocalStore
    from farm_coordinator.aggregate import trial_rows
    from farm_coordinator.dispatch import LocalDispatcher
    from farm_coordinator.ports import Parts
    from farm_coordinator.run import tune
    from farm_coordinator.runview import ConsoleObserver
    from farm_fleet.protocol import GroupTask
    from farm_fleet.settings import Settings
    from farm_kernels import registry

    root, first, _ = compiled
    sent: list[GroupTask] = []
    ts = registry.get("matmul").tunable("cuda")
    names = tuple(ts[i].candidate().name for i in ts.search_order())  # the cache key's candidate list

    def execute(task: GroupTask, queue: str) -> GroupResult:
        """What a GPU worker would answer, without a GPU: every candidate of the group erred."""
        sent.append(task)
        outcomes = tuple(Outcome(names.index(n), n, verdict=TrialVerdict.REJECTED, note="no CUDA device here",
                                 revision=r) for n, r in task.candidates)
        return GroupResult(task.run, task.problem_id, task.group, "ok", cache_key="k" * 64, reference_index=0,
                           names=names, reference_times=(1.0,) * 5, outcomes=outcomes)

    compiler = Counting(precompile.local_compiler(kcache.DirectoryCache(root / "kernels"), 1))
    console = Console(file=(tmp_path / "log.txt").open("w"), width=300)
    parts = Parts(OneGpuFleet(gpu()), LocalDispatcher(execute), LocalStore(tmp_path / "d", owner=FARM),
                  precompile=precompile.stage(compiler), observer=ConsoleObserver(console))
    summary = tune(catalog_at(tmp_path / "c.toml"), parts, Settings())
    console.file.close()
    assert compiler.calls == [len(feasible_configs())]  # once, before the first group
    asked = {name for task in sent for name, _ in task.candidates}
    assert PRUNED not in asked and set(feasible_configs()) - {PRUNED} <= asked
    assert "compiled the CUDA spaces for sm_90 before sending" in (tmp_path / "log.txt").read_text()
    # The decision names the pruned config with the stage's verdict.
    (agg,) = summary.aggregates
    assert agg.record is not None and summary.published == 1
    notes = {c["name"]: c["note"] for c in agg.record.meta["candidates"]}
    assert notes[PRUNED] == f"rejected: {first.for_target('a' * 16, 'matmul')[PRUNED]}"
    (row,) = [r for r in trial_rows(agg) if r["candidate"] == PRUNED]  # with the trials, though never sent
    assert (row["group"], row["verdict"], row["note"], row["pair"]) == ("compile", "rejected", notes[PRUNED], None)


def test_a_compile_errors_verdict_is_kept_as_one_line_with_nvrtcs_first_error() -> None:
    skip_without_nvrtc()
    from farm_kernels.cuda import CudaProgram
    from farm_kernels.cuda import compile as stage

    broken = CudaProgram("broken.cu", text='extern "C" __global__ void k_f32() {\n  undefined_symbol();\n}\n')
    entry = stage.compile_job(stage.program_job(broken, ARCH, "broken", ("k_f32",)))
    line = precompile.one_line(entry.reason)
    assert "\n" not in line and line.startswith("failed: broken.cu (sm_90")
    assert "NVRTC_ERROR_COMPILATION" in line and "undefined_symbol" in line and "error" in line
    resource = "infeasible: k_f32: 96 registers x 1024 threads = 98304 > 65536 per block"
    assert precompile.one_line(resource) == resource
