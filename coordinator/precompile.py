"""Compile before send: a run's CUDA spaces compiled for their targets' architecture before any of their groups goes.

Before a run plans its problems, :func:`precompile` runs the compile stage (``farm_kernels.cuda.compile``) over the
CUDA spaces of the catalog's operations for every CUDA target: the architecture is the run's explicit one
(``farm tune --arch sm_90``), else the one the target's fingerprint names (a CUDA fingerprint reads
``<model>; sm_90; ...``); a target with neither gets no compile stage and a one-line note saying so. What compiles
is the :data:`Compiler`'s affair (the composition root picks one): the fleet's ``compile`` queue when
``farm worker --compile`` workers serve it (:func:`fleet_compiler`), else a process pool here
(:func:`local_compiler`), both storing into the fleet's kernel cache, so a second run compiles nothing.

The configs the stage rejects (infeasible by resources, compile errors) are never sent to a GPU worker: the
planner turns each into an Outcome REJECTED whose note is the stage's verdict (``infeasible: gemm_space_f32: 96
registers x 1024 threads = 98304 > 65536 per block``, ``failed: FILE (sm_90, options ...): NVRTC_ERROR_COMPILATION:
FILE(2): error: ...``, one line), planned out of its
group like a banned candidate (``farm_coordinator.plan``) and left out of a space search's asks
(``farm_coordinator.spacestrategy``); the decision's candidate list carries it as ``rejected: infeasible: ...``.

A replay target (``farm worker --device replay:PATH``) has its recorded problems compiled here too, from the
recording (:func:`replay_stage`): the recorded compile time of its configs is charged to this stage
(``Precompiled.compile_seconds``, and the stage's note), never to a device, and each recorded compile failure
(``CompilationFailedConfig``) is rejected before sending, as NVRTC's failures are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from farm_coordinator.catalog import Catalog
from farm_coordinator.plan import Target

if TYPE_CHECKING:  # the compile stage is imported where it runs (NVRTC loads lazily)
    from farm.tunable import TunableSet
    from farm_fleet.settings import Settings
    from farm_kernels.cuda.compile import CompileJob, CompileSummary
    from farm_kernels.cuda.kcache import KernelCache

CUDA = "cuda"
_ARCH = re.compile(r"(?:^|;\s*)(sm_\d+)\s*(?:;|$)")

Compiler = Callable[[Sequence["CompileJob"]], "CompileSummary"]
"""Compiles a run's jobs (or serves them from the kernel cache) and returns the stage's summary."""

Precompiler = Callable[[Catalog, list[Target]], "Precompiled"]
"""What a run calls before it plans (``Parts.precompile`` of ``farm_coordinator.run.tune``): :func:`precompile` bound to
the run's compiler and architecture (:func:`stage`)."""


def arch_of(fingerprint: str) -> str | None:
    """The architecture a CUDA fingerprint names (``NVIDIA H100; sm_90; 132 SMs; ...`` -> ``sm_90``), or None."""
    found = _ARCH.search(fingerprint)
    return found.group(1) if found else None


def one_line(reason: str) -> str:
    """A verdict as one line, the note a decision keeps: a resource verdict as it is; a compile error's first line
    (``failed: FILE (ARCH, options ...): NVRTC_ERROR_COMPILATION``) and the first error line of NVRTC's log."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else reason
    detail = next((line for line in lines[1:] if "error" in line.lower()), lines[1])
    return f"{lines[0]}: {detail}"


@dataclass
class Precompiled:
    """What the compile stage of a run found: ``rejected`` (fingerprint digest -> operation -> candidate name ->
    its verdict, one line), the summary of each architecture compiled, and the notes to print (one line each)."""

    rejected: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    summaries: dict[str, CompileSummary] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    compile_seconds: dict[str, float] = field(default_factory=dict)
    """Replay targets: fingerprint digest -> the recorded compile seconds this stage charged (:func:`replay_stage`)."""
    charged: dict[str, dict[str, float]] = field(default_factory=dict)
    """The part of ``compile_seconds`` each problem owes: fingerprint digest -> operation -> seconds (a recorded
    problem is its recording's one workload, so the pair names one problem)."""

    def for_target(self, digest: str, operation: str) -> Mapping[str, str]:
        """The rejected configs of ``operation`` on the target ``digest`` (name -> verdict), empty when none."""
        return self.rejected.get(digest, {}).get(operation, {})

    def charged_to(self, digest: str, operation: str) -> float:
        """The compile seconds this stage charged to the problem of ``operation`` on ``digest``: 0 when its time
        cannot be told per problem (the CUDA stage compiles every operation of an architecture at once)."""
        return self.charged.get(digest, {}).get(operation, 0.0)

    @property
    def seconds(self) -> float:
        """Every compile second this stage charged: the replay targets' recorded time and each architecture's NVRTC
        time (its fresh compiles; a kernel served from the cache costs none)."""
        return sum(self.compile_seconds.values()) + sum(s.compile_seconds for s in self.summaries.values())


def compilable_sets(catalog: Catalog) -> dict[str, TunableSet]:
    """Operation -> its CUDA tunable set, for the catalog's operations tuned on ``cuda`` whose set has a space the
    compile stage compiles (a ``KernelSpace``)."""
    from farm_kernels import registry
    from farm_kernels.cuda.compile import compilable

    found: dict[str, TunableSet] = {}
    for workload in catalog.workloads:
        if CUDA not in workload.devices or workload.operation in found:
            continue
        ts = registry.get(workload.operation).cuda
        if ts is not None and any(compilable(space.fn) is not None for space in ts.spaces):
            found[workload.operation] = ts
    return found


def precompile(catalog: Catalog, targets: Iterable[Target], compiler: Compiler, arch: str | None = None,
               cache_name: str = "") -> Precompiled:
    """The compile stage of ``catalog``'s CUDA spaces for each CUDA target (``arch``, else its fingerprint's),
    before any group is sent; see the module docstring. ConfigError for an ``arch`` NVRTC cannot target."""
    from farm.errors import ConfigError, NvrtcUnavailable
    from farm_kernels.cuda.compile import check_arch, jobs_for

    done = Precompiled()
    targets = list(targets)
    replay_stage(catalog, targets, done)
    cuda = [t for t in targets if t.device_kind == CUDA]
    sets = compilable_sets(catalog) if cuda else {}
    if not sets:
        return done
    by_arch: dict[str, list[Target]] = {}
    for target in cuda:
        found = arch or arch_of(target.fingerprint)
        if found is None:
            done.notes.append(f"fingerprint {target.digest}: no architecture known (give --arch sm_NN): its CUDA "
                              "spaces are not compiled ahead, each GPU worker compiles what it runs")
            continue
        by_arch.setdefault(found, []).append(target)
    for found, its_targets in sorted(by_arch.items()):
        try:
            check_arch(found)
        except (ConfigError, NvrtcUnavailable) as e:
            if arch is not None:
                raise  # the run's own --arch: an error, not a note
            done.notes.append(f"{found} (fingerprint {', '.join(t.digest for t in its_targets)}): its CUDA spaces "
                              f"are not compiled ahead: {e}")
            continue
        summary = compiler(jobs_for(sets.values(), found))
        done.summaries[found] = summary
        rejected = {op: {name: one_line(reason) for name, reason in summary.rejected_configs(ts.name).items()}
                    for op, ts in sets.items()}
        for target in its_targets:
            done.rejected[target.digest] = {op: names for op, names in rejected.items() if names}
        done.notes.append(f"compiled the CUDA spaces for {found} before sending: {summary.configs} configs, "
                          f"{summary.compiled} compiled, {summary.cached} cached, {summary.infeasible} infeasible, "
                          f"{summary.failed} failed (never sent) in {summary.seconds:.1f} s"
                          + (f" (kernel cache {cache_name})" if cache_name else ""))
    return done


def replay_stage(catalog: Catalog, targets: Iterable[Target], done: Precompiled) -> None:
    """The compile stage of the catalog's recorded problems on their replay targets, into ``done``: each config's
    recorded compile time charged once, each recorded compile failure rejected (never sent)."""
    from farm_kernels import recorded

    for target in targets:
        if target.device_kind != recorded.KIND:
            continue
        for workload in catalog.workloads:
            recording = recorded.get(workload.operation) if workload.fingerprint == target.digest else None
            if recording is None:
                continue
            failed = {recording.name_of(dict(zip(recording.names, key, strict=True))):
                      "failed: compile failed as recorded (CompilationFailedConfig)"
                      for key, config in recording.configs.items() if config.failure == "compile"}
            seconds = sum(config.compile_seconds for config in recording.configs.values())
            if failed:
                done.rejected.setdefault(target.digest, {})[workload.operation] = failed
            done.compile_seconds[target.digest] = done.compile_seconds.get(target.digest, 0.0) + seconds
            problem = done.charged.setdefault(target.digest, {})
            problem[workload.operation] = problem.get(workload.operation, 0.0) + seconds
            done.notes.append(f"compiled {recording.path.name} (fingerprint {target.digest}) before sending, as "
                              f"recorded: {len(recording.configs)} configs in {seconds:.1f} s of recorded compile "
                              f"time, charged to the compile stage; {len(failed)} failed (never sent)")


def stage(compiler: Compiler, arch: str | None = None, cache_name: str = "") -> Precompiler:
    """The run's compile stage: :func:`precompile` with ``compiler`` and ``arch`` (None: each fingerprint's)."""
    return lambda catalog, targets: precompile(catalog, targets, compiler, arch, cache_name)


def local_compiler(cache: KernelCache, processes: int) -> Compiler:
    """Compile in a process pool of ``processes`` here, storing into ``cache``."""
    from farm_kernels.cuda.compile import compile_all

    return lambda jobs: compile_all(jobs, cache, processes)


def fleet_compiler(settings: Settings, cache: KernelCache, processes: int, timeout: float = 600.0,
                   online: Callable[[], bool] | None = None) -> Compiler:
    """On the fleet's ``compile`` queue when ``farm worker --compile`` workers answer (``online``, default: a
    Celery ping of them), else in a process pool here; either way into ``cache`` (the fleet's Redis)."""
    def run(jobs: Sequence[CompileJob]) -> CompileSummary:
        from farm_coordinator.compilefleet import compile_on_fleet, compile_workers

        serving = online() if online is not None else bool(compile_workers(settings))
        if serving:
            return compile_on_fleet(jobs, settings, timeout, cache)
        return local_compiler(cache, processes)(jobs)

    return run
