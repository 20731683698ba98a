"""The compile stage: every feasible config of a set's CUDA spaces compiled with NVRTC on CPU cores, pruned by
the resources its cubin declares, and stored in the kernel cache before any GPU trial.

- :func:`jobs_for` lists a :class:`CompileJob` per feasible config (restrictions applied) of every space whose
  function launches a :class:`~farm_kernels.cuda.spaces.KernelSpace`, for one architecture;
- :func:`compile_job` compiles one (no GPU, no CuPy) and returns its :class:`~farm_kernels.cuda.kcache.KernelEntry`:
  ``compiled``; ``infeasible`` when a kernel's registers, shared memory (static + the launch's dynamic) or
  ``__launch_bounds__`` exceed the architecture's limits for the launch the config gets (the reason names them:
  ``infeasible: gemm_space_f32: 96 registers x 1024 threads = 98304 > 65536 per block``); ``failed`` with NVRTC's
  log for a compile error, never an exception;
- :func:`compile_all` serves what the cache has and compiles the rest in a process pool, storing each entry;
  :class:`CompileSummary` is what ``farm compile --json`` prints. A second run of the same jobs compiles nothing.

:func:`load_cubin` is the GPU worker's path: the cubin from the cache (compiled once and stored on a miss);
an entry the compile stage judged infeasible or failed is REJECTED there and never launched.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from farm.atomicfile import write_atomic
from farm.errors import ConfigError, NvrtcError, TuneFailure
from farm.tunable import TunableSet
from farm_kernels.cuda import CudaProgram, cubin, nvrtc
from farm_kernels.cuda.kcache import (
    CACHE_ENV,
    DirectoryCache,
    KernelCache,
    KernelEntry,
    kernel_key,
    open_cache,
)

VERBOSE = ("--ptxas-options=-v",)  # only adds ptxas' report to the log; not part of the key
MAX_LOCAL = 512 * 1024  # local memory (stack frame) per thread, every architecture since sm_20
ATTRIBUTE = "kernel_space"  # a space function's attribute naming what it launches (farm_kernels.cuda.spaces)


class CompilableSpace(Protocol):
    """What the compile stage needs of a kernel space (farm_kernels.cuda.spaces.KernelSpace is one)."""

    def variant(self, config: dict[str, Any]) -> CudaProgram: ...

    def launch(self, config: dict[str, Any]) -> Any: ...  # .block, .shared_mem

    def entry_names(self, config: dict[str, Any]) -> tuple[str, ...]: ...


def compilable(fn: Any) -> CompilableSpace | None:
    """The kernel space a space function launches (its ``kernel_space`` attribute), None for any other."""
    found = getattr(fn, ATTRIBUTE, None)
    return found if found is not None and all(hasattr(found, m) for m in ("variant", "launch", "entry_names")) else None


@dataclass(frozen=True)
class CompileJob:
    """One config's compile: what NVRTC gets, and the launch its entry points are checked against. Plain JSON
    values only (:meth:`to_json`), so a job travels to a ``compile`` Celery worker as it is."""

    key: str
    candidate: str  # the config's candidate name, e.g. gemm[tile=32,coarsen=4]
    filename: str
    text: str
    options: tuple[str, ...]
    arch: str
    entries: tuple[str, ...]
    block: tuple[int, int, int]
    shared_mem: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "candidate": self.candidate, "filename": self.filename, "text": self.text,
                "options": list(self.options), "arch": self.arch, "entries": list(self.entries),
                "block": list(self.block), "shared_mem": self.shared_mem}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompileJob:
        block = tuple(int(v) for v in data["block"])
        if len(block) != 3:
            raise ValueError(f"compile job {data.get('candidate')!r}: block {data['block']!r} needs three extents")
        return cls(str(data["key"]), str(data["candidate"]), str(data["filename"]), str(data["text"]),
                   tuple(str(o) for o in data["options"]), str(data["arch"]), tuple(str(e) for e in data["entries"]),
                   (block[0], block[1], block[2]), int(data.get("shared_mem", 0)))


def check_arch(arch: str) -> None:
    """ConfigError unless ``arch`` is ``sm_NN`` and this NVRTC can compile for it."""
    digits = arch[3:] if arch.startswith("sm_") else ""
    if not digits.isdigit():
        raise ConfigError("--arch", "arch", arch, "must be a real architecture such as sm_80 or sm_90")
    supported = nvrtc.supported_archs()
    if int(digits) not in supported:
        raise ConfigError("--arch", "arch", arch,
                          f"NVRTC {'.'.join(map(str, nvrtc.version()))} compiles for "
                          + ", ".join(f"sm_{a}" for a in supported))


def program_job(program: CudaProgram, arch: str, candidate: str = "", entries: Sequence[str] = (),
                block: tuple[int, int, int] = (1, 1, 1), shared_mem: int = 0) -> CompileJob:
    """The job compiling ``program`` exactly as CuPy would on an ``arch`` device (the key a GPU worker computes)."""
    options = nvrtc.cupy_options(program, arch)
    key = kernel_key(program.text, options, arch, nvrtc.version())
    return CompileJob(key, candidate or program.filename, program.filename, program.text, options, arch,
                      tuple(entries), block, shared_mem)


def jobs_for(sets: Iterable[TunableSet], arch: str) -> list[CompileJob]:
    """A job per feasible config of every CUDA kernel space of ``sets``, in each space's rank order."""
    jobs = []
    for ts in sets:
        for space in ts.spaces:
            ks = compilable(space.fn)
            if ks is None:
                continue
            for rank in space.feasible_ranks():
                config = space.config(rank)
                launch = ks.launch(config)
                jobs.append(program_job(ks.variant(config), arch, f"{ts.name} {space.config_name(config)}",
                                        ks.entry_names(config), launch.block, launch.shared_mem))
    return jobs


def compile_job(job: CompileJob) -> KernelEntry:
    """Compile ``job`` and judge its resources; a compile error is a ``failed`` entry with NVRTC's log."""
    start = time.perf_counter()
    try:
        done = nvrtc.compile_text(job.text, job.filename, job.arch, job.options + VERBOSE)
        found = cubin.kernels(done.cubin)
    except NvrtcError as e:
        # ptxas refuses a kernel whose static shared memory exceeds the architecture's limit: a resource verdict.
        too_big = [" ".join(line.replace("ptxas error", "").strip(" :").split())
                   for line in str(e).splitlines() if "uses too much shared data" in line]
        if too_big:
            return KernelEntry(job.key, "infeasible", "infeasible: " + "; ".join(too_big),
                               seconds=time.perf_counter() - start)
        return KernelEntry(job.key, "failed", f"failed: {e}", seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    limits = cubin.LIMITS.get(job.arch, cubin.ArchLimits(job.arch))
    spills = spill_stores(done.log)
    resources = {name: {"registers": r.registers, "shared": r.shared, "frame": r.frame, "max_threads": r.max_threads,
                        "spill_stores": spills.get(name, 0)}
                 for name, r in found.items() if not job.entries or name in job.entries}
    problems = [f"{name}: entry point missing from the cubin" for name in job.entries if name not in found]
    for name in job.entries:
        if name in found:
            problems += [f"{name}: {p}" for p in cubin.launch_problems(found[name], job.block, job.shared_mem, limits)]
            if found[name].frame > MAX_LOCAL:
                problems.append(f"{name}: {found[name].frame} bytes stack frame > {MAX_LOCAL} local memory per thread")
    if problems:
        return KernelEntry(job.key, "infeasible", "infeasible: " + "; ".join(problems), resources, seconds=seconds)
    return KernelEntry(job.key, "compiled", "", resources, done.cubin, seconds)


def spill_stores(log: str) -> dict[str, int]:
    """Entry point -> bytes of register spill stores, from ptxas' ``-v`` report in NVRTC's log (a kernel that
    spills runs, slower: recorded with its resources, not pruned)."""
    found, current = {}, None
    for line in log.splitlines():
        named = re.search(r"Function properties for (\w+)", line)
        if named:
            current = named.group(1)
            continue
        spilled = re.search(r"(\d+) bytes spill stores", line)
        if spilled and current is not None:
            found[current] = int(spilled.group(1))
            current = None
    return found


def _compile_json(data: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The process pool's task: JSON job in, (entry metadata, cubin) out."""
    entry = compile_job(CompileJob.from_json(data))
    return entry.meta(), entry.cubin


@dataclass
class CompileSummary:
    """What a compile run did. ``compiled + cached == configs``; ``infeasible`` and ``failed`` count the verdicts
    of all configs, fresh or cached. ``verdicts`` maps each candidate to its entry's status and reason."""

    configs: int = 0
    compiled: int = 0
    cached: int = 0
    infeasible: int = 0
    failed: int = 0
    seconds: float = 0.0
    compile_seconds: float = 0.0  # NVRTC time of the fresh compiles (CPU time a GPU worker no longer spends)
    verdicts: dict[str, tuple[str, str]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # the kernel cache keys of the jobs (each once)

    def to_json(self) -> dict[str, Any]:
        """``farm compile --json``: exactly configs, compiled, cached, infeasible, failed, seconds."""
        return {"configs": self.configs, "compiled": self.compiled, "cached": self.cached,
                "infeasible": self.infeasible, "failed": self.failed, "seconds": round(self.seconds, 3)}

    def rejected(self) -> dict[str, str]:
        """``"SET CONFIG"`` -> reason for every config that must not reach a GPU (infeasible or failed)."""
        return {c: reason for c, (status, reason) in self.verdicts.items() if status != "compiled"}

    def rejected_configs(self, set_name: str) -> dict[str, str]:
        """The rejected configs of the tunable set ``set_name``, by candidate name (``gemm[tile=128,coarsen=16]``,
        the names the coordinator plans), each with its verdict's reason."""
        head = f"{set_name} "
        return {c[len(head):]: reason for c, reason in self.rejected().items() if c.startswith(head)}


_POOLS: dict[int, ProcessPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(processes: int) -> ProcessPoolExecutor:
    """This process's pool of ``processes`` compile processes, started at first use and kept: starting an
    interpreter that loads NVRTC costs about as much as compiling a few configs, and a coordinator compiles before
    every run. Spawned, never forked (the caller may hold threads or sockets)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(processes)
        if pool is None:
            pool = _POOLS[processes] = ProcessPoolExecutor(max_workers=processes,
                                                           mp_context=multiprocessing.get_context("spawn"))
        return pool


def compile_all(jobs: Sequence[CompileJob], cache: KernelCache, processes: int = 1) -> CompileSummary:
    """Serve ``jobs`` from ``cache`` and compile the misses on ``processes`` cores, storing every new entry."""
    start = time.perf_counter()
    entries: dict[str, KernelEntry] = {}
    misses: dict[str, CompileJob] = {}
    for job in jobs:
        if job.key in entries or job.key in misses:
            continue
        found = cache.get(job.key)
        if found is not None:
            entries[job.key] = found
        else:
            misses[job.key] = job
    fresh: list[KernelEntry] = []
    if len(misses) == 1 or (misses and processes <= 1):
        fresh = [compile_job(job) for job in misses.values()]
    elif misses:
        sent = [job.to_json() for job in misses.values()]
        try:
            results = list(_pool(processes).map(_compile_json, sent))
        except BrokenProcessPool:  # a compile process died (killed, or NVRTC crashed it): once more, a fresh pool
            _POOLS.pop(processes, None)
            results = list(_pool(processes).map(_compile_json, sent))
        fresh = [KernelEntry.from_meta("compile worker", meta, data) for meta, data in results]
    for entry in fresh:
        cache.put(entry)
        entries[entry.key] = entry
    summary = tally(jobs, entries, set(misses))
    summary.seconds = time.perf_counter() - start
    return summary


def tally(jobs: Sequence[CompileJob], entries: dict[str, KernelEntry], fresh: set[str]) -> CompileSummary:
    """The summary of ``jobs`` given every job's entry; ``fresh`` are the keys compiled in this run (a second
    config with a key already compiled counts as cached)."""
    summary = CompileSummary(configs=len(jobs), keys=list(dict.fromkeys(job.key for job in jobs)))
    counted: set[str] = set()
    for job in jobs:
        entry = entries[job.key]
        if job.key in fresh and job.key not in counted:
            summary.compiled += 1
            summary.compile_seconds += entry.seconds
            counted.add(job.key)
        else:
            summary.cached += 1
        summary.infeasible += entry.status == "infeasible"
        summary.failed += entry.status == "failed"
        summary.verdicts[job.candidate] = (entry.status, entry.reason)
    return summary


def ensure_compiled(sets: Iterable[TunableSet], arch: str, cache: KernelCache, processes: int = 1) -> CompileSummary:
    """The coordinator's compile stage for a space's trials: compile what the cache lacks; the summary's
    :meth:`~CompileSummary.rejected` names the configs to leave out (each with its verdict)."""
    check_arch(arch)
    return compile_all(jobs_for(sets, arch), cache, processes)


def load_cubin(program: CudaProgram, arch: str, cache: KernelCache) -> KernelEntry:
    """The cubin a GPU worker loads for ``program`` on an ``arch`` device: from the cache, compiled once and
    stored on a miss (its ``cubin`` and ``key``). REJECTED (the verdict's reason) for a config judged infeasible or failed."""
    job = program_job(program, arch)
    entry = cache.get(job.key)
    if entry is None:
        entry = compile_job(job)
        cache.put(entry)
    if entry.status != "compiled":
        raise TuneFailure.rejected(f"{program.filename} {' '.join(program.options)}: {entry.reason}")
    return entry


def cubin_file(entry: KernelEntry, cache: KernelCache) -> Path:
    """A file holding ``entry``'s cubin (what ``cupy.RawModule(path=...)`` loads): the directory cache's own file,
    else a copy written once (atomically) under the temporary directory, named by the key."""
    if isinstance(cache, DirectoryCache) and cache.cubin_path(entry.key).is_file():
        return cache.cubin_path(entry.key)
    path = Path(tempfile.gettempdir()) / f"farm-kernels-{os.getuid()}" / f"{entry.key}.cubin"
    if not path.is_file():
        write_atomic(path, entry.cubin)
    return path


_kernel_cache: list[KernelCache] = []  # the cache use_kernel_cache set (one item), else none


def use_kernel_cache(cache: KernelCache | None) -> None:
    """Load space variants' cubins through ``cache`` (None: back to ``$FARM_KERNEL_CACHE``, else CuPy compiles)."""
    _kernel_cache[:] = [] if cache is None else [cache]


def kernel_cache() -> KernelCache | None:
    """The kernel cache variants load from: :func:`use_kernel_cache`'s, else ``$FARM_KERNEL_CACHE`` (a directory or
    a ``redis://`` URL), else None (CuPy compiles the variant's source at first launch)."""
    if _kernel_cache:
        return _kernel_cache[0]
    return open_cache() if os.environ.get(CACHE_ENV) else None


def load_module(program: CudaProgram, cupy: Any) -> Any:
    """A space variant's ``CudaProgram.loader``: its cubin from the kernel cache (compiled once on a miss; REJECTED
    for an infeasible or failed verdict) as a ``cupy.RawModule``, recording the key in ``program.cubin_keys``;
    without a kernel cache, CuPy's own compile of the source."""
    cache = kernel_cache()
    if cache is None:
        return cupy.RawModule(code=program.text, options=program.options)
    device = cupy.cuda.Device()
    entry = load_cubin(program, f"sm_{device.compute_capability}", cache)
    program.cubin_keys[device.id] = entry.key
    return cupy.RawModule(path=str(cubin_file(entry, cache)))  # CuPy loads a cubin from a path
