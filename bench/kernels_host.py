"""Tune every host workload of a catalog with the core's own controller and print each winner.

For each problem of the catalog that runs on the chosen device kind, and each of its workloads, the inputs are
built from the workload spec (``Operation.build``) and tuned by ``farm.try_execute_stack`` under the catalog's
``[policy]``. The table shows the winner, its median time ratio to the reference (paired samples; 1.000 when the
reference stays), the noise of that ratio (relative MAD), candidates rejected as wrong (there should be none), and
the tuning time. The last lines list the distinct winners per operation: the host winners vary with shape.

    .venv/bin/python bench/kernels_host.py [--catalog examples/catalog.toml] [--operation matmul] [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import farm
from farm.runtimes.base import ComputeClient
from farm_kernels import registry

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CATALOG = ROOT / "examples" / "catalog.toml"


@dataclass(frozen=True)
class Row:
    """One tuned workload."""

    operation: str
    workload: str
    winner: str
    ratio: float
    noise: float | None
    rejected: tuple[str, ...]
    candidates: int
    seconds: float


def workloads(catalog: dict[str, Any], device_kind: str, only: Collection[str] = ()) -> list[tuple[str, dict[str, Any]]]:
    """(operation, spec) of every catalog workload that runs on ``device_kind``, in catalog order."""
    found = []
    for problem in catalog["problems"]:
        name = problem["operation"]
        op = registry.get(name)
        if (only and name not in only) or device_kind not in problem.get("devices", op.devices):
            continue
        found.extend((name, dict(spec)) for spec in problem["workloads"])
    return found


def tune(catalog: dict[str, Any], client: ComputeClient, only: Collection[str] = ()) -> list[Row]:
    """Tune each workload once through ``try_execute_stack``; the controller must not be installed yet."""
    policy = farm.StackPolicy.from_dict(catalog.get("policy", {}))
    tuner = farm.enable_stack_autotune(policy)
    rows = []
    for name, spec in workloads(catalog, client.device_kind, only):
        op = registry.get(name)
        tunable = op.tunable(client.device_kind)
        inputs = op.build(spec, client, source=f"catalog {name}")
        tunes = tuner.stats().tunes
        started = time.monotonic()
        farm.try_execute_stack(name, client.device_id, client, tunable, inputs)
        seconds = time.monotonic() - started
        if tuner.stats().tunes == tunes:
            raise SystemExit(f"{name} {op.label(spec)}: not tuned (a duplicate workload?)")
        report = tuner.reports()[-1]
        chosen = next(c for c in report.candidates if c.name == report.winner)
        rejected = tuple(c.name for c in report.candidates if c.note.startswith("rejected"))
        rows.append(
            Row(name, op.label(spec), report.winner, chosen.ratio or 1.0, chosen.relative_mad, rejected,
                len(report.candidates), seconds)
        )
    return rows


def render(rows: list[Row]) -> str:
    """The table and the per-operation summary as plain aligned text."""
    header = ("operation", "workload", "winner", "ratio", "noise", "rejected", "tune s")
    body = [
        (r.operation, r.workload, r.winner, f"{r.ratio:.3f}", "-" if r.noise is None else f"{r.noise:.3f}",
         ",".join(r.rejected) or "-", f"{r.seconds:.2f}")
        for r in rows
    ]
    widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
    numeric = {3, 4, 6}

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [line(header), line(tuple("-" * w for w in widths))]
    previous = None
    for r, cells in zip(rows, body, strict=True):
        if previous is not None and r.operation != previous:
            out.append("")
        out.append(line(cells))
        previous = r.operation
    out.append("")
    for op in dict.fromkeys(r.operation for r in rows):
        winners = list(dict.fromkeys(r.winner for r in rows if r.operation == op))
        out.append(f"{op}: {len(winners)} distinct winner(s) over {sum(r.operation == op for r in rows)} workloads: {', '.join(winners)}")
    out.append(f"total tuning time {sum(r.seconds for r in rows):.1f} s for {len(rows)} workloads")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", type=Path, default=DEFAULT_CATALOG)
    parser.add_argument("--operation", action="append", default=[], help="only this operation (repeatable)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="device kind (cuda needs CuPy and a GPU)")
    args = parser.parse_args(argv)
    catalog = tomllib.loads(args.catalog.read_text(encoding="utf-8"))
    registry.ensure_loaded()
    if args.device == "cuda":
        from farm.runtimes.cuda import CudaClient

        client: ComputeClient = CudaClient(0)
    else:
        client = farm.HostClient(0)
    rows = tune(catalog, client, args.operation)
    print(f"{client.device_id}: {client.properties_fingerprint()}")
    print(f"policy: {catalog.get('policy', {})}")
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
