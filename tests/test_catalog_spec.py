"""A workload spec is normalized once, at catalog load: the plan identifies problems by it and carries it to the
workers in every group task without normalizing it again."""

from __future__ import annotations

from pathlib import Path

from farm_coordinator.catalog import Workload, load_catalog
from farm_coordinator.plan import Planner, Target
from farm_kernels.operation import Operation

CATALOG = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 13, dtype = "float64" }, { n = 14, dtype = "float64", seed = 3 }]
"""


def counting(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = Operation.normalize

    def normalize(self, spec, *args, **kw):
        calls.append(1)
        return original(self, spec, *args, **kw)

    monkeypatch.setattr(Operation, "normalize", normalize)
    return calls


def test_the_catalog_normalizes_each_spec_once_and_the_plan_never_again(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CATALOG)
    calls = counting(monkeypatch)
    catalog = load_catalog(path, ("farm_testops",))
    assert len(calls) == 2  # one per workload
    first, second = catalog.workloads
    assert first.spec == {"n": 13, "dtype": "float64"}  # as written: labels and reports show it so
    assert first.normalized == {"n": 13, "dtype": "float64", "seed": 0}
    planner = Planner(catalog, [Target("fp", "fp", "cpu")], "run")
    problems = [planner.problem(target, workload) for target, workload in planner.pairs()]
    assert len(calls) == 2
    assert [task.spec for p in problems for task in p.tasks][:1] == [first.normalized]
    assert {task.spec["seed"] for p in problems for task in p.tasks} == {0, 3}


def test_a_spelled_out_default_is_the_same_problem(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CATALOG.replace(', { n = 14, dtype = "float64", seed = 3 }', ""))
    catalog = load_catalog(path, ("farm_testops",))
    planner = Planner(catalog, [Target("fp", "fp", "cpu")], "run")
    (workload,) = catalog.workloads
    spelled = Workload(workload.operation, workload.devices, {**workload.spec, "seed": 0}, "by hand")
    target = Target("fp", "fp", "cpu")
    assert planner.problem_id(target, spelled) == planner.problem_id(target, workload)
    assert spelled.normalized == workload.normalized  # a workload made by hand is normalized when first asked
