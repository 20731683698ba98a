"""A run budget in device seconds on the embedded farm (real worker code on replay devices, the coordinator's run
loop, the local cache): the allocator gives every problem its first round, then the most device seconds to the
problem the fleet runs most; the run stops sending at its budget and publishes the best decided winner of every
problem it touched, and those it never started fail saying so; `farm tune` says what the budget bought."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from farm_helpers import write_catalog
from rich.console import Console
from servers import farm_env
from test_replay_farm import farm, write_recording

from farm.errors import ConfigError
from farm.replay import load
from farm_cli.parts import embedded_parts
from farm_coordinator.catalog import load_catalog
from farm_coordinator.run import RunOptions, tune
from farm_coordinator.runbudget import Spent, spent_note
from farm_coordinator.runview import ConsoleObserver
from farm_fleet.settings import Settings
from farm_kernels import recorded

BEST = {"A": (64, 4, 0), "B": (32, 2, 1), "C": (16, 4, 0), "D": (128, 2, 0)}
WEIGHTS = {"A": 100.0, "B": 1.0, "C": 1.0, "D": 1.0}
POLICY = ('[policy]\nsamples = 5\nwarmups = 1\nbudget = 60.0\nstrategy = "random"\nseed = 1\n'
          'max_relative_mad = 1.0\n')


def catalog_of(folder: Path, run_budget: float | None) -> tuple[Path, dict[str, Path]]:
    """Four recordings of 32 configs (on four recorded GPUs), the first weighted 100, the others 1."""
    (folder / "recordings").mkdir(parents=True, exist_ok=True)
    paths = {gpu: write_recording(folder / "recordings" / f"vector_add_{gpu}.json", f"GPU {gpu}", best, i + 1)
             for i, (gpu, best) in enumerate(BEST.items())}
    text = POLICY + (f"run_budget = {run_budget}\n" if run_budget is not None else "")
    for gpu in BEST:
        text += f'\n[[problems]]\nrecording = "recordings/vector_add_{gpu}.json"\nweight = {WEIGHTS[gpu]}\n'
    catalog = folder / "catalog.toml"
    catalog.write_text(text)
    return catalog, paths


def embedded_run(folder: Path, run_budget: float | None):
    catalog_path, paths = catalog_of(folder, run_budget)
    catalog = load_catalog(catalog_path)
    parts = embedded_parts(Settings(), tuple(f"replay:{p}" for p in paths.values()), folder / "cache", ())
    with (folder / "log.txt").open("w") as log:
        summary = tune(catalog, dataclasses.replace(parts, observer=ConsoleObserver(Console(file=log, width=200))),
                       Settings())
    fingerprints = {recorded.fingerprint_of(load(p)): gpu for gpu, p in paths.items()}
    return summary, fingerprints


def test_a_run_stops_at_its_budget_and_publishes_every_problem_it_touched(tmp_path: Path) -> None:
    full, fingerprints = embedded_run(tmp_path / "full", None)
    assert full.published == 4 and full.budget is None
    budget = round(full.device_seconds / 4, 3)  # a quarter of what the whole catalog costs
    cut, _ = embedded_run(tmp_path / "cut", budget)
    spent = cut.budget
    assert isinstance(spent, Spent) and spent.budget == budget
    # It stopped sending at its budget: what was in flight then finished (two groups per device at most).
    assert budget <= spent.bought.spent < full.device_seconds / 2
    # Every problem got its reference and first round, so every one is touched and published, cut short.
    assert cut.published == 4 and cut.failures == 0 and len(spent.bought.problems) == 4
    by_gpu = {fingerprints[agg.problem.target.digest]: agg for agg in cut.aggregates}
    notes = [c["note"] for agg in by_gpu.values() if agg.record is not None for c in agg.record.meta["candidates"]]
    assert any(spent_note(budget) in note for note in notes)
    # The problem the fleet runs most got the most device seconds.
    seconds = {fingerprints[cut_pid_digest(cut, pid)]: s for pid, s, _ in spent.bought.problems}
    assert max(seconds, key=lambda gpu: seconds[gpu]) == "A" and all(s > 0 for s in seconds.values())
    assert spent.bought.saved > 0 and spent.bought.share is not None and 0 < spent.bought.share <= 1
    lines = spent.lines()
    assert lines[0].startswith(f"budget: {spent.bought.spent:,.1f} of {budget:g} device s spent on 4 problems")


def cut_pid_digest(summary, pid: str) -> str:
    return next(s.target.digest for s in summary.problems if s.problem_id == pid)


def test_a_run_budget_that_is_not_a_positive_number_is_refused_naming_the_file_and_field(tmp_path: Path) -> None:
    catalog, _ = catalog_of(tmp_path, None)
    catalog.write_text(catalog.read_text().replace("[policy]\n", "[policy]\nrun_budget = -3\n"))
    with pytest.raises(ConfigError, match=r"catalog.toml: field 'policy.run_budget' = -3: must be a number of device"):
        load_catalog(catalog)
    assert dataclasses.replace(load_catalog(catalog_of(tmp_path / "ok", 12.5)[0])).run_budget == 12.5


@pytest.mark.parametrize("value", [-3, 0, float("inf"), float("nan"), True])
def test_a_run_options_budget_that_is_not_a_positive_number_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(ConfigError, match=r"RunOptions: field 'budget_device_seconds' = .*: must be a number of device"):
        RunOptions(budget_device_seconds=value)  # type: ignore[arg-type]


def test_farm_tune_says_what_its_budget_bought(tmp_path: Path) -> None:
    catalog, paths = catalog_of(tmp_path, None)
    env = {**farm_env(), "FARM_KERNEL_CACHE": str(tmp_path / "kcache"), "COLUMNS": "300"}
    devices = [arg for p in paths.values() for arg in ("--device", f"replay:{p}")]
    done = farm("tune", str(catalog), "--budget-device-seconds", "0.05", "--json", *devices, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert out["budget"]["budget"] == 0.05 and out["budget"]["spent"] >= 0.05
    assert len(out["budget"]["problems"]) == 4 and out["budget"]["saved_per_hour"] >= 0
    assert all(d["record"] is not None for d in out["decisions"])
    again = farm("tune", str(catalog), "--budget-device-seconds", "0.05", "--force", *devices, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "budget: " in again.stdout and "of 0.05 device s spent on 4 problems; fleet time saved" in again.stdout
    bad = farm("tune", str(catalog), "--budget-device-seconds", "0", *devices, env=env, cwd=tmp_path)
    assert bad.returncode == 2, bad.stderr
    assert "farm tune: field '--budget-device-seconds' = 0.0: must be a number of device seconds > 0" in bad.stderr


SCALE = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 2000, dtype = "float64" }, { n = 13, dtype = "float64" }, { n = 100, dtype = "float64" },
             { n = 200, dtype = "float64" }, { n = 300, dtype = "float64" }]
"""


@pytest.mark.parametrize("where", ["catalog", "options"])
def test_the_problems_a_spent_budget_never_started_fail_saying_so_and_the_touched_ones_publish(
        tmp_path: Path, where: str) -> None:
    """The budget of the catalog's [policy], or of ``RunOptions`` (``farm tune --budget-device-seconds``)."""
    budget = "run_budget = 1e-6\n" if where == "catalog" else ""
    path = write_catalog(tmp_path / "c.toml", SCALE, policy="samples = 3\nwarmups = 1\n" + budget)
    catalog = load_catalog(path, ("farm_testops",))
    parts = embedded_parts(Settings(), ("cpu:0",), tmp_path / "cache", ("farm_testops",))
    options = RunOptions(budget_device_seconds=1e-6 if where == "options" else None)
    with (tmp_path / "log.txt").open("w") as log:
        observer = ConsoleObserver(Console(file=log, width=200))
        summary = tune(catalog, dataclasses.replace(parts, observer=observer), Settings(), options)
    # One device: two groups in flight at most, so two problems started before the first result spent the budget.
    assert summary.published == 2 and summary.failures == 3
    assert all(spent_note(1e-6) in reason for _, reason in summary.failed)
    assert isinstance(summary.budget, Spent) and len(summary.budget.bought.problems) == 5
