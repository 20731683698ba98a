"""The operation registry: builtin operations, users' own modules, entry points, and what it rejects."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import farm
from farm.errors import ConfigError
from farm_kernels import registry
from farm_kernels.registry import Registry

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "kernels.md"

USER_MODULE = '''
import numpy as np

from farm import TunableSet, Tolerance, array_signature
from farm_kernels import Operation, dim

scale_rows = TunableSet("scale_rows", signature=array_signature,
                        tolerance=lambda x, s: Tolerance(absolute=1e-6, relative=1e-6))


@scale_rows.reference
def broadcast(x, s):
    return x * s[:, None]


@scale_rows.candidate(group=0)
def einsum(x, s):
    return np.einsum("ij,i->ij", x, s)


def make(spec, xp, rng):
    x = rng.standard_normal((spec["rows"], spec["cols"])).astype(spec["dtype"])
    s = rng.standard_normal(spec["rows"]).astype(spec["dtype"])
    return xp.asarray(x), xp.asarray(s)


OPERATIONS = [
    Operation("scale_rows", host=scale_rows, cuda=None, fields=(dim("rows"), dim("cols")),
              dtypes={"cpu": ("float32", "float64")}, make=make),
]
'''


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Registry:
    """An empty process-wide registry for the test (the module-level functions use it)."""
    reg = Registry()
    monkeypatch.setattr(registry, "_default", reg)
    return reg


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Write a module into a temporary folder on sys.path; return its unique name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(source: str, name: str | None = None) -> str:
        name = name or f"user_ops_{uuid.uuid4().hex}"
        path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(tmp_path).parents:
            if str(parent) != ".":
                (tmp_path / parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(source), encoding="utf-8")
        importlib.invalidate_caches()
        names.append(name)
        return name

    yield write
    for top in {name.split(".")[0] for name in names}:
        for loaded in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            sys.modules.pop(loaded, None)


def test_the_builtin_operations_load_once_however_often_they_are_asked_for(fresh: Registry) -> None:
    first = registry.ensure_loaded()
    assert first == ("bias_gelu_fusion", "matmul", "reduce_sum", "softmax", "transpose")
    matmul = registry.get("matmul")
    registry.load_builtin()
    registry.load_module("farm_kernels.matmul")
    assert registry.ensure_loaded(("farm_kernels.softmax",)) == first
    assert registry.get("matmul") is matmul


def test_an_operation_from_a_temporary_module_is_registered_built_and_tuned(fresh: Registry, write_module) -> None:
    name = write_module(USER_MODULE)
    assert "scale_rows" in registry.ensure_loaded([name])
    assert registry.ensure_loaded([name]) == registry.names()  # the second load is a no-op
    op = registry.get("scale_rows")
    assert op.devices == ("cpu",) and fresh.origin("scale_rows") == name
    client = farm.HostClient(0)
    x, s = op.build({"rows": 5, "cols": 3, "dtype": "float64"}, client)
    tuner = farm.enable_stack_autotune(farm.StackPolicy(samples=3, warmups=1))
    out = farm.try_execute_stack("scale_rows", "cpu", client, op.tunable("cpu"), (x, s))
    np.testing.assert_allclose(out, x * s[:, None])
    assert {c.name for c in tuner.reports()[-1].candidates} == {"broadcast", "einsum"}


def test_a_module_that_registers_at_import_is_loaded_once(fresh: Registry, write_module) -> None:
    source = USER_MODULE.replace("OPERATIONS = [", "from farm_kernels import register\n\nregister(").replace(
        "make=make),\n]", "make=make))"
    )
    name = write_module(source)
    registry.load_module(name)
    registry.load_module(name)
    assert registry.names() == ("scale_rows",)
    assert fresh.origin("scale_rows") == name


def test_a_second_operation_with_a_taken_name_is_rejected_naming_the_operation(fresh: Registry, write_module) -> None:
    first = write_module(USER_MODULE)
    second = write_module(USER_MODULE)
    registry.load_module(first)
    with pytest.raises(ConfigError, match=rf"operation 'scale_rows' is already registered \(from {first}\)") as raised:
        registry.load_module(second)
    assert raised.value.field == "name" and raised.value.value == "scale_rows"


def test_a_user_operation_cannot_take_a_builtin_name(fresh: Registry, write_module) -> None:
    registry.ensure_loaded()
    name = write_module(USER_MODULE.replace('Operation("scale_rows"', 'Operation("matmul"'))
    with pytest.raises(ConfigError, match=r"operation 'matmul' is already registered \(from farm_kernels.matmul\)"):
        registry.ensure_loaded([name])


def test_an_operation_without_a_reference_is_rejected_naming_the_operation_and_field(fresh: Registry, write_module) -> None:
    name = write_module(USER_MODULE.replace("@scale_rows.reference", "@scale_rows.candidate(group=1)"))
    with pytest.raises(ConfigError, match=r"operation 'scale_rows': its cpu tunable set has no reference") as raised:
        registry.load_module(name)
    assert raised.value.field == "scale_rows.host"
    assert "scale_rows" not in registry.names()


def test_an_operation_without_a_workload_signature_is_rejected(fresh: Registry, write_module) -> None:
    name = write_module(USER_MODULE.replace('TunableSet("scale_rows", signature=array_signature,', 'TunableSet("scale_rows", signature=None,'))
    with pytest.raises(ConfigError, match=r"operation 'scale_rows': its cpu tunable set has no workload signature"):
        registry.load_module(name)


def test_a_workload_spec_the_operation_cannot_build_is_rejected_naming_operation_and_field(fresh: Registry) -> None:
    registry.ensure_loaded()
    with pytest.raises(ConfigError) as raised:
        registry.check_workload("softmax", {"rows": 4, "cols": 4, "dtype": "float64"}, "catalog.toml",
                                devices=["cuda"], prefix="problems[2].workloads[0]")
    assert raised.value.field == "problems[2].workloads[0].dtype"
    assert "softmax does not support dtype float64 on cuda (float16, float32)" in str(raised.value)
    with pytest.raises(ConfigError, match=r"unknown operation 'gemm' \(known: bias_gelu_fusion, matmul") as unknown:
        registry.check_workload("gemm", {}, "catalog.toml", prefix="problems[3]")
    assert unknown.value.field == "problems[3].operation"


def test_an_unknown_operation_lists_the_known_names(fresh: Registry) -> None:
    registry.ensure_loaded()
    with pytest.raises(ConfigError, match=r"unknown operation 'softmaxx' \(known: bias_gelu_fusion, matmul, reduce_sum, softmax, transpose\)"):
        registry.get("softmaxx")


def test_a_module_that_cannot_be_imported_is_named_in_the_error(fresh: Registry, write_module) -> None:
    with pytest.raises(ConfigError, match=r"'no_such_ops_module'.*cannot import operations module: ModuleNotFoundError"):
        registry.load_module("no_such_ops_module")
    broken = write_module("raise RuntimeError('the plugin is broken')\n")
    with pytest.raises(ConfigError, match=r"RuntimeError: the plugin is broken") as raised:
        registry.load_module(broken)
    assert raised.value.field == "module" and raised.value.value == broken


def test_operations_must_be_a_sequence_of_operations(fresh: Registry, write_module) -> None:
    name = write_module("OPERATIONS = ['matmul']\n")
    with pytest.raises(ConfigError, match=r"expected a kernels.Operation, got str") as raised:
        registry.load_module(name)
    assert raised.value.field == f"{name}.OPERATIONS"


def test_entry_points_of_group_farm_kernels_are_discovered_once(fresh: Registry, write_module, monkeypatch) -> None:
    module = write_module(USER_MODULE)
    other = write_module(USER_MODULE.replace('"scale_rows"', '"scale_cols"'))
    calls = []

    def entry_points(group: str) -> list[EntryPoint]:
        calls.append(group)
        return [
            EntryPoint(name="user", value=module, group=group),
            EntryPoint(name="object", value=f"{other}:OPERATIONS", group=group),
        ]

    monkeypatch.setattr(registry, "entry_points", entry_points)
    names = registry.ensure_loaded()
    registry.ensure_loaded()
    assert {"scale_rows", "scale_cols", "matmul"} <= set(names)
    assert calls == ["farm.kernels"]
    assert fresh.origin("scale_cols").startswith("entry point 'object'")


def test_a_broken_entry_point_names_itself(fresh: Registry, monkeypatch) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda group: [EntryPoint("bad", "no_such_ops_module:OPS", group)])
    with pytest.raises(ConfigError, match=r"entry point 'bad' = 'no_such_ops_module:OPS' \(group farm.kernels\)"):
        registry.load_entry_points()


def test_the_builtin_checksums_are_the_same_in_a_fresh_process(fresh: Registry) -> None:
    registry.ensure_loaded()
    here = {name: [registry.get(name).tunable(k).checksum() for k in ("cpu", "cuda")] for name in registry.names()}
    code = (
        "from farm_kernels import registry; registry.ensure_loaded(); "
        "print({n: [registry.get(n).tunable(k).checksum() for k in ('cpu', 'cuda')] for n in registry.names()})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, timeout=60)
    assert out.stdout.strip() == str(here)
    assert "cupy" not in sys.modules


def docs_example() -> tuple[str, str]:
    """The worked example of docs/kernels.md: (module path, source) of its first ```python block with a path."""
    text = DOCS.read_text(encoding="utf-8")
    match = re.search(r"```python\n# (\S+\.py)\n(.*?)```", text, re.S)
    assert match, "docs/kernels.md has no worked example"
    return match.group(1), match.group(2)


def test_the_worked_example_of_the_docs_registers_builds_and_tunes(fresh: Registry, write_module) -> None:
    path, source = docs_example()
    module = write_module(source, name=f"docs_{uuid.uuid4().hex}." + Path(path).stem)
    registry.ensure_loaded([module])
    text = DOCS.read_text(encoding="utf-8")
    assert "--kernels" in text and '[project.entry-points."farm.kernels"]' in text
    new = [name for name in registry.names() if fresh.origin(name) == module]
    assert new, "the worked example registered no operation"
    client = farm.HostClient(0)
    farm.enable_stack_autotune(farm.StackPolicy(samples=3, warmups=1))
    for name in new:
        op = registry.get(name)
        spec = {f.name: 8 if f.kind is int else op.dtypes["cpu"][0] for f in op.spec_fields if f.required}
        op.check_spec(spec, devices="cpu")
        inputs = op.build(spec, client)
        farm.try_execute_stack(name, "cpu", client, op.tunable("cpu"), inputs)
    report = farm.stack_autotuner().reports()[-1]
    assert all(c.verified for c in report.candidates)
