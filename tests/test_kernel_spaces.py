"""The builtin host kernels' spaces: every config of every space is correct on awkward workloads, and the hand-
picked parameters of earlier versions are configs of them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import farm
from farm_kernels import registry

CLIENT = farm.HostClient(0)
registry.ensure_loaded()
SPECS: dict[str, list[dict[str, Any]]] = {
    "matmul": [dict(m=1, n=1, k=1, dtype="float64"), dict(m=131, n=7, k=33, dtype="float32", layout="a_transposed")],
    "softmax": [dict(rows=1, cols=1, dtype="float32"), dict(rows=37, cols=2053, dtype="float64", layout="strided")],
    "reduce_sum": [dict(rows=1, cols=1, axis=1, dtype="float64"), dict(rows=4099, cols=5, axis=0, dtype="float32")],
    "transpose": [dict(rows=1, cols=1, dtype="float32"), dict(rows=261, cols=67, dtype="float64")],
    "bias_gelu_fusion": [dict(rows=1, cols=1, dtype="float64"), dict(rows=67, cols=4099, dtype="float32")],
}
OLD_NAMES = {
    "matmul": ["row_panels[height=32]", "row_panels[height=64]", "row_panels[height=128]"],
    "transpose": ["row_blocks[height=16]", "row_blocks[height=64]", "tiles[rows=32,cols=32]", "tiles[rows=128,cols=128]"],
    "reduce_sum": ["chunked[chunk=256]"],
    "softmax": ["online[chunk=512]", "row_chunks[kib=64]", "row_chunks[kib=256]"],
    "bias_gelu_fusion": ["fused_row_chunks[kib=64]", "fused_row_chunks[kib=1024]"],
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_config_of_every_host_space_matches_the_reference(name: str) -> None:
    op = registry.get(name)
    ts = op.host
    assert ts is not None and ts.spaces, f"{name} has no host space"
    roster = ts.roster()
    positions = [p for s in roster.spaces() for p in range(s.start, s.start + s.size)]
    for spec in SPECS[name]:
        inputs = op.build(spec, CLIENT)
        tolerance = ts.tolerance_for(inputs, farm.Tolerance())
        expected = ts[ts.stack_reference()].fn(*ts.generate_inputs(inputs))
        for p in positions:
            impl = ts[roster.indices[p]]
            assert impl.name == roster[p].name
            check = farm.compare_outputs(expected, impl.fn(*ts.generate_inputs(inputs)), tolerance)
            assert check.passed, f"{name} {spec}: {impl.name}: {check.problem}"


@pytest.mark.parametrize("name", sorted(OLD_NAMES))
def test_the_parameters_once_chosen_by_hand_are_configs_of_the_spaces(name: str) -> None:
    roster = registry.get(name).host.roster()
    for old in OLD_NAMES[name]:
        position = roster.position(old)
        assert position is not None and roster[position].name == old and roster[position].eligible


def test_a_host_space_search_records_how_many_configs_it_evaluated() -> None:
    op = registry.get("reduce_sum")
    inputs = op.build(dict(rows=300, cols=7, axis=0, dtype="float64"), CLIENT)
    policy = farm.StackPolicy(samples=3, warmups=1, strategy="random", max_configs=3, seed=4)
    tuned = farm.tune(op.host, inputs, policy=policy)
    assert tuned.report is not None
    assert (tuned.report.evaluated, tuned.report.space_size, tuned.report.strategy) == (3, 7, "random")
    np.testing.assert_allclose(tuned.fn(*inputs), np.sum(inputs[0], axis=0), rtol=1e-9)
