"""The GPU benchmark of ``tools/gpu_check.py``: trial overhead, and the winners by shape of the five operations.

1. **Trial overhead.** For one kernel candidate of each operation (on the operation's first CUDA workload of the
   catalog), the seconds one trial sample reports under ``Timing.END_TO_END`` (host clock around launch and
   fence) and ``Timing.DEVICE`` (CUDA events around the call), both through the farm's own trial runner
   (``farm.adapter.RuntimeTrials.measure``: fresh inputs, the exclusive lock, the fences), against the CUDA-event
   time of the same kernel launched ``REPEATS`` times back to back (the kernel's own time, launch gaps hidden).
   ``overhead`` is a trial's time minus that kernel time.
2. **Winners by shape.** Every CUDA workload of the catalog tuned by the in-process controller under the catalog's
   policy (shortened by ``--samples``/``--budget``): the winner, its time ratio to the reference (CuPy, cuBLAS for
   matmul; 1.000 when the reference stays), and the best custom kernel's ratio even when it lost.

Each result is appended to ``OUT/bench.jsonl`` as soon as it is measured (one JSON object a line), so a run
stopped at its time limit keeps everything it finished; ``OUT/bench.md`` renders what is there at the end. The
benchmark stops starting new work at ``--deadline`` seconds. ``--device cpu`` runs the same code on the host
client (a smoke test of this script without a GPU; host numbers mean nothing for the GPU question).

    python bench/gpu.py [--out gpu-report/bench] [--deadline 150] [--device cuda] [--require-device]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import farm
from farm.adapter import RuntimeTrials, complete
from farm.policy import Timing
from farm.runtimes.base import ComputeClient
from farm_kernels import registry

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CATALOG = ROOT / "examples" / "catalog.toml"
REPEATS = 20
SAMPLES = 15


def load_kernels_host() -> Any:
    """bench/kernels_host.py (its catalog walk), registered in sys.modules before it runs (its dataclasses
    need their module there)."""
    found = sys.modules.get("kernels_host")
    if found is None:
        spec = importlib.util.spec_from_file_location("kernels_host", ROOT / "bench" / "kernels_host.py")
        assert spec is not None and spec.loader is not None
        found = sys.modules["kernels_host"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(found)
    return found


class Sink:
    """Appends one JSON object per result to ``bench.jsonl`` (flushed at once) and keeps them for the table."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "bench.jsonl"
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        print(json.dumps(row, sort_keys=True), flush=True)


def kernel_seconds(client: ComputeClient, fn: Any, inputs: tuple[Any, ...], repeats: int = REPEATS) -> float:
    """Seconds per launch of ``fn`` run ``repeats`` times back to back: CUDA events around the loop on a GPU,
    the host clock elsewhere."""
    with client.activate():
        fn(*inputs)  # warm: compile and allocate outside the timed loop
    complete(client)
    if client.device_kind != "cuda":
        start = time.perf_counter()
        for _ in range(repeats):
            fn(*inputs)
        return (time.perf_counter() - start) / repeats
    import cupy

    stream = client.stream  # type: ignore[attr-defined]
    with client.activate():
        begin, end = cupy.cuda.Event(), cupy.cuda.Event()
        begin.record(stream)
        for _ in range(repeats):
            fn(*inputs)
        end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(begin, end) / 1e3 / repeats


def overhead(client: ComputeClient, catalog: dict[str, Any], sink: Sink, stop_at: float) -> None:
    kernels_host = load_kernels_host()
    seen: set[str] = set()
    for name, spec in kernels_host.workloads(catalog, client.device_kind):
        if name in seen:
            continue
        seen.add(name)
        if time.monotonic() > stop_at:
            sink.add({"part": "overhead", "operation": name, "skipped": "deadline"})
            continue
        op = registry.get(name)
        ts = op.tunable(client.device_kind)
        inputs = op.build(spec, client, source=f"catalog {name}")
        index = 1  # the first kernel candidate (0 is the reference)
        indices = list(range(len(ts.implementations)))
        timings = {}
        for timing in (Timing.END_TO_END, Timing.DEVICE):
            trials = RuntimeTrials(client, ts, inputs, indices, timing)
            trials.measure(index)  # warm
            timings[timing.value] = statistics.median(trials.measure(index) for _ in range(SAMPLES))
        with client.activate():
            fresh = ts.generate_inputs(inputs)
        complete(client)
        kernel = kernel_seconds(client, ts[index].fn, fresh)
        sink.add({
            "part": "overhead", "operation": name, "workload": op.label(spec), "candidate": ts[index].name,
            "kernel_s": kernel, "end_to_end_s": timings["end_to_end"], "device_s": timings["device"],
            "end_to_end_overhead_s": timings["end_to_end"] - kernel, "device_overhead_s": timings["device"] - kernel,
        })


def winners(client: ComputeClient, catalog: dict[str, Any], sink: Sink, stop_at: float) -> None:
    kernels_host = load_kernels_host()
    policy = farm.StackPolicy.from_dict(catalog.get("policy", {}))
    tuner = farm.enable_stack_autotune(policy)
    for name, spec in kernels_host.workloads(catalog, client.device_kind):
        op = registry.get(name)
        if time.monotonic() > stop_at:
            sink.add({"part": "winner", "operation": name, "workload": op.label(spec), "skipped": "deadline"})
            continue
        tunable = op.tunable(client.device_kind)
        inputs = op.build(spec, client, source=f"catalog {name}")
        started = time.monotonic()
        farm.try_execute_stack(name, client.device_id, client, tunable, inputs)
        report = tuner.reports()[-1]
        chosen = next(c for c in report.candidates if c.name == report.winner)
        kernels = [c for c in report.candidates if c.name != tunable[tunable.stack_reference()].name and c.ratio is not None]
        best = min(kernels, key=lambda c: c.ratio or float("inf"), default=None)
        sink.add({
            "part": "winner", "operation": name, "workload": op.label(spec), "winner": report.winner,
            "reference": tunable[tunable.stack_reference()].name, "ratio": chosen.ratio or 1.0,
            "noise": chosen.relative_mad, "best_kernel": best.name if best else None,
            "best_kernel_ratio": best.ratio if best else None, "seconds": time.monotonic() - started,
            "rejected": [c.name for c in report.candidates if c.note.startswith("rejected")],
            "budget_exhausted": report.budget_exhausted,
        })


def render(rows: list[dict[str, Any]]) -> str:
    """Markdown tables of whatever rows are there (a run stopped early renders what it measured)."""
    out = ["## Trial overhead (median seconds per sample; kernel = CUDA events over back-to-back launches)", "",
           "| operation | workload | candidate | kernel | END_TO_END | DEVICE | E2E overhead | DEVICE overhead |",
           "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in (r for r in rows if r["part"] == "overhead"):
        if "skipped" in r:
            out.append(f"| {r['operation']} | skipped ({r['skipped']}) | | | | | | |")
            continue
        cells = [f"{r[k] * 1e6:.1f} us" for k in ("kernel_s", "end_to_end_s", "device_s", "end_to_end_overhead_s", "device_overhead_s")]
        out.append(f"| {r['operation']} | {r['workload']} | {r['candidate']} | " + " | ".join(cells) + " |")
    out += ["", "## Winners by shape (ratio = winner time / reference time; < 1 is faster than CuPy/cuBLAS)", "",
            "| operation | workload | winner | ratio | noise | best kernel | its ratio | rejected | tune s |",
            "|---|---|---|---:|---:|---|---:|---|---:|"]
    for r in (r for r in rows if r["part"] == "winner"):
        if "skipped" in r:
            out.append(f"| {r['operation']} | {r['workload']} | skipped ({r['skipped']}) | | | | | | |")
            continue
        noise = "-" if r["noise"] is None else f"{r['noise']:.3f}"
        best = "-" if r["best_kernel_ratio"] is None else f"{r['best_kernel_ratio']:.3f}"
        out.append(f"| {r['operation']} | {r['workload']} | {r['winner']} | {r['ratio']:.3f} | {noise} | "
                   f"{r['best_kernel'] or '-'} | {best} | {', '.join(r['rejected']) or '-'} | {r['seconds']:.1f} |")
    return "\n".join(out) + "\n"


def read_rows(folder: Path) -> list[dict[str, Any]]:
    path = folder / "bench.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-report" / "bench", help="folder for bench.jsonl and bench.md")
    parser.add_argument("--require-device", action="store_true", help="fail (instead of skipping) without a CUDA device")
    parser.add_argument("--catalog", type=Path, default=DEFAULT_CATALOG)
    parser.add_argument("--deadline", type=float, default=150.0, help="seconds after which no new work starts")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--operation", action="append", default=[], help="only this operation (repeatable)")
    parser.add_argument("--samples", type=int, default=5, help="policy.samples for the winners (the catalog's: 5)")
    parser.add_argument("--budget", type=float, default=3.0, help="policy.budget seconds per workload")
    args = parser.parse_args(argv)
    started = time.monotonic()
    catalog = tomllib.loads(args.catalog.read_text(encoding="utf-8"))
    catalog["policy"] = dict(catalog.get("policy", {}), samples=args.samples, budget=args.budget)
    if args.operation:
        catalog["problems"] = [p for p in catalog["problems"] if p["operation"] in args.operation]
    registry.ensure_loaded()
    if args.device == "cuda":
        from farm.runtimes.cuda import CudaClient, device_count

        if device_count() == 0 and not args.require_device:
            print("bench/gpu.py: no CUDA device here: skipped (python3 tools/dev.py gpu-check runs it on a GPU machine)")
            return 0

        client: ComputeClient = CudaClient(0)
    else:
        client = farm.HostClient(0)
    sink = Sink(args.out)
    sink.add({"part": "device", "device": client.device_id, "properties": client.properties_fingerprint(),
              "driver": client.driver_fingerprint(), "compiler": client.compiler(), "policy": catalog["policy"]})
    try:
        overhead(client, catalog, sink, started + args.deadline * 0.25)
        winners(client, catalog, sink, started + args.deadline)
    finally:
        (args.out / "bench.md").write_text(render(sink.rows), encoding="utf-8")
    print(render(sink.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
