"""The builtin operations on the host: every candidate against its reference, the input builders, the specs,
the signatures and the checksums."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import farm
from farm.adapter import problem_for
from farm.errors import ConfigError
from farm.identity import Scope
from farm_kernels import bias_gelu, matmul, reduce_sum, registry, softmax, transpose
from farm_kernels.operation import Operation

OPERATIONS = ("matmul", "softmax", "reduce_sum", "transpose", "bias_gelu_fusion")
PRIMES = (1, 2, 3, 7, 13, 31, 127, 257)
CLIENT = farm.HostClient(0)

# Edge workloads per operation: size one, primes, every layout and dtype.
EDGE_SPECS: dict[str, list[dict[str, Any]]] = {
    "matmul": [
        dict(m=m, n=n, k=k, dtype=d, layout=lay)
        for (m, n, k) in ((1, 1, 1), (1, 31, 7), (13, 1, 127), (31, 7, 257))
        for d in ("float32", "float64")
        for lay in matmul.LAYOUTS
    ],
    "softmax": [
        dict(rows=r, cols=c, dtype=d, layout=lay)
        for (r, c) in ((1, 1), (1, 1031), (13, 1), (127, 523))
        for d in ("float32", "float64")
        for lay in ("contiguous", "transposed", "strided")
    ],
    "reduce_sum": [
        dict(rows=r, cols=c, axis=a, dtype=d, layout=lay)
        for (r, c) in ((1, 1), (1, 1031), (13, 1), (127, 523), (3, 20011))
        for a in (0, 1)
        for d in ("float32", "float64")
        for lay in ("contiguous", "transposed", "strided")
    ],
    "transpose": [
        dict(rows=r, cols=c, dtype=d, layout=lay)
        for (r, c) in ((1, 1), (1, 1031), (13, 1), (127, 523))
        for d in ("float32", "float64")
        for lay in transpose.LAYOUTS
    ],
    "bias_gelu_fusion": [
        dict(rows=r, cols=c, dtype=d, layout=lay)
        for (r, c) in ((1, 1), (1, 1031), (13, 1), (127, 523))
        for d in ("float32", "float64")
        for lay in ("contiguous", "transposed", "strided")
    ],
}


@pytest.fixture(scope="module", autouse=True)
def _builtin() -> None:
    registry.ensure_loaded()


def arrays(values: Any) -> list[np.ndarray]:
    return [v for v in (values if isinstance(values, tuple) else (values,)) if isinstance(v, np.ndarray)]


def check_every_candidate(name: str, spec: dict[str, Any]) -> None:
    """Run every host candidate on fresh copies of the spec's inputs and compare it with the reference."""
    op = registry.get(name)
    ts = op.host
    assert ts is not None
    inputs = op.build(spec, CLIENT)
    tolerance = ts.tolerance_for(inputs, farm.Tolerance())
    reference_index = ts.stack_reference()
    expected = ts[reference_index].fn(*ts.generate_inputs(inputs))
    for index, impl in enumerate(ts.implementations):
        trial = ts.generate_inputs(inputs)
        before = [a.copy() for a in arrays(trial)]
        out = impl.fn(*trial)
        check = farm.compare_outputs(expected, out, tolerance)
        assert check.passed, f"{name} {spec}: {impl.name}: {check.problem}"
        for a, b in zip(before, arrays(trial), strict=True):
            assert np.array_equal(a, b), f"{name} {spec}: {impl.name} modified its input"
        if index != reference_index:  # np.ascontiguousarray may legitimately return its input
            for a in arrays(trial):
                assert not np.shares_memory(out, a), f"{name} {spec}: {impl.name} returned a view of its input"


@pytest.mark.parametrize("name", OPERATIONS)
def test_every_host_candidate_matches_the_reference_on_size_one_prime_and_non_contiguous_workloads(name: str) -> None:
    for spec in EDGE_SPECS[name]:
        check_every_candidate(name, spec)


dims = st.one_of(st.sampled_from(PRIMES), st.integers(1, 300))
random_settings = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@random_settings
@given(
    m=dims, n=dims, k=dims, dtype=st.sampled_from(matmul.HOST_DTYPES), layout=st.sampled_from(matmul.LAYOUTS),
    seed=st.integers(0, 2**32),
)
def test_every_host_matmul_candidate_matches_the_reference_on_random_workloads(m, n, k, dtype, layout, seed) -> None:
    check_every_candidate("matmul", dict(m=m, n=n, k=k, dtype=dtype, layout=layout, seed=seed))


@random_settings
@given(
    name=st.sampled_from(("softmax", "transpose", "bias_gelu_fusion")), rows=dims, cols=dims,
    dtype=st.sampled_from(("float32", "float64")), layout=st.sampled_from(("contiguous", "transposed", "strided")),
    seed=st.integers(0, 2**32),
)
def test_every_host_rowwise_candidate_matches_the_reference_on_random_workloads(name, rows, cols, dtype, layout, seed) -> None:
    if name == "transpose" and layout == "transposed":
        layout = "strided"
    check_every_candidate(name, dict(rows=rows, cols=cols, dtype=dtype, layout=layout, seed=seed))


@random_settings
@given(
    rows=dims, cols=st.one_of(dims, st.integers(1000, 5000)), axis=st.sampled_from((0, 1)),
    dtype=st.sampled_from(("float32", "float64")), layout=st.sampled_from(("contiguous", "transposed", "strided")),
    seed=st.integers(0, 2**32),
)
def test_every_host_reduce_sum_candidate_matches_the_reference_on_random_workloads(rows, cols, axis, dtype, layout, seed) -> None:
    check_every_candidate("reduce_sum", dict(rows=rows, cols=cols, axis=axis, dtype=dtype, layout=layout, seed=seed))


# -- input builders ---------------------------------------------------------------------------------------


def every_layout_spec(name: str) -> Iterator[dict[str, Any]]:
    op = registry.get(name)
    layouts = next(f.choices for f in op.spec_fields if f.name == "layout")
    base = {"matmul": dict(m=5, n=7, k=3)}.get(name, dict(rows=5, cols=7))
    for layout in layouts:
        yield dict(base, dtype="float32", layout=layout)


@pytest.mark.parametrize("name", OPERATIONS)
def test_two_builds_of_a_spec_never_share_a_writable_buffer(name: str) -> None:
    op = registry.get(name)
    for spec in every_layout_spec(name):
        first, second = arrays(op.build(spec, CLIENT)), arrays(op.build(spec, CLIENT))
        for a in first:
            assert a.flags.writeable
            for b in second:
                assert not np.shares_memory(a, b), f"{name} {spec}"
        for i, a in enumerate(first):
            for b in first[i + 1 :]:
                assert not np.shares_memory(a, b), f"{name} {spec}: two inputs of one build share memory"


@pytest.mark.parametrize("name", OPERATIONS)
def test_trial_inputs_are_fresh_copies_with_the_workload_layout(name: str) -> None:
    op = registry.get(name)
    ts = op.host
    for spec in every_layout_spec(name):
        inputs = op.build(spec, CLIENT)
        one, two = ts.generate_inputs(inputs), ts.generate_inputs(inputs)
        assert ts.stack_workload(one) == ts.stack_workload(inputs) == ts.stack_workload(two)
        for a, b, original in zip(arrays(one), arrays(two), arrays(inputs), strict=True):
            assert np.array_equal(a, original)
            assert not np.shares_memory(a, b) and not np.shares_memory(a, original)


@pytest.mark.parametrize("name", OPERATIONS)
def test_a_spec_builds_the_same_values_for_one_seed_and_other_values_for_another(name: str) -> None:
    op = registry.get(name)
    spec = next(every_layout_spec(name))
    same = zip(arrays(op.build(spec, CLIENT)), arrays(op.build(dict(spec, seed=0), CLIENT)), strict=True)
    assert all(np.array_equal(a, b) for a, b in same)
    other = zip(arrays(op.build(spec, CLIENT)), arrays(op.build(dict(spec, seed=1), CLIENT)), strict=True)
    assert not all(np.array_equal(a, b) for a, b in other)


def test_matmul_layouts_build_the_views_they_name() -> None:
    op = registry.get("matmul")
    built = {layout: op.build(dict(m=5, n=7, k=3, dtype="float64", layout=layout), CLIENT) for layout in matmul.LAYOUTS}
    a, b = built["contiguous"]
    assert a.flags.c_contiguous and b.flags.c_contiguous
    assert built["a_transposed"][0].flags.f_contiguous and built["a_transposed"][1].flags.c_contiguous
    assert built["b_transposed"][1].flags.f_contiguous
    sa, sb = built["strided"]
    assert not (sa.flags.c_contiguous or sa.flags.f_contiguous) and not (sb.flags.c_contiguous or sb.flags.f_contiguous)
    for layout, (x, y) in built.items():  # the same values whatever the layout
        assert np.array_equal(x, a) and np.array_equal(y, b), layout


def test_the_workload_signature_separates_layouts_dtypes_and_parameters() -> None:
    # Size-one axes are left out: there, two layouts are the same memory layout and rightly share a signature.
    signatures = set()
    count = 0
    for name, specs in EDGE_SPECS.items():
        op = registry.get(name)
        for spec in specs:
            if min(v for k, v in spec.items() if k in ("m", "n", "k", "rows", "cols")) > 1:
                signatures.add((name, op.host.stack_workload(op.build(spec, CLIENT))))
                count += 1
    assert count > 40 and len(signatures) == count


# -- specs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "devices", "field", "words"),
    [
        (dict(m=4, n=4, k=4, dtype="int8"), "cpu", "dtype", ["matmul", "int8", "on cpu", "float32, float64"]),
        (dict(m=4, n=4, k=4, dtype="int8"), None, "dtype", ["matmul", "int8", "cuda: float16, float32"]),
        (dict(m=4, n=4, k=4, dtype="float64"), ["cpu", "cuda"], "dtype", ["matmul", "float64 on cuda"]),
        (dict(m=4, n=4, dtype="float32"), None, "k", ["matmul needs workload field k"]),
        (dict(m=4, n=4, k=True, dtype="float32"), None, "k", ["matmul", "integer"]),
        (dict(m=4, n=4, k=0, dtype="float32"), None, "k", ["matmul", "1..16777216"]),
        (dict(m=4, n=4, k=4, dtype="float32", tile=8), None, "tile", ["matmul has no workload field 'tile'"]),
        (dict(m=4, n=4, k=4, dtype="float32", layout="diagonal"), None, "layout", ["matmul", "contiguous"]),
        (dict(m=4, n=4, k=4, dtype="float32", seed=-1), None, "seed", ["matmul", "seed"]),
        (dict(m=65536, n=65536, k=1, dtype="float32"), None, "", ["matmul", "elements", "limit"]),
    ],
)
def test_check_spec_names_the_operation_and_the_field(spec, devices, field, words) -> None:
    with pytest.raises(ConfigError) as raised:
        registry.get("matmul").check_spec(spec, "examples/catalog.toml", devices=devices, prefix="problems[0].workloads[1]")
    error = raised.value
    assert error.source == "examples/catalog.toml"
    assert error.field == "problems[0].workloads[1]" + (f".{field}" if field else "")
    for word in words:
        assert word in str(error)


@pytest.mark.parametrize("name", OPERATIONS)
def test_check_spec_accepts_every_edge_workload_and_fills_in_the_defaults(name: str) -> None:
    op = registry.get(name)
    for spec in EDGE_SPECS[name]:
        op.check_spec(spec, devices="cpu")
    minimal = {f.name: 3 if f.kind is int else "float32" for f in op.spec_fields if f.required}
    values = op.normalize(minimal)
    assert values["seed"] == 0 and set(values) == {f.name for f in op.spec_fields}


def test_building_a_dtype_the_device_lacks_names_the_operation_and_device() -> None:
    with pytest.raises(ConfigError, match=r"matmul does not support dtype float16 on cpu"):
        registry.get("matmul").build(dict(m=2, n=2, k=2, dtype="float16"), CLIENT)


def test_every_builtin_operation_runs_on_cpu_and_cuda_with_a_reference_and_four_candidates_in_groups() -> None:
    for name in OPERATIONS:
        op = registry.get(name)
        assert op.devices == ("cpu", "cuda")
        for kind in op.devices:
            ts = op.tunable(kind)
            assert ts.stack_reference() is not None and ts.has_signature()
            assert len(ts) - 1 >= 4, f"{name} {kind}"
            assert len(list(ts.plan())) >= 2, f"{name} {kind}: candidates in a single priority group"


def test_asking_for_an_unsupported_device_kind_names_the_operation() -> None:
    with pytest.raises(ConfigError, match=r"softmax has no candidates for device kind 'tpu' \(supported: cpu, cuda\)"):
        registry.get("softmax").tunable("tpu")


def test_the_fusion_operation_is_tuned_as_a_graph_and_the_others_as_operators() -> None:
    for name in OPERATIONS:
        op = registry.get(name)
        spec = next(every_layout_spec(name))
        problem = problem_for(name, "cpu", CLIENT, op.host, op.build(spec, CLIENT))
        assert problem.scope is (Scope.GRAPH if name == "bias_gelu_fusion" else Scope.OPERATOR)


# -- tuning through the controller -------------------------------------------------------------------------


SMALL = {
    "matmul": dict(m=33, n=17, k=65, dtype="float32", layout="a_transposed"),
    "softmax": dict(rows=31, cols=67, dtype="float64", layout="strided"),
    "reduce_sum": dict(rows=67, cols=31, axis=0, dtype="float32"),
    "transpose": dict(rows=67, cols=31, dtype="float64"),
    "bias_gelu_fusion": dict(rows=31, cols=67, dtype="float32", layout="transposed"),
}


def test_tuning_each_operation_verifies_every_candidate_and_returns_the_reference_result() -> None:
    tuner = farm.enable_stack_autotune(farm.StackPolicy(samples=3, warmups=1, budget=30.0))
    for name, spec in SMALL.items():
        op = registry.get(name)
        inputs = op.build(spec, CLIENT)
        expected = op.host[op.host.stack_reference()].fn(*op.host.generate_inputs(inputs))
        out = farm.try_execute_stack(name, CLIENT.device_id, CLIENT, op.host, inputs)
        assert farm.compare_outputs(expected, out, op.host.tolerance_for(inputs, farm.Tolerance())).passed
        report = tuner.reports()[-1]
        assert report.workload == op.host.stack_workload(inputs)
        assert len(report.candidates) == len(op.host)
        assert all(c.verified for c in report.candidates), [(c.name, c.note) for c in report.candidates]


def test_a_broken_candidate_defined_by_a_test_is_rejected_and_never_selected() -> None:
    ts = reduce_sum.host_tunable()

    def drops_the_last_element(a: np.ndarray, axis: int) -> np.ndarray:
        return np.add.reduce(a[:-1] if axis == 0 else a[:, :-1], axis=axis)

    ts.add(drops_the_last_element, group=0)
    tuner = farm.enable_stack_autotune(farm.StackPolicy(samples=3, warmups=1))
    inputs = registry.get("reduce_sum").build(dict(rows=1009, cols=64, axis=0, dtype="float32"), CLIENT)
    farm.try_execute_stack("reduce_sum", "cpu", CLIENT, ts, inputs)
    (report,) = tuner.reports()
    broken = next(c for c in report.candidates if c.name == "drops_the_last_element")
    assert broken.note.startswith("rejected: wrong output") and not broken.verified
    assert report.winner != "drops_the_last_element"


# -- identity ---------------------------------------------------------------------------------------------


def test_the_builtin_checksums_are_stable_and_differ_between_operations_and_devices() -> None:
    fresh = [module.host_tunable().checksum() for module in (matmul, softmax, reduce_sum, transpose, bias_gelu)]
    registered = [registry.get(name).host.checksum() for name in OPERATIONS]
    assert fresh == registered
    cuda = [registry.get(name).cuda.checksum() for name in OPERATIONS]
    assert len(set(fresh + cuda)) == 10


def test_a_factory_candidate_parameter_is_part_of_the_checksum() -> None:
    def with_height(height: int) -> str:
        ts = matmul.host_tunable()
        ts.add(matmul.row_panels(height), name="row_panels_extra", group=3, identity=matmul.code_identity(height=height))
        return ts.checksum()

    assert with_height(16) == with_height(16)
    assert with_height(16) != with_height(256)


CANDIDATE_SOURCE = '''
import numpy as np
from farm import TunableSet, array_signature


def helper(x):
    return {helper}


def build():
    from farm_kernels.operation import code_identity

    ts = TunableSet("doubling", signature=array_signature)

    @ts.reference
    def reference(x):
        return x * 2.0

    @ts.candidate(group=0, revision="{revision}")
    def added(x):
        return x + x{change}

    ts.add(uses_helper, group=1, identity=code_identity(helper))
    return ts


def uses_helper(x):
    return helper(x)
'''


@pytest.fixture
def import_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def load(source: str) -> Any:
        name = f"kernels_test_ops_{uuid.uuid4().hex}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        names.append(name)
        importlib.invalidate_caches()
        return importlib.import_module(name)

    yield load
    for name in names:
        sys.modules.pop(name, None)


def test_the_checksum_changes_when_a_candidates_code_revision_or_helper_changes(import_source) -> None:
    def checksum(revision: str = "1", change: str = "", helper: str = "x * 2.0") -> str:
        return import_source(CANDIDATE_SOURCE.format(revision=revision, change=change, helper=helper)).build().checksum()

    base = checksum()
    assert checksum() == base  # the same code in another module: the same checksum
    assert checksum(change=" + 0.0") != base  # the candidate's own source
    assert checksum(revision="2") != base  # its revision
    assert checksum(helper="x + x") != base  # a helper named in its identity


def test_an_operation_must_declare_dtypes_for_exactly_its_device_kinds() -> None:
    with pytest.raises(ConfigError, match="dtypes must list exactly its device kinds"):
        Operation("odd", host=matmul.host_tunable(), cuda=None, fields=(), dtypes={"cuda": ("float32",)},
                  make=matmul.make_inputs)


# -- the example catalog ----------------------------------------------------------------------------------

CATALOG = Path(__file__).resolve().parent.parent / "examples" / "catalog.toml"
OUTPUT_SHAPES = {
    "matmul": lambda s: (s["m"], s["n"]),
    "softmax": lambda s: (s["rows"], s["cols"]),
    "reduce_sum": lambda s: (s["cols"] if s["axis"] == 0 else s["rows"],),
    "transpose": lambda s: (s["cols"], s["rows"]),
    "bias_gelu_fusion": lambda s: (s["rows"], s["cols"]),
}


def test_the_example_catalog_covers_every_operation_with_workloads_that_can_be_validated() -> None:
    import tomllib

    catalog = tomllib.loads(CATALOG.read_text(encoding="utf-8"))
    farm.StackPolicy.from_dict(catalog["policy"])
    seen: dict[tuple[str, str], set[str]] = {}
    for i, problem in enumerate(catalog["problems"]):
        op = registry.get(problem["operation"])
        devices = problem.get("devices", list(op.devices))
        for j, spec in enumerate(problem["workloads"]):
            values = op.normalize(spec, str(CATALOG), devices=devices, prefix=f"problems[{i}].workloads[{j}]")
            for kind in devices:
                seen.setdefault((op.name, kind), set()).add(values.get("layout", "contiguous"))
            out_bytes = np.prod(OUTPUT_SHAPES[op.name](values)) * np.dtype(values["dtype"]).itemsize
            # validation reads back the reference's and the candidate's outputs
            assert 2 * out_bytes <= farm.Tolerance().max_bytes, f"{op.name} {spec}: output too large to validate"
    assert set(seen) == {(name, kind) for name in OPERATIONS for kind in ("cpu", "cuda")}
    for (name, kind), layouts in seen.items():
        assert layouts - {"contiguous"}, f"{name} on {kind}: no non-contiguous workload"
