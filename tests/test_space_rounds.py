"""The farm searches a space in rounds through the coordinator's strategy seam (farm_coordinator.spacestrategy):
table tests of the adapter (pure), and real Redis + real `farm worker` processes for random and bayes searches and
a coordinator interrupted mid-search."""

from __future__ import annotations

from dataclasses import replace

import pytest
from farm_helpers import fleet, write_catalog
from farm_spaceops import OPERATIONS as SPACE_OPERATIONS
from servers import start_worker, wait_worker_ready

from farm.policy import StackPolicy
from farm.trials import Outcome, TrialVerdict
from farm_coordinator.catalog import load_catalog
from farm_coordinator.plan import PlannedProblem, Target
from farm_coordinator.run import tune
from farm_coordinator.runview import ConsoleObserver
from farm_coordinator.spacestrategy import SpaceSearch, group_name, parse_group, strategy_for
from farm_coordinator.strategy import PRIORITY_GROUPS
from farm_fleet.errors import RunInterrupted
from farm_fleet.protocol import GroupResult, GroupTask

SPACE = """
[[problems]]
operation = "farmtest_space"
workloads = [{ n = 2500, dtype = "float64" }]
"""
POLICY = "samples = 5\nwarmups = 1\nbudget = 3.0\nmax_relative_mad = 1.0\n"


def plan_of(workers: int = 2) -> PlannedProblem:
    target = Target("d" * 16, "fp", "cpu", tuple(f"w{i}" for i in range(workers)))
    task = GroupTask("run", "pid", "g0", "farmtest_space", "cpu", {"n": 10}, (("slow_reference", "1"),), {}, "d" * 16)
    return PlannedProblem("pid", target, None, (task,))  # type: ignore[arg-type]


def result(group: str, names: list[str], verdict: TrialVerdict = TrialVerdict.REJECTED) -> GroupResult:
    outcomes = tuple(Outcome(0, n, verdict=verdict) for n in names)
    return GroupResult("run", "pid", group, "ok", outcomes=outcomes)


def search(strategy: str, max_configs: int | None) -> SpaceSearch:
    roster = SPACE_OPERATIONS[0].host.roster()
    return SpaceSearch(StackPolicy(strategy=strategy, max_configs=max_configs, seed=3), lambda op, kind: roster)


def test_group_names_carry_the_round_and_the_roster_position() -> None:
    assert group_name(3, 1042) == "s3.1042"
    assert parse_group("s3.1042") == (3, 1042)
    assert parse_group("g0") is None and parse_group("s3.") is None and parse_group("confirm") is None


def test_the_run_uses_the_space_search_only_for_a_policy_that_bounds_or_samples_the_space() -> None:
    assert strategy_for(StackPolicy()) is PRIORITY_GROUPS
    assert isinstance(strategy_for(StackPolicy(strategy="random")), SpaceSearch)
    assert isinstance(strategy_for(StackPolicy(max_configs=3)), SpaceSearch)


def test_the_planned_groups_run_first_then_as_many_configs_as_the_capacity() -> None:
    s, plan = search("random", 5), plan_of()
    assert [a.group for a in s.propose(plan, {}, frozenset(), 2)] == ["g0"]
    told = {"g0": result("g0", ["slow_reference"])}
    first = s.propose(plan, told, frozenset(), 2)
    assert len(first) == 2 and all(parse_group(a.group)[0] == 0 for a in first)  # type: ignore[index]
    assert all(len(a.candidates) == 1 and a.candidates[0][0].startswith("chunked[") for a in first)
    # Every device busy: nothing more is asked. One result back: a random search asks one config for the free
    # device at once (its proposals do not depend on results), without waiting for the other.
    assert s.propose(plan, told, frozenset(a.group for a in first), 2) == ()
    told[first[0].group] = result(first[0].group, [first[0].candidates[0][0]])
    (third,) = s.propose(plan, told, frozenset({first[1].group}), 2)
    assert third.group not in {a.group for a in first} and parse_group(third.group)[0] == 0  # type: ignore[index]


def test_an_adaptive_search_waits_for_its_round() -> None:
    pytest.importorskip("optuna")
    s, plan = search("bayes", 5), plan_of()
    told = {"g0": result("g0", ["slow_reference"])}
    first = s.propose(plan, told, frozenset(), 2)
    assert len(first) == 2 and {parse_group(a.group)[0] for a in first} == {0}  # type: ignore[index]
    told[first[0].group] = result(first[0].group, [first[0].candidates[0][0]], TrialVerdict.PASSED)
    assert s.propose(plan, told, frozenset({first[1].group}), 2) == ()
    told[first[1].group] = result(first[1].group, [first[1].candidates[0][0]], TrialVerdict.PASSED)
    assert {parse_group(a.group)[0] for a in s.propose(plan, told, frozenset(), 2)} == {1}  # type: ignore[index]


def test_a_config_asked_before_a_restart_whose_result_never_came_is_asked_again() -> None:
    s, plan = search("exhaustive", 4), plan_of()
    told = {"g0": result("g0", ["slow_reference"])}
    first = s.propose(plan, told, frozenset(), 2)
    told[first[1].group] = result(first[1].group, [first[1].candidates[0][0]])
    # Restarted: first[0] is neither stored nor in flight any more.
    again = s.propose(plan, told, frozenset(), 2)
    assert again[0] == first[0] and len(again) == 2 and again[1].group not in {a.group for a in first}


def test_a_rebuilt_search_asks_the_same_groups_from_the_same_results() -> None:
    plan = plan_of()
    told = {"g0": result("g0", ["slow_reference"])}
    asked: list[list[str]] = []
    for _ in range(3):
        asks = search("random", 6).propose(plan, told, frozenset(), 2)
        asked.append([a.group for a in asks])
        for a in asks:
            told[a.group] = result(a.group, [a.candidates[0][0]])
    again: list[list[str]] = []
    told2 = {"g0": result("g0", ["slow_reference"])}
    for _ in range(3):
        asks = search("random", 6).propose(plan, told2, frozenset(), 2)
        again.append([a.group for a in asks])
        for a in asks:
            told2[a.group] = told[a.group]
    assert asked == again and len({g for r in asked for g in r}) == 6


def test_the_search_stops_at_max_configs_and_at_the_end_of_the_space() -> None:
    for max_configs, expect in ((3, 3), (None, 7)):  # 7 feasible configs of 8
        s, plan = search("exhaustive", max_configs), plan_of()
        told = {"g0": result("g0", ["slow_reference"])}
        while asks := s.propose(plan, told, frozenset(), 2):
            for a in asks:
                told[a.group] = result(a.group, [a.candidates[0][0]])
        names = [r.outcomes[0].name for g, r in told.items() if g != "g0"]
        assert len(names) == len(set(names)) == expect
        assert "chunked[chunk=7,twice=True]" not in names  # infeasible: never proposed


def test_a_bayes_search_replayed_every_round_spends_exactly_max_configs() -> None:
    pytest.importorskip("optuna")
    s, plan = search("bayes", 5), plan_of()
    told = {"g0": result("g0", ["slow_reference"])}
    while asks := s.propose(plan, told, frozenset(), 2):
        for a in asks:
            told[a.group] = result(a.group, [a.candidates[0][0]], TrialVerdict.PASSED)
    names = [r.outcomes[0].name for g, r in told.items() if g != "g0"]
    assert len(names) == len(set(names)) == 5


def test_a_round_answered_not_tried_by_the_budget_ends_the_search() -> None:
    s, plan = search("random", None), plan_of()
    told = {"g0": result("g0", ["slow_reference"])}
    (ask, _) = s.propose(plan, told, frozenset(), 2)
    told[ask.group] = GroupResult("run", "pid", ask.group, "not_tried", error="budget")
    assert s.propose(plan, told, frozenset(), 2) == ()


def space_fleet(redis_srv, path, devices):
    f = fleet(redis_srv, path, ())
    fl = f.__enter__()
    for device in devices:
        worker = start_worker(device, fl.broker, fl.results_url, fl.directory, fl.env, kernels=("farm_spaceops",))
        fl.workers.append(worker)
        wait_worker_ready(worker, fl.client(), fl.settings.prefix)
    return f, fl


def evaluated(record) -> dict[str, str]:
    return {c["name"]: c["note"] for c in record.meta["candidates"] if c["name"] != "slow_reference"}


@pytest.mark.servers
@pytest.mark.parametrize("strategy", ["random", "bayes"])
def test_two_workers_search_a_space_in_rounds_within_max_configs_every_config_validated(strategy, redis_srv, tmp_path):
    if strategy == "bayes":
        pytest.importorskip("optuna")
    catalog = write_catalog(tmp_path / "c.toml", SPACE, policy=POLICY + f'strategy = "{strategy}"\nmax_configs = 4\n'
                            "seed = 1\n")
    ctx, f = space_fleet(redis_srv, tmp_path / "fleet", ("cpu:0", "cpu:1"))
    try:
        summary = tune(load_catalog(catalog, ("farm_spaceops",)), f.coordinator(), f.settings)
    finally:
        ctx.__exit__(None, None, None)
    assert summary.published == 1
    agg = summary.aggregates[0]
    asked = [g for g in agg.results if parse_group(g) is not None]
    spaced = [g for g in asked if agg.results[g].status == "ok"]
    # max_configs bounds the search; only the budget may stop it earlier (a round answered not tried).
    assert len(asked) == 4 and (len(spaced) == 4 or any(agg.results[g].status == "not_tried" for g in asked))
    names = [agg.results[g].outcomes[0].name for g in spaced]
    assert len(set(names)) == len(names)
    notes = evaluated(agg.record)
    assert set(notes) == set(names)
    # Every config was validated against the reference: the trap is rejected, the others passed.
    for name, note in notes.items():
        assert note.startswith("rejected: wrong output") if "chunk=7," in name else "wrong output" not in note
    assert "chunk=7," not in agg.record.name


def interrupted_then_resumed(catalog, redis_srv, path, devices):
    """Run ``catalog`` on a fleet of ``devices``, stop the coordinator after two space groups came back, run it
    again: the groups seen before the stop, the second run's summary, and each group's attempt count."""
    ctx, f = space_fleet(redis_srv, path, devices)
    try:
        seen: list[str] = []

        def stop_after_two(event) -> None:
            if event.kind == "group" and parse_group(event.note) is not None:
                seen.append(event.note)
                if len(seen) == 2:
                    raise KeyboardInterrupt

        with pytest.raises(RunInterrupted):
            tune(catalog, replace(f.coordinator(), observer=ConsoleObserver(on_event=stop_after_two)), f.settings)
        again = tune(catalog, f.coordinator(), f.settings)
        client = f.client()
        attempts = {k: int(client.get(k)) for k in client.scan_iter(f"{f.settings.prefix}:attempts:*")
                    if not k.endswith(":confirm")}
    finally:
        ctx.__exit__(None, None, None)
    return seen, again, attempts


@pytest.mark.servers
def test_a_coordinator_interrupted_mid_search_resumes_without_rerunning_finished_configs(redis_srv, tmp_path):
    catalog = load_catalog(write_catalog(tmp_path / "c.toml", SPACE, policy=POLICY + 'strategy = "random"\n'
                                         "max_configs = 6\nseed = 2\n"), ("farm_spaceops",))
    seen, again, attempts = interrupted_then_resumed(catalog, redis_srv, tmp_path / "fleet", ("cpu:0",))
    assert again.published == 1
    agg = again.aggregates[0]
    spaced = [g for g in agg.results if parse_group(g) is not None]
    assert set(seen) <= set(spaced) and len(spaced) == 6
    assert again.reused >= len(seen)
    assert set(attempts.values()) == {1}, attempts  # no group ran twice
