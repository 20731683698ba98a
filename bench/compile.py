"""The compile stage of CUDA spaces (farm_kernels.cuda.compile), on CPU cores only (NVRTC needs no GPU).

(a) throughput: configs of every CUDA space (matmul, softmax, reduce_sum, transpose) compiled per second with 1
    process and with N, and per core (the target: 2 cores >= 1.8x one core); the pool of N processes is the
    compile stage's own, started at first use and kept (its start-up is in the figure);
(b) cache hit time: a second compile of the same jobs (every config served from the directory cache), per config;
(c) the share of the space pruned by resources (infeasible verdicts) and failed, of the configs the
    restrictions admit;
(d) GPU seconds moved to CPU: the NVRTC seconds of the fresh compiles, which a GPU worker compiling at first
    launch (CuPy's RawModule) would have spent on the GPU host.

    .venv/bin/python bench/compile.py [--arch sm_90] [--processes 2] [--repeat 1]

``--repeat`` compiles the space that many times over (fresh cache each) for steadier figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from farm_kernels import matmul, reduce_sum, softmax, transpose  # noqa: E402
from farm_kernels.cuda import compile as stage  # noqa: E402
from farm_kernels.cuda.kcache import DirectoryCache  # noqa: E402


def run(arch: str, processes: int, repeat: int) -> dict[str, float]:
    jobs = stage.jobs_for([op.cuda_tunable() for op in (matmul, softmax, reduce_sum, transpose)], arch)
    out: dict[str, float] = {"configs": len(jobs)}
    for label, n in (("one", 1), ("many", processes)):
        seconds = 0.0
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as folder:
                start = time.perf_counter()
                summary = stage.compile_all(jobs, DirectoryCache(folder), processes=n)
                seconds += time.perf_counter() - start
                if label == "one":
                    cache = DirectoryCache(folder)
                    start = time.perf_counter()
                    again = stage.compile_all(jobs, cache, processes=n)
                    out["hit_ms_per_config"] = (time.perf_counter() - start) * 1000 / len(jobs)
                    assert again.compiled == 0, again.to_json()
                    out["pruned_share"] = summary.infeasible / len(jobs)
                    out["failed_share"] = summary.failed / len(jobs)
                    out["gpu_seconds_moved"] = summary.compile_seconds
        out[f"configs_per_s_{label}"] = len(jobs) * repeat / seconds
    out["processes"] = processes
    out["configs_per_s_per_core"] = out["configs_per_s_many"] / processes
    out["scaling"] = out["configs_per_s_many"] / out["configs_per_s_one"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--processes", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    stage.check_arch(args.arch)
    figures = run(args.arch, args.processes, args.repeat)
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}, indent=2))


if __name__ == "__main__":
    main()
