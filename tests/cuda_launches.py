"""Every launch the CUDA candidates make, recorded without a GPU (shared by the CUDA, NVRTC and coverage tests).

The CUDA candidates take their array module from their inputs, so with NumPy inputs they allocate NumPy outputs
and reach CudaKernel.launch, whose compiled function is replaced by a recorder: each recorded launch keeps the
entry point, grid, block, dynamic shared memory and the arguments (the NumPy arrays themselves included).

Workloads: the example catalog's CUDA problems (examples/catalog.toml, as written) and the small odd-sized,
strided and transposed specs of EXTRA_SPECS in every CUDA dtype of the operation (float16 included).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from farm_kernels import registry
from farm_kernels.cuda import CudaProgram

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "examples" / "catalog.toml"

EXTRA_SPECS: dict[str, list[dict[str, Any]]] = {
    "matmul": [dict(m=1, n=1, k=1), dict(m=31, n=7, k=257, layout="a_transposed"), dict(m=130, n=67, k=33, layout="strided"),
               dict(m=65, n=129, k=64, layout="b_transposed"), dict(m=97, n=33, k=17, layout="transposed")],
    "softmax": [dict(rows=1, cols=1), dict(rows=13, cols=1031, layout="strided"), dict(rows=257, cols=31, layout="transposed"),
                dict(rows=9, cols=33)],
    "reduce_sum": [dict(rows=1, cols=1, axis=0), dict(rows=13, cols=1031, axis=1, layout="strided"),
                   dict(rows=1031, cols=13, axis=0, layout="transposed"), dict(rows=300, cols=7, axis=1),
                   dict(rows=7, cols=259, axis=0, layout="strided")],
    "transpose": [dict(rows=1, cols=1), dict(rows=13, cols=1031, layout="strided"), dict(rows=257, cols=65),
                  dict(rows=65, cols=129, layout="strided")],
    "bias_gelu_fusion": [dict(rows=1, cols=1), dict(rows=13, cols=1031, layout="strided"),
                         dict(rows=257, cols=33, layout="transposed"), dict(rows=3, cols=5)],
}


@dataclass(frozen=True)
class Launch:
    where: str  # "operation candidate workload-label"
    operation: str
    candidate: str
    base: str  # kernel family, e.g. gemm_tiled16
    name: str  # entry point, e.g. gemm_tiled16_f16
    grid: tuple[int, ...]
    block: tuple[int, ...]
    args: tuple[Any, ...]
    shared_mem: int
    inputs: tuple[Any, ...]
    output: Any


def catalog_workloads() -> list[tuple[str, dict[str, Any]]]:
    """(operation, spec) of every CUDA workload of the example catalog."""
    catalog = tomllib.loads(CATALOG.read_text(encoding="utf-8"))
    return [(p["operation"], dict(w)) for p in catalog["problems"] if "cuda" in p.get("devices", ()) for w in p["workloads"]]


def extra_workloads() -> list[tuple[str, dict[str, Any]]]:
    """(operation, spec) of EXTRA_SPECS in every CUDA dtype of the operation."""
    registry.ensure_loaded()
    return [(name, dict(spec, dtype=dtype)) for name, specs in EXTRA_SPECS.items() for spec in specs
            for dtype in registry.get(name).dtypes["cuda"]]


def record(workloads: list[tuple[str, dict[str, Any]]], check_reference: bool = False) -> Iterator[Launch]:
    """Run every CUDA candidate on NumPy inputs of each workload; yield its one launch. ``check_reference``
    also runs the stack reference and checks that each candidate returns its output's shape and dtype."""
    recorded: list[tuple[str, tuple[Any, ...]]] = []

    def function(self: CudaProgram, name: str) -> Callable[..., None]:
        def launch(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], shared_mem: int = 0) -> None:
            recorded.append((name, (grid, block, args, shared_mem)))

        return launch

    registry.ensure_loaded()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CudaProgram, "function", function)
        for op_name, spec in workloads:
            op = registry.get(op_name)
            ts = op.cuda
            values = op.normalize(spec, devices="cuda")
            inputs = tuple(op.make(values, np, np.random.default_rng(0)))
            expected = ts[ts.stack_reference()].fn(*inputs) if check_reference else None
            for impl in ts.implementations[1:]:
                recorded.clear()
                trial = ts.generate_inputs(inputs)
                out = impl.fn(*trial)
                where = f"{op_name} {impl.name} {op.label(values)}"
                if expected is not None:
                    assert (out.shape, out.dtype) == (expected.shape, expected.dtype), where
                assert len(recorded) == 1, f"{where}: {len(recorded)} launches"
                entry, (grid, block, args, shared_mem) = recorded[0]
                yield Launch(where, op_name, impl.name, entry.rsplit("_", 1)[0], entry, tuple(grid), tuple(block),
                             tuple(args), int(shared_mem), tuple(trial), out)


def launch_configurations(launches: list[Launch]) -> dict[tuple[str, tuple[int, ...], int], str]:
    """(entry point, block, dynamic shared memory) -> the first candidate/workload that launches it so."""
    found: dict[tuple[str, tuple[int, ...], int], str] = {}
    for launch in launches:
        found.setdefault((launch.name, launch.block, launch.shared_mem), launch.where)
    return found


def all_cuda_dtypes() -> set[str]:
    registry.ensure_loaded()
    return {d for name in registry.names() for d in registry.get(name).dtypes.get("cuda", ())}
