"""The farm against the real Kernel Tuner (kernel_tuner 1.5.0), live, on C kernels compiled with g++.

Both tools tune the same C source over the same tunable parameters (``#define``s), compiled the same way: Kernel
Tuner's C backend (``kernel_tuner/backends/compiler.py``) writes ``#define``s for the grid, the block and every
parameter above the source (``kernel_tuner.util.prepare_kernel_string``), wraps it in ``extern "C"``, runs
``g++ -c src.cc -fPIC -O3 -o x.o`` then ``g++ x.o -fPIC -O3 -shared -o x.so`` and calls the function through
ctypes; the C function times itself and returns milliseconds. The farm side builds that exact text (checked
against what Kernel Tuner writes, once per kernel), compiles each config with the same two commands on its first
call (one ``.so`` per config in a fresh temporary folder per run: every run compiles every config it evaluates,
inside the farm's wall time) and calls it through ctypes, returning the output array; the farm times the whole
Python call (``Timing.END_TO_END``) and ignores the returned milliseconds.

Kernels (float32, ``-O3``; every config is correct, the default is a plain loop nest):

- ``transpose``: 768 x 768 out-of-place transpose, tiles TILE_I x TILE_J in 4..128, UNROLL 1|2|4 of the inner
  loop (``#pragma GCC unroll``), ORDER 0 (read rows) | 1 (write rows) | 2 (tiles column-major): 324 configs,
  about 0.2-1 ms a call.
- ``matmul``: 192 x 192 x 192 blocked i-k-j matmul, TILE_M 4..192, TILE_N 16..192, TILE_K 8..192, UNROLL 1|4:
  300 configs, about 0.5-2 ms a call.

Per kernel: Kernel Tuner ``brute_force`` and ``bayes_opt`` (``max_fevals`` 60; seeded by seeding ``random`` and
``numpy`` and patching its unseeded scipy ``LatinHypercube`` with ``rng=``), with ``answer=`` (it verifies every
config, as the farm does); the farm (``farm.tune``, ``StackPolicy(strategy="exhaustive" | "bayes",
max_configs=60, seed=..., timing=END_TO_END, **FARM_POLICY)``), the reference = the default config, one space
``kernel``, with ``screening="race"`` and ``"full"`` when ``StackPolicy`` has that field. The farm's trial inputs
(``--inputs``): ``pool`` (default) keeps them in long-lived buffers like Kernel Tuner's (see ``Recycled``);
``copy`` is the farm's default generate (a fresh copy of every array per trial).

Columns, per (tool, strategy), medians over the runs (seeds):

- ``wall s``: the tool's call (Kernel Tuner: ``tune_kernel``; the farm: building the set and ``farm.tune``);
- ``compile s``: Kernel Tuner's results' ``compile_time`` (g++ and the load); the farm: the same, timed here;
- ``timed s``: the samples each tool keeps (Kernel Tuner: the sum of its measured times, 7 per config; the farm:
  the sum of its timed pairs); ``device s`` / ``rep.comp s``: the farm report's ``device_seconds`` (every run of
  a candidate, warm-ups and validation included, and here the first call, which compiles) and
  ``compile_seconds`` (0: the farm does not know this set compiles), shown when the report has them;
- ``configs``: configs evaluated (Kernel Tuner: its results; the farm: ``report.evaluated``);
- ``pick/best`` (median and worst over seeds): every pick, the default and each exhaustive search's best 5 are
  re-timed by Kernel Tuner itself (one config per ``tune_kernel``, ``iterations=101``, three passes interleaved
  over the configs, the median of the per-pass medians); best is the fastest re-timed config.

Then the farm/Kernel Tuner wall ratio per strategy, and where each wall time went (compile, Kernel Tuner's
verification and benchmark time, the farm's kernel calls for the reference and for configs, and the rest).

The farm's device locks go to a private ``FARM_LOCK_DIR`` (unless one is set): with the per-user default, this
bench waited for other processes' trials on cpu:0 (a test suite on the same machine), which is not the farm's
cost. Kernel Tuner compiles and runs its first config twice per ``tune_kernel`` (a warm-up), inside its wall time.

Targets: pick / best within 1.05 for the exhaustive searches; the farm's wall time within a small factor of
Kernel Tuner's (both are dominated by g++ at these sizes).

    .venv/bin/python bench/peer_kerneltuner.py [--quick] [--seeds 3] [--only transpose|matmul] [--inputs pool|copy]
                                               [--profile]

``--quick``: the transpose kernel on an 81-config subspace, one seed, 30 evaluations for bayes (about 1-2 minutes;
the full run about 10). ``--profile``: cProfile over the farm's runs, the top functions by own and by
cumulative time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import ctypes
import dataclasses
import functools
import io
import os
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import farm

COMPILER_OPTIONS = ["-O3"]  # passed to Kernel Tuner as compiler_options, after its own -fPIC
KT_ITERATIONS = 7  # Kernel Tuner's default iterations while tuning
RETIME_ITERATIONS = 101
RETIME_PASSES = 3
SHORTLIST = 5  # each exhaustive search's best few are re-timed too

# The farm policy's extra keyword arguments, in one place. The budget must cover an exhaustive search of ~300
# compiled configs (the default 30 s would stop it early). "screening" is added per run when the field exists.
FARM_POLICY: dict[str, Any] = {"budget": 3600.0}

Config = dict[str, int]

PRELUDE = r"""
#include <time.h>
#define KT_STR(x) #x
#define KT_PRAGMA(x) _Pragma(KT_STR(x))
#define KT_UNROLL(n) KT_PRAGMA(GCC unroll n)
static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}
"""

TRANSPOSE_SOURCE = PRELUDE + r"""
float transpose(float *out, const float *in, int n) {
    double start = now_ms();
#if ORDER == 2
    for (int jj = 0; jj < n; jj += TILE_J)
    for (int ii = 0; ii < n; ii += TILE_I) {
#else
    for (int ii = 0; ii < n; ii += TILE_I)
    for (int jj = 0; jj < n; jj += TILE_J) {
#endif
#if ORDER == 1
        for (int j = jj; j < jj + TILE_J; j++) {
            KT_UNROLL(UNROLL)
            for (int i = ii; i < ii + TILE_I; i++) out[j * n + i] = in[i * n + j];
        }
#else
        for (int i = ii; i < ii + TILE_I; i++) {
            KT_UNROLL(UNROLL)
            for (int j = jj; j < jj + TILE_J; j++) out[j * n + i] = in[i * n + j];
        }
#endif
    }
    return (float)(now_ms() - start);
}
"""

MATMUL_SOURCE = PRELUDE + r"""
float matmul(float *c, const float *a, const float *b, int n) {
    double start = now_ms();
    for (int i = 0; i < n * n; i++) c[i] = 0.0f;
    for (int ii = 0; ii < n; ii += TILE_M)
    for (int kk = 0; kk < n; kk += TILE_K)
    for (int jj = 0; jj < n; jj += TILE_N)
        for (int i = ii; i < ii + TILE_M; i++)
        for (int k = kk; k < kk + TILE_K; k++) {
            const float aik = a[i * n + k];
            KT_UNROLL(UNROLL)
            for (int j = jj; j < jj + TILE_N; j++) c[i * n + j] += aik * b[k * n + j];
        }
    return (float)(now_ms() - start);
}
"""


@dataclass(frozen=True)
class Kernel:
    """One C kernel: its function name, source, problem size, parameters (full and --quick), default config, and
    how to make Kernel Tuner's argument list and the expected output (argument ``out`` of the list)."""

    name: str
    source: str
    n: int
    params: dict[str, list[int]]
    quick_params: dict[str, list[int]]
    default: Config
    make_args: Callable[[int, np.random.Generator], list[Any]]
    expected: Callable[[list[Any]], np.ndarray]
    out: int = 0
    atol: float = 1e-6

    @property
    def problem_size(self) -> tuple[int, int]:
        return (self.n, self.n)


def _transpose_args(n: int, rng: np.random.Generator) -> list[Any]:
    return [np.zeros((n, n), np.float32), rng.random((n, n), dtype=np.float32), np.int32(n)]


def _matmul_args(n: int, rng: np.random.Generator) -> list[Any]:
    return [np.zeros((n, n), np.float32), rng.random((n, n), dtype=np.float32),
            rng.random((n, n), dtype=np.float32), np.int32(n)]


TILES = [4, 8, 16, 32, 64, 128]
KERNELS: dict[str, Kernel] = {
    "transpose": Kernel(
        "transpose", TRANSPOSE_SOURCE, 768,
        params={"TILE_I": TILES, "TILE_J": TILES, "UNROLL": [1, 2, 4], "ORDER": [0, 1, 2]},
        quick_params={"TILE_I": [4, 16, 64], "TILE_J": [4, 16, 64], "UNROLL": [1, 2, 4], "ORDER": [0, 1, 2]},
        default={"TILE_I": 4, "TILE_J": 4, "UNROLL": 1, "ORDER": 0},
        make_args=_transpose_args,
        expected=lambda args: np.ascontiguousarray(args[1].T),
    ),
    "matmul": Kernel(
        "matmul", MATMUL_SOURCE, 192,
        params={"TILE_M": [4, 8, 16, 32, 64, 192], "TILE_N": [16, 32, 64, 96, 192],
                "TILE_K": [8, 16, 32, 64, 192], "UNROLL": [1, 4]},
        quick_params={"TILE_M": [4, 16, 192], "TILE_N": [16, 64, 192], "TILE_K": [8, 32, 192], "UNROLL": [1, 4]},
        default={"TILE_M": 192, "TILE_N": 192, "TILE_K": 192, "UNROLL": 1},
        make_args=_matmul_args,
        expected=lambda args: (args[1].astype(np.float64) @ args[2].astype(np.float64)).astype(np.float32),
        atol=1e-3,  # numpy sums in another order: float32 outputs ~48 differ in the last bits
    ),
}


def config_key(config: Config) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


# -- Kernel Tuner's compile, mirrored -------------------------------------------------------------------------


def kt_source(kernel: Kernel, config: Config) -> str:
    """The exact text Kernel Tuner's C backend compiles for ``config``: its ``#define``s (grid, block,
    parameters, ``kernel_tuner``), ``#line 1``, the source, wrapped in ``extern "C"``."""
    from kernel_tuner import util

    names = util.default_block_size_names
    threads, grid = util.setup_block_and_grid(kernel.problem_size, (None, None, None), config, names)
    _, text = util.prepare_kernel_string(kernel.name, kernel.source, config, grid, threads, names, "C", None)
    if 'extern "C"' not in text:
        text = 'extern "C" {\n' + text + "\n}"
    return str(text)


class Library:
    """Compiles each config with g++ exactly as Kernel Tuner does (one ``.so`` per config in ``folder``, on first
    use) and calls it through ctypes; ``compile_seconds`` sums the g++ calls and the load."""

    def __init__(self, kernel: Kernel, folder: Path) -> None:
        self.kernel, self.folder = kernel, folder
        self.functions: dict[tuple[int, ...], Any] = {}
        self.compile_seconds = 0.0
        self.compiles = 0
        self.calls = [0, 0]  # [configs, reference]
        self.call_seconds = [0.0, 0.0]

    def function(self, config: Config) -> Any:
        key = tuple(config[k] for k in self.kernel.params)
        fn = self.functions.get(key)
        if fn is None:
            fn = self.functions[key] = self._compile(config)
        return fn

    def _compile(self, config: Config) -> Any:
        start = time.perf_counter()
        stem = self.folder / f"{self.kernel.name}_{len(self.functions)}"
        source = stem.with_suffix(".cc")
        ordered = {k: config[k] for k in self.kernel.params}  # Kernel Tuner's order: the tune_params'
        source.write_text(kt_source(self.kernel, ordered), encoding="utf-8")
        options = ["-fPIC", *COMPILER_OPTIONS]
        for command in (["g++", "-c", str(source), *options, "-o", f"{stem}.o"],
                        ["g++", f"{stem}.o", *options, "-shared", "-o", f"{stem}.so"]):
            subprocess.run(command, capture_output=True, text=True, check=True)  # as Kernel Tuner runs it
        fn = getattr(ctypes.CDLL(f"{stem}.so"), self.kernel.name)
        fn.restype = ctypes.c_float
        self.compile_seconds += time.perf_counter() - start
        self.compiles += 1
        return fn

    def call(self, config: Config, inputs: tuple[Any, ...], reference: bool = False) -> Any:
        """Run ``config`` on the trial's inputs (arrays by pointer, ints as int32, as Kernel Tuner passes them);
        the output array is the result. Counts the calls and their seconds, the reference's apart."""
        fn = self.function(config)
        c_args = [ctypes.c_void_p(a.ctypes.data) if isinstance(a, np.ndarray) else ctypes.c_int32(a) for a in inputs]
        start = time.perf_counter()
        fn(*c_args)
        self.call_seconds[reference] += time.perf_counter() - start
        self.calls[reference] += 1
        return inputs[self.kernel.out]


# -- Kernel Tuner -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    """Kernel Tuner writes its temporary sources into the working directory."""
    here = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)


@contextlib.contextmanager
def kt_seeded(seed: int | None) -> Iterator[None]:
    """Seed bayes_opt: it draws from ``random`` and an unseeded scipy LatinHypercube (patched with ``rng``)."""
    if seed is None:
        yield
        return
    import kernel_tuner.strategies.bayes_opt as bo

    original = bo.LatinHypercube
    random.seed(seed)
    np.random.seed(seed)
    bo.LatinHypercube = functools.partial(original, rng=np.random.default_rng(seed))
    try:
        yield
    finally:
        bo.LatinHypercube = original


def kt_tune(kernel: Kernel, args: list[Any], params: dict[str, list[int]], folder: Path, *, strategy: str | None,
            options: dict[str, Any] | None = None, iterations: int = KT_ITERATIONS, answer: bool = True,
            seed: int | None = None) -> tuple[list[dict[str, Any]], float]:
    import kernel_tuner

    expected: list[Any] | None = None
    if answer:
        expected = [None] * len(args)
        expected[kernel.out] = kernel.expected(args)
    with inside(folder), kt_seeded(seed), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "None of the tunable parameters specify thread block dimensions!"
        start = time.perf_counter()
        results, _ = kernel_tuner.tune_kernel(
            kernel.name, kernel.source, kernel.problem_size, args, params, lang="C",
            compiler_options=list(COMPILER_OPTIONS), iterations=iterations, answer=expected, atol=kernel.atol,
            strategy=strategy, strategy_options=options, quiet=True, verbose=False,
        )
        wall = time.perf_counter() - start
    return results, wall


def check_same_source(kernel: Kernel, args: list[Any], folder: Path) -> None:
    """Compile the default config through Kernel Tuner, capture the text it writes, compare with ours."""
    import kernel_tuner.backends.compiler as backend

    captured: list[str] = []
    original = backend.write_file

    def spy(filename: str, text: str) -> None:
        captured.append(text)
        original(filename, text)

    backend.write_file = spy
    try:
        kt_tune(kernel, args, {k: [v] for k, v in kernel.default.items()}, folder, strategy=None, iterations=1,
                answer=False)
    finally:
        backend.write_file = original
    # Kernel Tuner compiles the first config twice (a warm-up run, then the measured one): the same text.
    if not captured or any(text != kt_source(kernel, kernel.default) for text in captured):
        raise SystemExit(f"{kernel.name}: the source Kernel Tuner compiles differs from the farm side's")


# -- runs ---------------------------------------------------------------------------------------------------


@dataclass
class Run:
    tool: str  # "kernel_tuner", "farm", "farm race", "farm full"
    strategy: str  # "exhaustive" or "bayes"
    seed: int | None
    wall: float
    compile: float
    timed: float
    configs: int
    pick: Config
    device: float | None = None  # the farm report's own figures, when it has them
    report_compile: float | None = None
    shortlist: list[Config] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)  # where the wall time went (seconds), see breakdown()
    calls: dict[str, int] = field(default_factory=dict)  # kernel calls, by part
    kept: str | None = None  # the farm kept the reference: its best-scored config's note, or why none was


def kt_run(kernel: Kernel, args: list[Any], params: dict[str, list[int]], strategy: str, seed: int | None,
           fevals: int) -> Run:
    folder = Path(tempfile.mkdtemp(prefix="kt-"))
    try:
        kt_strategy, options = ("brute_force", None) if strategy == "exhaustive" else ("bayes_opt", {"max_fevals": fevals})
        results, wall = kt_tune(kernel, args, params, folder, strategy=kt_strategy, options=options, seed=seed)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    names = list(params)
    valid = [r for r in results if isinstance(r.get("time"), (int, float))]
    ranked = sorted(valid, key=lambda r: r["time"])
    return Run("kernel_tuner", strategy, seed, wall,
               compile=sum(r.get("compile_time", 0) for r in results) / 1000,
               timed=sum(sum(r.get("times", [])) for r in valid) / 1000,
               configs=len(results),
               pick={k: int(ranked[0][k]) for k in names},
               shortlist=[{k: int(r[k]) for k in names} for r in ranked[:SHORTLIST]],
               parts={"compile": sum(r.get("compile_time", 0) for r in results) / 1000,
                      "verify": sum(r.get("verification_time", 0) for r in results) / 1000,
                      "benchmark": sum(r.get("benchmark_time", 0) for r in results) / 1000},
               calls={"verify": len(valid), "benchmark": sum(len(r.get("times", [])) for r in valid)})


class Recycled:
    """``generate=`` for the farm: a trial's inputs in long-lived buffers, as Kernel Tuner's are. The read-only
    inputs are shared (the kernels take them ``const``); the output comes from a pool, re-filled from the original,
    and a pooled buffer is handed out only when nothing but the pool holds it (the farm keeps the reference's
    output for the whole search), so no two live trials ever share a writable buffer.

    The farm's default (a fresh copy of every array per trial, ``--inputs copy``) measures something else on this
    machine: in a direct loop, a transpose on freshly allocated buffers ran 3-4x slower than on reused ones
    (0.26 -> 0.8-1.0 ms; no page faults in the call), inside the farm's trials 15-25 % slower."""

    def __init__(self, out: int) -> None:
        self.out = out
        self.pool: list[np.ndarray] = []

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        source = inputs[self.out]
        buffer = next((b for b in self.pool if sys.getrefcount(b) <= 3), None)  # the pool, b, the call's argument
        if buffer is None:
            buffer = source.copy()
            self.pool.append(buffer)
        else:
            np.copyto(buffer, source)
        return tuple(buffer if i == self.out else a for i, a in enumerate(inputs))


INPUTS = {"pool": Recycled, "copy": None}  # how the farm makes a trial's inputs (--inputs)


def build_set(kernel: Kernel, params: dict[str, list[int]], library: Library, inputs: str = "pool"
              ) -> farm.TunableSet:
    make = INPUTS[inputs]
    ts = farm.TunableSet(kernel.name, signature=farm.array_signature,
                         generate=make(kernel.out) if make is not None else None)
    default = dict(kernel.default)

    def reference(*inputs: Any) -> Any:
        return library.call(default, inputs, reference=True)

    def config_fn(*inputs: Any, **config: int) -> Any:
        return library.call(config, inputs)

    ts.add(reference, name="reference", reference=True)
    values: dict[str, Any] = dict(params)
    ts.space(name="kernel", group=0, **values)(config_fn)
    return ts


def screenings() -> list[str | None]:
    """["race", "full"] when the core's StackPolicy has a ``screening`` field, else [None] (today's protocol)."""
    names = {f.name for f in dataclasses.fields(farm.StackPolicy)}
    return ["race", "full"] if "screening" in names else [None]


def farm_run(kernel: Kernel, args: list[Any], params: dict[str, list[int]], strategy: str, seed: int | None,
             fevals: int, screening: str | None, profiler: cProfile.Profile | None, trial_inputs: str) -> Run:
    inputs = tuple(int(a) if isinstance(a, np.integer) else a for a in args)
    extra = dict(FARM_POLICY)
    if screening is not None:
        extra["screening"] = screening
    policy = farm.StackPolicy(strategy=strategy, max_configs=None if strategy == "exhaustive" else fevals,
                              seed=seed or 0, timing=farm.Timing.END_TO_END, **extra)
    folder = Path(tempfile.mkdtemp(prefix="farm-kt-"))
    try:
        if profiler is not None:
            profiler.enable()
        start = time.perf_counter()
        library = Library(kernel, folder)  # a fresh folder: this run compiles every config it evaluates
        tuned = farm.tune(build_set(kernel, params, library, trial_inputs), inputs, device="cpu:0", policy=policy)
        wall = time.perf_counter() - start
        if profiler is not None:
            profiler.disable()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report = tuned.report
    assert report is not None, tuned.decision
    fn = tuned.fn
    pick = dict(fn.keywords) if isinstance(fn, functools.partial) else dict(kernel.default)
    names = list(params)
    ranked = sorted((c for c in report.candidates if c.ratio is not None and c.name.startswith("kernel[")),
                    key=lambda c: c.ratio or 0.0)
    space = next(s for s in build_set(kernel, params, library).spaces if s.name == "kernel")
    shortlist = []
    for c in ranked[:SHORTLIST]:
        parsed = space.parse(c.name)
        if parsed is not None:
            shortlist.append({k: int(parsed[k]) for k in names})
    timed = sum(r + c for cand in report.candidates for r, c in cand.pairs)
    kept = None
    if not isinstance(fn, functools.partial):
        scored = [c for c in report.candidates if c.name != "reference" and c.ratio is not None]
        top = min(scored, key=lambda c: c.ratio or 0.0) if scored else None
        kept = f"{top.name}: {top.note}" if top is not None else "no config was scored"
    tool = "farm" if screening is None else f"farm {screening}"
    return Run(tool, strategy, seed, wall, library.compile_seconds, timed, report.evaluated,
               {k: int(pick[k]) for k in names},
               device=getattr(report, "device_seconds", None),
               report_compile=getattr(report, "compile_seconds", None), shortlist=shortlist,
               parts={"compile": library.compile_seconds, "reference calls": library.call_seconds[1],
                      "config calls": library.call_seconds[0]},
               calls={"reference calls": library.calls[1], "config calls": library.calls[0]}, kept=kept)


def retime(kernel: Kernel, args: list[Any], configs: list[Config]) -> dict[str, float]:
    """Kernel Tuner re-times each config (iterations=101): the median of the per-pass medians, passes
    interleaved over the configs so drift hits all of them alike. Milliseconds by config key."""
    folder = Path(tempfile.mkdtemp(prefix="kt-retime-"))
    passes: dict[str, list[float]] = {config_key(c): [] for c in configs}
    try:
        for _ in range(RETIME_PASSES):
            for config in configs:
                results, _ = kt_tune(kernel, args, {k: [v] for k, v in config.items()}, folder, strategy=None,
                                     iterations=RETIME_ITERATIONS, answer=False)
                passes[config_key(config)].append(statistics.median(results[0]["times"]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {key: statistics.median(values) for key, values in passes.items()}


# -- the table ----------------------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def med(values: list[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return statistics.median(real) if real else None


def table(kernel: Kernel, params: dict[str, list[int]], runs: list[Run], times: dict[str, float]) -> None:
    """The table (one row per tool and strategy, medians over seeds), the wall ratios and the breakdown."""
    best_key = min(times, key=lambda k: times[k])
    best = times[best_key]
    size = 1
    for values in params.values():
        size *= len(values)
    print(f"\n{kernel.name}: n={kernel.n}, {size} configs; re-timed by Kernel Tuner ({RETIME_ITERATIONS} iterations, "
          f"median of {RETIME_PASSES} passes): default {config_key(kernel.default)} "
          f"{times[config_key(kernel.default)]:.3f} ms, best {best:.3f} ms ({best_key}), {len(times)} configs re-timed")
    has_device = any(r.device is not None for r in runs)
    has_report_compile = any(r.report_compile is not None for r in runs)
    header = f"{'tool':<13} {'strategy':<10} {'runs':>4} {'wall s':>7} {'compile s':>9} {'timed s':>7}"
    header += f" {'device s':>8}" if has_device else ""
    header += f" {'rep.comp s':>10}" if has_report_compile else ""
    header += f" {'configs':>7} {'pick/best':>9} {'worst':>6}  pick"
    print(header)
    print("-" * (len(header) + 30))
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.tool, r.strategy), []).append(r)
    walls: dict[tuple[str, str], float] = {}
    for (tool, strategy), rs in groups.items():
        ratios = [times[config_key(r.pick)] / best for r in rs]
        walls[(tool, strategy)] = statistics.median(r.wall for r in rs)
        line = (f"{tool:<13} {strategy:<10} {len(rs):>4} {walls[(tool, strategy)]:>7.1f} "
                f"{fmt(med([r.compile for r in rs])):>9} {fmt(med([r.timed for r in rs]), 2):>7}")
        if has_device:
            line += f" {fmt(med([r.device for r in rs]), 2):>8}"
        if has_report_compile:
            line += f" {fmt(med([r.report_compile for r in rs]), 2):>10}"
        pick = config_key(rs[0].pick) if len(rs) == 1 else f"{len({config_key(r.pick) for r in rs})} distinct"
        line += (f" {statistics.median(r.configs for r in rs):>7g} {statistics.median(ratios):>9.3f} "
                 f"{max(ratios):>6.3f}  {pick}")
        print(line)
    for (tool, strategy), wall in walls.items():
        if tool.startswith("farm") and ("kernel_tuner", strategy) in walls:
            print(f"  {tool} / kernel_tuner wall, {strategy}: {wall / walls[('kernel_tuner', strategy)]:.2f}x")
    for r in runs:
        if r.kept is not None:
            seed = "" if r.seed is None else f" seed {r.seed}"
            print(f"  {r.tool} {r.strategy}{seed} kept the reference; best scored {r.kept}")
    print("where the wall time went (s, median over runs; kernel calls in parentheses):")
    for (tool, strategy), rs in groups.items():
        parts = {name: med([r.parts[name] for r in rs]) or 0.0 for name in rs[0].parts}
        calls = {name: int(med([r.calls.get(name, 0) for r in rs]) or 0) for name in rs[0].parts}
        other = walls[(tool, strategy)] - sum(parts.values())
        text = " + ".join(f"{name} {value:.2f}" + (f" ({calls[name]})" if calls[name] else "")
                          for name, value in parts.items())
        print(f"  {tool} {strategy}: {walls[(tool, strategy)]:.1f} = {text} + other {other:.2f}")


def bench(kernel: Kernel, quick: bool, seeds: int, profiler: cProfile.Profile | None, trial_inputs: str) -> None:
    params = kernel.quick_params if quick else kernel.params
    fevals = 30 if quick else 60
    args = kernel.make_args(kernel.n, np.random.default_rng(0))
    folder = Path(tempfile.mkdtemp(prefix="kt-check-"))
    try:
        check_same_source(kernel, args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    runs: list[Run] = []

    def log(run: Run) -> None:
        runs.append(run)
        seed = "" if run.seed is None else f" seed {run.seed}"
        print(f"  {kernel.name} {run.tool} {run.strategy}{seed}: {run.wall:.1f} s, {run.configs} configs, "
              f"pick {config_key(run.pick)}", file=sys.stderr, flush=True)

    log(kt_run(kernel, args, params, "exhaustive", None, fevals))
    for screening in screenings():
        log(farm_run(kernel, args, params, "exhaustive", None, fevals, screening, profiler, trial_inputs))
    for seed in range(seeds):
        log(kt_run(kernel, args, params, "bayes", seed, fevals))
        for screening in screenings():
            log(farm_run(kernel, args, params, "bayes", seed, fevals, screening, profiler, trial_inputs))
    unique: dict[str, Config] = {config_key(kernel.default): kernel.default}
    for r in runs:
        for c in [r.pick, *r.shortlist]:
            unique.setdefault(config_key(c), c)
    start = time.perf_counter()
    times = retime(kernel, args, list(unique.values()))
    print(f"  {kernel.name}: re-timed {len(unique)} configs in {time.perf_counter() - start:.1f} s",
          file=sys.stderr, flush=True)
    table(kernel, params, runs, times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one kernel on a subspace, one seed")
    parser.add_argument("--seeds", type=int, default=None, help="bayes seeds (default 3, --quick 1)")
    parser.add_argument("--only", choices=sorted(KERNELS), default=None)
    parser.add_argument("--profile", action="store_true", help="cProfile the farm's runs")
    parser.add_argument("--inputs", choices=sorted(INPUTS), default="pool",
                        help="the farm's trial inputs: pooled long-lived buffers (default) or its default fresh copies")
    options = parser.parse_args(argv)
    seeds = options.seeds if options.seeds is not None else (1 if options.quick else 3)
    names = [options.only] if options.only else (["transpose"] if options.quick else list(KERNELS))
    profiler = cProfile.Profile() if options.profile else None
    # The farm serializes trials on a device across processes with a flock in a per-user folder: on a shared
    # development machine this bench would wait for other processes' trials on cpu:0 (a test suite), which is not
    # the farm's cost. A private lock folder, unless one is configured.
    lock_folder = tempfile.mkdtemp(prefix="farm-locks-") if "FARM_LOCK_DIR" not in os.environ else None
    if lock_folder is not None:
        os.environ["FARM_LOCK_DIR"] = lock_folder
    import kernel_tuner

    print(f"kernel_tuner {kernel_tuner.__version__ if hasattr(kernel_tuner, '__version__') else '?'}, "
          f"g++ {' '.join(COMPILER_OPTIONS)}, farm screening {screenings()}, policy extras {FARM_POLICY}, "
          f"farm trial inputs {options.inputs}, "
          f"{'quick, ' if options.quick else ''}{seeds} seed(s)")
    start = time.perf_counter()
    for name in names:
        bench(KERNELS[name], options.quick, seeds, profiler, options.inputs)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if lock_folder is not None:
        shutil.rmtree(lock_folder, ignore_errors=True)
    if profiler is not None:
        stats = pstats.Stats(profiler, stream=sys.stdout)
        print("\nfarm runs, by own time:")
        stats.sort_stats("tottime").print_stats(20)
        print("farm runs, by cumulative time:")
        stats.sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
