"""The planning step and the search-strategy seam, as pure tables: ``next_tasks(plan, state, budget)`` proposes
the next group tasks and the NOT_TRIED results of groups whose turn came after the budget was spent, and changes
nothing it is given."""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence

import pytest

from farm.policy import StackPolicy
from farm_coordinator.aggregate import aggregate
from farm_coordinator.catalog import Workload
from farm_coordinator.machine import Board, ProblemState, State
from farm_coordinator.plan import PlannedProblem, Target
from farm_coordinator.strategy import PRIORITY_GROUPS, Ask, PriorityGroups, next_tasks
from farm_fleet.protocol import STATUS_NOT_TRIED, STATUS_OK, GroupResult, GroupTask

BUDGET = 10.0
GROUPS = {"g0": (("a", "1"),), "g1": (("b", "1"), ("c", "2")), "g2": (("d", "1"),)}


def plan(groups: Mapping[str, tuple[tuple[str, str], ...]] = GROUPS) -> PlannedProblem:
    tasks = tuple(GroupTask("run", "p", group, "op", "cpu", {}, candidates, {}, "fp")
                  for group, candidates in groups.items())
    return PlannedProblem("p", Target("fp", "fp", "cpu", ("w1", "w2")), Workload("op", {}, ("cpu",), "problems[0]"),
                          tasks)


def ok(group: str, seconds: float) -> GroupResult:
    return GroupResult("round", "p", group, STATUS_OK, search_seconds=seconds)


def state(results: Mapping[str, float] = (), in_flight: Collection[str] = (), run_id: str | None = "round") -> ProblemState:
    return ProblemState(State.RUNNING, run=run_id, results={g: ok(g, s) for g, s in dict(results).items()},
                        in_flight=set(in_flight))


@pytest.mark.parametrize(("results", "in_flight", "sent", "budget", "not_tried"), [
    ({}, (), [("g0", None)], BUDGET, []),  # the first group carries the whole budget (no number)
    ({"g0": 3.0}, (), [("g1", 7.0)], BUDGET, []),  # the next carries what the earlier left
    ({"g0": 3.0, "g1": 4.0}, (), [("g2", 3.0)], BUDGET, []),
    ({}, ("g0",), [], BUDGET, []),  # one group at a time: wait while one is out
    ({"g0": 3.0}, ("g1",), [], BUDGET, []),
    ({"g0": 11.0}, (), [], BUDGET, ["g1", "g2"]),  # spent: every later group is not tried, the search ends
    ({"g0": 3.0, "g1": 7.0}, (), [], BUDGET, ["g2"]),  # exactly spent counts as spent
    ({"g0": 1.0, "g1": 1.0, "g2": 1.0}, (), [], BUDGET, []),  # all back: nothing more
])
def test_the_priority_rule_sends_the_next_group_with_the_budget_left_and_refuses_groups_after_it_is_spent(
        results, in_flight, sent, budget, not_tried):
    tasks, refused = next_tasks(plan(), state(results, in_flight), budget)
    assert [(t.group, t.budget) for t in tasks] == [(g, pytest.approx(b) if b else b) for g, b in sent]
    assert [r.group for r in refused] == not_tried
    assert all(r.status == STATUS_NOT_TRIED and "budget of 10s exhausted" in str(r.error) for r in refused)
    assert all(t.run == "round" and t.candidates == GROUPS[t.group] for t in tasks)


def test_planning_changes_nothing_it_is_given():
    planned, before = plan(), state({"g0": 11.0})
    after = copy.deepcopy(before)
    next_tasks(planned, before, BUDGET)
    assert before == after and planned == plan()


def test_tasks_planned_before_a_claim_carry_the_plans_run_and_after_it_the_claims_round():
    (unclaimed,), _ = next_tasks(plan(), state(run_id=None), BUDGET)
    (claimed,), _ = next_tasks(plan(), state(run_id="r7"), BUDGET)
    assert (unclaimed.run, claimed.run) == ("run", "r7")


class Grid:
    """A strategy of its own groups (not the plan's), several per round, sized to the capacity."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names

    def propose(self, plan: PlannedProblem, results: Mapping[str, GroupResult], in_flight: Collection[str],
                capacity: int) -> Sequence[Ask]:
        fresh = [n for n in self.names if f"s-{n}" not in results and f"s-{n}" not in in_flight]
        return [Ask(f"s-{n}", ((n, "1"),)) for n in fresh[:capacity]]


@pytest.mark.parametrize(("capacity", "results", "in_flight", "sent", "not_tried"), [
    (2, {}, (), ["s-x", "s-y"], []),  # a batch sized to the fingerprint's live devices
    (8, {}, (), ["s-x", "s-y", "s-z"], []),
    (1, {"s-x": 1.0}, ("s-y",), ["s-z"], []),  # asks go on while others are in flight
    (3, {"s-x": 12.0}, (), [], ["s-y", "s-z"]),  # the budget ends the search, whatever the strategy wants
    (2, {"s-x": 1.0, "s-y": 1.0, "s-z": 1.0}, (), [], []),  # the strategy ends it: nothing more to propose
])
def test_a_strategy_proposes_several_groups_of_its_own_up_to_the_capacity(capacity, results, in_flight, sent,
                                                                          not_tried):
    tasks, refused = next_tasks(plan(), state(results, in_flight), BUDGET, Grid("xyz"), capacity)
    assert [t.group for t in tasks] == sent and [r.group for r in refused] == not_tried
    assert all(t.candidates == ((t.group[2:], "1"),) and t.operation == "op" for t in tasks)


def test_asks_for_groups_already_answered_in_flight_or_past_the_capacity_are_dropped():
    class Greedy:
        def propose(self, plan, results, in_flight, capacity):
            return [Ask("g0", ()), Ask("g1", ()), Ask("g2", (("d", "1"),)), Ask("g3", ())]

    tasks, refused = next_tasks(plan(), state({"g0": 1.0}, ("g1",)), BUDGET, Greedy(), 1)
    assert [t.group for t in tasks] == ["g2"] and refused == []


def test_the_same_results_give_the_same_proposal_so_a_restarted_coordinator_resumes_where_it_stopped():
    strategy = Grid("abcdef")
    first = next_tasks(plan(), state({"s-a": 1.0, "s-b": 2.0}), BUDGET, strategy, 2)
    again = next_tasks(plan(), state({"s-b": 2.0, "s-a": 1.0}), BUDGET, Grid("abcdef"), 2)
    assert first == again and [t.group for t in first[0]] == ["s-c", "s-d"]


def test_the_board_applies_a_planning_step_and_says_when_the_search_ended():
    board = Board([plan()])
    t = board.claimed("p", "me#1", "round")
    assert not board.asked("p", *next_tasks(t.plan, t.state, BUDGET))
    assert t.state.in_flight == {"g0"} and t.state.asked == {"g0": GROUPS["g0"]}
    board.sent("p", "g0")
    assert board.result("p", ok("g0", 11.0)) and not board.result("p", ok("g0", 1.0))  # a duplicate is refused
    assert board.asked("p", *next_tasks(t.plan, t.state, BUDGET))  # spent: the rest not tried, the search ended
    assert t.stage is State.RUNNING and [r.status for r in t.state.results.values()] == ["ok", "not_tried", "not_tried"]


def test_aggregation_reads_the_groups_a_strategy_asked_for_and_changes_nothing():
    planned = plan({"g0": (("ref", "1"),)})
    results = {"s-x": GroupResult("round", "p", "s-x", STATUS_NOT_TRIED, error="budget", budget_exhausted=True)}
    before = dict(results)
    agg = aggregate(planned, results, StackPolicy(), "run", {"s-x": (("x", "1"),)})
    assert agg.record is None and dict(agg.results) == before == results and "s-x: budget" in str(agg.error)


def test_the_default_strategy_is_the_priority_rule():
    assert isinstance(PRIORITY_GROUPS, PriorityGroups)
    assert PRIORITY_GROUPS.propose(plan(), {}, (), 4) == (Ask("g0", GROUPS["g0"]),)
