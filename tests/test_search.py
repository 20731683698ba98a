"""The one search (``farm.search``): its admission rule, and its budget rule in-process and on the farm.

The budget test runs the same problem (a reference and three groups of two candidates) through the in-process
controller and through the embedded farm (the coordinator's real run loop, ``LocalDispatcher`` and the workers'
real group task on the host runtime). Candidates are fake-timed: each call advances a fake clock that only the
search's budget reads, by a cost that is an exact binary fraction, so both runs see the same times and the test
compares outcomes (which candidates were timed, verdicts, flags, seconds charged) rather than wall-clock limits.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeClock, FakeRunner

from farm import HostClient, StackTuner, TunableSet, array_signature
from farm.adapter import RuntimeTrials, prepare
from farm.identity import Candidate
from farm.policy import StackPolicy
from farm.search import admit, search
from farm.stores.local import FARM, LocalStore
from farm.trials import TrialVerdict
from farm_coordinator.catalog import load_catalog
from farm_coordinator.dispatch import LocalDispatcher
from farm_coordinator.fleet import LocalFleet
from farm_coordinator.ports import Parts
from farm_coordinator.run import RunOptions, tune
from farm_fleet.protocol import STATUS_NOT_TRIED, GroupResult, GroupTask
from farm_fleet.results import MemoryResults
from farm_fleet.settings import Settings
from farm_kernels import registry
from farm_kernels.operation import Operation, dim
from farm_workers.tasks import WorkerContext, run_group

# -- admission: pre-trial skips and max_candidates, written once ------------------------------------------------


def test_admit_counts_the_reference_and_not_the_skipped() -> None:
    cands = (Candidate("ref"), Candidate("off", eligible=False), Candidate("a"), Candidate("b"), Candidate("c"))
    admitted, refused = admit(cands, 0, StackPolicy(max_candidates=3), banned={"b"})
    assert admitted == [2, 4]
    assert [(o.name, o.kind, o.note, o.budget_exhausted) for o in refused] == [
        ("off", TrialVerdict.SKIPPED, "not eligible", False),
        ("b", TrialVerdict.SKIPPED, "banned for this key after a failure or regression", False),
    ]
    admitted, refused = admit(cands, 0, StackPolicy(max_candidates=2))
    assert admitted == [2]
    assert [(o.name, o.kind, o.budget_exhausted) for o in refused][1:] == [
        ("b", TrialVerdict.NOT_TRIED, True), ("c", TrialVerdict.NOT_TRIED, True)]
    assert refused[1].failure == "not tried: max_candidates 2 reached"


def test_a_search_that_does_not_charge_the_reference_starts_its_budget_after_it(monkeypatch) -> None:
    import farm.search
    import farm.trials

    clock = FakeClock()
    monkeypatch.setattr(farm.search, "time", clock)
    monkeypatch.setattr(farm.trials, "time", clock)
    policy = StackPolicy(warmups=1, samples=3, budget=0.9)
    cands = (Candidate("ref"), Candidate("a"))
    # The reference's timing takes 4 x 0.25 s, more than the budget; the candidate's last pair starts at 0.875 s.
    charged = search(FakeRunner({0: 0.25, 1: 0.125}, clock=clock), policy, 0, cands, [1])
    assert charged.outcomes[0].kind is TrialVerdict.NOT_TRIED and charged.budget_exhausted
    assert charged.spent == 1.0
    free = search(FakeRunner({0: 0.25, 1: 0.125}, clock=clock), policy, 0, cands, [1], charge_reference=False)
    assert free.outcomes[0].kind is TrialVerdict.PASSED and not free.budget_exhausted
    assert free.spent == 1.25


# -- the budget bounds a problem's whole search, in-process and on the farm alike -------------------------------

REF_COST = 0.125
CAND_COST = 0.0625
BUDGET = 2.5
# max_samples = samples: a fixed number of pairs per candidate keeps the budget arithmetic exact.
POLICY = StackPolicy(warmups=1, samples=3, max_samples=3, budget=BUDGET, max_relative_mad=1e9)
# The longest stretch between two budget checks: a candidate's warmup and validation (or one pair).
ONE_TRIAL = CAND_COST + (REF_COST + CAND_COST)

clock = FakeClock()
calls: Counter[str] = Counter()


def reference(x):
    clock.advance(REF_COST)
    calls["reference"] += 1
    return x * 2.0


def candidate(name: str):
    def run(x):
        clock.advance(CAND_COST)
        calls[name] += 1
        return x + x

    run.__name__ = name
    return run


NAMES = [f"g{g}_{i}" for g in range(3) for i in range(2)]


@pytest.fixture(scope="module")
def operation():
    tunable = TunableSet("budget_test_op", signature=array_signature)
    tunable.add(reference, name="reference", reference=True)
    for name in NAMES:
        tunable.add(candidate(name), name=name, group=int(name[1]), identity=name)
    op = Operation(name="budget_test_op", host=tunable, cuda=None, fields=(dim("n"),), dtypes={"cpu": ("float64",)},
                   make=lambda spec, xp, rng: (xp.asarray(rng.random(spec["n"])),))
    registry.ensure_loaded()
    registry.register(op)
    yield op
    registry.unregister("budget_test_op")


@pytest.fixture
def fake_time(monkeypatch):
    import farm.search
    import farm.trials

    monkeypatch.setattr(farm.search, "time", clock)
    monkeypatch.setattr(farm.trials, "time", clock)
    calls.clear()
    return clock


def in_process(op: Operation) -> tuple[dict[str, tuple[int, str]], float, bool]:
    client = HostClient(0)
    tuner = StackTuner(POLICY)
    inputs = op.build({"n": 16, "dtype": "float64"}, client)
    prepared = prepare(tuner, op.name, "cpu", client, op.host, inputs)
    runner = RuntimeTrials(client, op.host, inputs, prepared.indices, POLICY.timing)
    started = clock.mono
    tuner.select_request(prepared.request, runner)
    (report,) = tuner.reports()
    notes = {c.name: (c.samples, c.note) for c in report.candidates if c.name != "reference"}
    return notes, clock.mono - started, report.budget_exhausted


def on_the_farm(op: Operation, tmp_path: Path) -> tuple[dict[str, tuple[int, str]], list[GroupResult], bool]:
    catalog_path = tmp_path / "catalog.toml"
    catalog_path.write_text(
        "[policy]\nwarmups = 1\nsamples = 3\nmax_samples = 3\nbudget = 2.5\nmax_relative_mad = 1e9\n"
        '[[problems]]\noperation = "budget_test_op"\nworkloads = [{ n = 16, dtype = "float64" }]\n'
    )
    catalog = load_catalog(catalog_path)
    settings = Settings()
    ctx = WorkerContext(client=HostClient(0), results=MemoryResults(), settings=settings, worker_id="local-cpu0")
    fleet = LocalFleet([ctx])
    sent: list[GroupTask] = []
    results: list[GroupResult] = []

    def execute(task: GroupTask, queue: str) -> GroupResult:
        sent.append(task)
        result = GroupResult.from_dict(run_group(task.to_dict(), fleet.context_for(task, queue)))
        results.append(result)
        return result

    parts = Parts(fleet, LocalDispatcher(execute), LocalStore(tmp_path / "cache", owner=FARM))
    summary = tune(catalog, parts, settings, RunOptions(poll=0.0))
    (agg,) = summary.aggregates
    assert agg.record is not None
    # Groups go one after the other: the first carries the whole budget, the next what the first left.
    assert [t.group for t in sent] == ["g0", "g1"]
    assert sent[0].budget is None and sent[1].budget == BUDGET - results[0].search_seconds
    assert agg.results["g2"].status == STATUS_NOT_TRIED
    assert [c["name"] for c in agg.record.meta["candidates"]] == [j.name for j in agg.judged]
    notes = {j.name: (j.samples, j.note) for j in agg.judged}
    return notes, results, agg.budget_exhausted


def test_a_problem_with_three_groups_spends_its_budget_once_on_the_farm_as_in_process(operation, fake_time, tmp_path):
    local_notes, local_spent, local_exhausted = in_process(operation)
    local_calls = {name: calls[name] for name in NAMES}
    calls.clear()
    farm_notes, results, farm_exhausted = on_the_farm(operation, tmp_path)
    farm_calls = {name: calls[name] for name in NAMES}
    farm_spent = sum(r.search_seconds for r in results)

    # The budget stops both searches, and both spend at most the budget plus one trial.
    assert local_exhausted and farm_exhausted
    assert local_spent <= BUDGET + ONE_TRIAL
    assert farm_spent <= BUDGET + ONE_TRIAL
    assert farm_spent == local_spent
    # The same candidates are timed, cut off and left untried, with the same notes.
    assert farm_calls == local_calls
    timed = [n for n in NAMES if local_calls[n] > 0]
    assert timed == ["g0_0", "g0_1", "g1_0"]
    assert {n: samples for n, (samples, _) in farm_notes.items()} == {n: s for n, (s, _) in local_notes.items()}
    # (The reference's output is computed once and reused by every validation: g1_0 gets two pairs in before the
    # budget cuts it during sampling.)
    assert [local_notes[n][0] for n in timed] == [3, 3, 2]
    untried = ("g1_0", "g1_1", "g2_0", "g2_1")  # timed ones' notes carry measured (real) ratios
    assert [farm_notes[n] for n in untried] == [local_notes[n] for n in untried] == [
        (2, "rejected: budget of 2.5s exhausted during sampling")] + [(0, "not tried: budget of 2.5s exhausted")] * 3
    # A farm of three budgets would have timed every candidate: the reference is the only other cost.
    assert sum(farm_calls.values()) < len(NAMES) * (1 + 1 + 2 * POLICY.samples)
    assert np.isfinite(farm_spent)
