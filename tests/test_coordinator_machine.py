"""The coordinator's state machine and the dispatcher's deadlines, as pure logic (the real-process tests are in
test_faults.py, test_farm_recovery.py and test_farm_singleflight.py)."""

from __future__ import annotations

from typing import Any

import pytest

from farm_coordinator.dispatch import CeleryDispatcher
from farm_coordinator.machine import Board, IllegalTransition, State
from farm_coordinator.plan import PlannedProblem, Target
from farm_fleet.protocol import GroupKey, GroupTask
from farm_fleet.settings import Settings


def problem(pid: str) -> PlannedProblem:
    from farm_coordinator.catalog import Workload

    task = GroupTask("r", pid, "g0", "op", "cpu", {}, (("a", "1"),), {}, "fp")
    return PlannedProblem(pid, Target("fp", "fp", "cpu"), Workload("op", {}, ("cpu",), "problems[0]"), (task,))


def test_a_problem_moves_along_the_allowed_transitions_and_each_move_is_reported():
    moves: list[tuple[str, str, str]] = []
    board = Board([problem("a"), problem("b")], lambda t, old, new: moves.append((t.pid, old.value, new.value)))
    assert board.count(State.WAITING) == 2 and board.unfinished == 2
    for state in (State.QUEUED, State.RUNNING, State.CONFIRMING, State.PUBLISHED):
        board.move("a", state)
    board.move("b", State.FAILED, "every group failed")
    assert board.unfinished == 0 and board["b"].state.note == "every group failed"
    assert moves[:2] == [("a", "waiting", "queued"), ("a", "queued", "running")]
    assert [t.pid for t in board.members(State.PUBLISHED)] == ["a"]


def test_a_board_that_does_not_keep_final_problems_counts_them_and_holds_only_unfinished_ones():
    board = Board([problem("a")], keep_final=False)
    board.add([problem("b"), problem("a")])  # one already there is left as it is
    assert board.count(State.WAITING) == 2 and board.unfinished == 2
    board.move("a", State.QUEUED)
    board.move("a", State.PUBLISHED)
    board.move("b", State.FAILED, "every group failed")
    assert board.get("a") is None and board.get("b") is None
    assert (board.unfinished, board.finished, len(board.items)) == (0, 2, 0)


@pytest.mark.parametrize("path", [
    (State.PUBLISHED, State.QUEUED),  # a published problem is final
    (State.FAILED, State.RUNNING),
    (State.RUNNING,),  # never sent before it was leased and queued
])
def test_a_transition_the_machine_does_not_allow_is_refused(path):
    board = Board([problem("a")])
    with pytest.raises(IllegalTransition):
        for state in path:
            board.move("a", state)


def test_a_lost_lease_sends_a_problem_back_to_waiting_and_drops_its_lease():
    board = Board([problem("a")])
    assert board.claimed("a", "me#1", "round").state.lease == "me#1"
    board.sent("a", "g0")
    assert board.get("a").stage is State.RUNNING
    assert board.move("a", State.WAITING, "lease lost").state.lease is None


class FakeResults:
    """The results store's surface the dispatcher uses (its real implementation is tested with Redis)."""

    def __init__(self) -> None:
        self.started: dict[Any, float] = {}

    def notices(self, rounds, timeout):
        return []

    def started_at(self, keys):
        return [self.started.get(k) for k in keys]

    def get_many(self, keys):
        return [None for _ in keys]


class FakeApp:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def send_task(self, name, **options):
        self.sent.append(options["task_id"])


def test_a_group_without_a_result_is_lost_one_hard_limit_plus_grace_after_it_started(monkeypatch):
    import farm_coordinator.dispatch as dispatch

    clock = [1000.0]
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: clock[0])
    results = FakeResults()
    d = CeleryDispatcher(FakeApp(), results, Settings(lost_grace_seconds=5.0), sweep=1.0)  # type: ignore[arg-type]
    task = problem("a").tasks[0]
    d.submit([task], "q", (10.0, 20.0))
    d.collect()
    assert d.lost() == [] and d.in_flight() == 1
    results.started[GroupKey("r", "a", "g0")] = 123.0
    clock[0] += 20.0
    d.collect()  # sees the delivery start now
    clock[0] += 24.0
    d.collect()
    assert d.lost() == []  # 24 s after it started: within hard limit + grace
    clock[0] += 2.0
    d.collect()
    assert d.lost() == [task] and d.in_flight() == 0


def test_a_run_reports_each_problem_state_and_group_result_to_its_observer(tmp_path):
    from dataclasses import replace

    from farm_helpers import write_catalog

    from farm_cli import embedded_parts
    from farm_coordinator.catalog import load_catalog
    from farm_coordinator.run import tune
    from farm_coordinator.runview import ConsoleObserver

    catalog = load_catalog(write_catalog(tmp_path / "c.toml", """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 500, dtype = "float64" }]
"""), ("farm_testops",))
    settings = Settings()
    events: list[Any] = []
    parts = embedded_parts(settings, ("cpu:0",), tmp_path / "cache", ("farm_testops",))
    summary = tune(catalog, replace(parts, observer=ConsoleObserver(on_event=events.append)), settings)
    kinds = [e.kind for e in events]
    assert kinds == ["queued", "running", "group", "group", "published"]
    assert (events[-1].groups_done, events[-1].groups_total) == (2, 2)
    assert events[0].problem is summary.aggregates[0].problem
    assert (summary.ran, summary.reused, summary.published) == (2, 0, 1)


def test_a_group_that_never_starts_while_its_queue_stands_still_is_sent_again_with_back_off(monkeypatch):
    import farm_coordinator.dispatch as dispatch

    clock = [1000.0]
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: clock[0])
    app = FakeApp()
    d = CeleryDispatcher(app, FakeResults(), Settings(lost_grace_seconds=5.0), sweep=1.0)  # type: ignore[arg-type]
    d.submit([problem("a").tasks[0]], "q", (10.0, 20.0))
    sent_at = []
    for _ in range(160):  # 160 s of a queue that never moves
        clock[0] += 1.0
        d.collect()
        assert d.lost() == []  # never started: the dispatcher sends it again itself
        if len(app.sent) > len(sent_at) + 1:
            sent_at.append(clock[0])
    assert [round(t - 1000) for t in sent_at] == [26, 77]  # after 25 s, then 50 s more: backing off
    assert d.in_flight() == 1


def test_a_run_leases_problems_in_a_window_refilled_as_they_finish(tmp_path):
    import dataclasses

    from farm_coordinator.leases import LocalLeases
    from farm_coordinator.run import tune

    catalog, settings, parts = _many(tmp_path, 600)  # the coordinator is under test, not the trials
    sizes: list[int] = []

    class CountingLeases(LocalLeases):
        def acquire(self, pids, holder):
            sizes.append(len(pids))
            return super().acquire(pids, holder)

    summary = tune(catalog, dataclasses.replace(parts, leases=CountingLeases()), settings)
    assert summary.published == 600
    assert sizes[0] == 256 and max(sizes) == 256 and sum(sizes) == 600 and len(sizes) >= 3


def test_a_stored_result_or_an_unrun_group_reaches_the_coordinator_by_its_notice_alone(redis_db):
    """No sweep in this test (once an hour): the completion notices workers push must name their group."""
    from farm_fleet.protocol import STATUS_OK, GroupResult
    from farm_fleet.results import RedisResults

    settings = Settings(prefix="notice")
    results = RedisResults(redis_db, settings)
    d = CeleryDispatcher(FakeApp(), results, settings, sweep=3600.0)  # type: ignore[arg-type]
    d._last_sweep = d._last_deadlines = float("inf")  # the first call would sweep: never here
    done, unrun = problem("a").tasks[0], problem("b").tasks[0]
    d.submit([done, unrun], "q", (10.0, 20.0))
    redis_db.rpush(settings.done_key("r"), "other:result:v2:r:a:g0", "notice:result:v1:r:a:g0")  # foreign ones
    results.put_if_absent(GroupResult("r", "a", "g0", STATUS_OK))
    results.unrun([GroupKey("r", "b", "g0")])
    assert [(r.problem_id, r.group) for r in d.collect(wait=5.0)] == [("a", "g0")]
    assert d.lost() == [unrun] and d.in_flight() == 0


def test_a_notice_names_its_group_whatever_the_run_id_and_foreign_notices_name_none():
    settings = Settings(prefix="farm")
    colons, plain = GroupKey("run:with:colons", "p1", "g0"), GroupKey("r", "p1", "g2")
    assert settings.notice_of(settings.result_key(colons)) == ("result", colons)
    assert settings.notice_of(settings.unrun_key(plain)) == ("unrun", plain)
    for foreign in ("other:result:v2:r:p1:g0", "farm:result:v1:r:p1:g0", "farm:started:r:p1:g0", "farm:result:v2:p1"):
        assert settings.notice_of(foreign) is None


def _many(tmp_path: Any, count: int, instant: bool = True) -> tuple[Any, Settings, dict[str, Any]]:
    """A catalog of ``count`` problems and embedded parts (``instant``: whose groups return one real result each,
    instantly)."""
    import dataclasses

    from farm_helpers import write_catalog

    from farm_cli import embedded_parts
    from farm_coordinator.catalog import load_catalog

    workloads = ", ".join(f'{{ n = {10 + i}, dtype = "float64" }}' for i in range(count))
    catalog = load_catalog(write_catalog(tmp_path / "c.toml", f"""
[[problems]]
operation = "farmtest_scale"
workloads = [{workloads}]
"""), ("farm_testops",))
    settings = Settings(max_in_flight=64)
    parts = embedded_parts(settings, ("cpu:0",), tmp_path / "cache", ("farm_testops",))
    real, template = parts.dispatcher.execute, {}

    def once(task, queue):
        if task.group not in template:
            template[task.group] = real(task, queue)
        return dataclasses.replace(template[task.group], run=task.run, problem_id=task.problem_id)

    if instant:
        parts.dispatcher.execute = once
    return catalog, settings, parts


def test_a_run_keeps_counts_and_one_compact_entry_per_problem_and_only_the_first_aggregates(tmp_path):
    from farm_cli import summary as report
    from farm_coordinator.run import RunOptions, tune

    catalog, settings, parts = _many(tmp_path, 300)
    calls: list[int] = []
    publish_many = parts.sink.publish_many
    parts.sink.publish_many = lambda pubs: calls.append(len(pubs)) or publish_many(pubs)
    summary = tune(catalog, parts, settings, RunOptions(keep_aggregates=10))
    assert (summary.published, summary.failures, len(summary.problems), len(summary.aggregates)) == (300, 0, 300, 10)
    assert sum(calls) == 300 and len(calls) < 300  # published in batches
    rows = report.rows(summary, parts.sink)  # the CLI's summary reads the records back from the cache
    assert len(rows) == 300 and all(r["source"] == "ran" and r["winner"] for r in rows)
    assert not report.failures(rows)
    again = tune(catalog, parts, settings, RunOptions(keep_aggregates=10))
    assert (again.published, again.decided_before, len(again.already_decided), again.aggregates) == (0, 300, 300, [])
    assert {r["source"] for r in report.rows(again, parts.sink)} == {"reused"}


def test_the_embedded_farm_holds_no_group_result_it_has_handled(tmp_path):
    from farm_coordinator.run import tune

    catalog, settings, parts = _many(tmp_path, 3, instant=False)
    summary = tune(catalog, parts, settings)
    assert summary.published == 3
    (context,) = parts.fleet.contexts.values()
    assert context.results.get_many([GroupKey("x", "y", "z")]) == [None] and not context.results._results


def test_problems_a_timed_out_run_never_took_fail_with_the_reason_and_are_never_expanded(tmp_path, monkeypatch):
    from farm_coordinator import plan
    from farm_coordinator.run import RunOptions, tune

    catalog, settings, parts = _many(tmp_path, 300)
    made: list[str] = []
    problem = plan.Planner.problem
    monkeypatch.setattr(plan.Planner, "problem", lambda self, *a: made.append(a[-1]) or problem(self, *a))
    summary = tune(catalog, parts, settings, RunOptions(timeout=-1.0))  # past its deadline from the start
    assert (summary.published, summary.failures, len(summary.problems)) == (0, 300, 300)
    assert {error for _, error in summary.failed} == {"not started before the timeout"} and made == []
