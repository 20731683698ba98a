"""Racing on the farm (screening = "race"): the coordinator's race bookkeeping as a pure function of stored
results (farm_coordinator.racing, RaceSearch), the worker's race group with scripted timings (farm_workers.racing),
and real Redis + two real replay workers of one recording racing its configs."""

from __future__ import annotations

import dataclasses
import json

import pytest
from farm_helpers import fleet, write_catalog
from farm_spaceops import OPERATIONS as SPACE_OPERATIONS
from test_replay_farm import COMPILE_FAILED, RUNTIME_FAILED, farm, write_recording
from test_space_rounds import interrupted_then_resumed

from farm.errors import TuneFailure
from farm.policy import StackPolicy
from farm.racing import excesses
from farm.trials import Outcome, TrialVerdict, decide
from farm_coordinator.catalog import load_catalog
from farm_coordinator.machine import ProblemState
from farm_coordinator.plan import PlannedProblem, Target
from farm_coordinator.racing import race_state, settled
from farm_coordinator.spacestrategy import RaceSearch, SpaceSearch, parse_group, strategy_for
from farm_coordinator.strategy import next_tasks
from farm_fleet.protocol import GroupResult, GroupTask
from farm_workers.racing import race_group
from tests.fakes import FakeRunner

ROSTER = SPACE_OPERATIONS[0].host.roster()
REF = ROSTER.names[0]
A, B, C, D = (ROSTER.names[i] for i in (3, 4, 5, 6))
REFERENCE_TIMES = (1.0, 1.02, 1.01, 1.03, 1.0)
POLICY = StackPolicy(strategy="exhaustive", max_configs=4, samples=5)


def plan_of(workers: int = 2) -> PlannedProblem:
    target = Target("d" * 16, "fp", "cpu", tuple(f"w{i}" for i in range(workers)))
    task = GroupTask("run", "pid", "g0", "farmtest_space", "cpu", {"n": 10}, ((REF, "1"),), {}, "d" * 16)
    return PlannedProblem("pid", target, None, (task,))  # type: ignore[arg-type]


def planned(times: tuple[float, ...] = REFERENCE_TIMES) -> GroupResult:
    return GroupResult("run", "pid", "g0", "ok", reference_times=times, outcomes=())


def raced(group: str, name: str, incumbent: str, pairs: list[tuple[float, float]], standing: str = "contender",
          verdict: TrialVerdict = TrialVerdict.PASSED) -> GroupResult:
    outcome = Outcome(ROSTER.position(name) or 0, name, pairs=tuple(pairs), verdict=verdict, verified=True)
    standings = {name: standing} if verdict in (TrialVerdict.PASSED, TrialVerdict.UNVERIFIED) else {}
    return GroupResult("run", "pid", group, "ok", outcomes=(outcome,), incumbent=incumbent, standings=standings)


def search() -> RaceSearch:
    return RaceSearch(POLICY, lambda op, kind: ROSTER)


# -- the coordinator's bookkeeping (pure) ------------------------------------------------------------------------

CASES = {
    "only the plan's groups: the reference": (
        [planned()], REF, {}),
    "a config decided faster than the reference becomes the incumbent": (
        [planned(), raced("s0.3", A, REF, [(1.0, 0.5)], "promoted")], A, {A: 0.5}),
    "a dropped config and a contender leave the reference": (
        [planned(), raced("s0.3", A, REF, [(1.0, 3.0)], verdict=TrialVerdict.DROPPED),
         raced("s0.4", B, REF, [(1.0, 0.99), (1.01, 1.0)], "contender")], REF, {A: 3.0, B: 0.99}),
    "two promoted at once on two devices: the lower estimate wins": (
        [planned(), raced("s0.3", A, REF, [(2.0, 1.2)], "promoted"), raced("s0.4", B, REF, [(1.0, 0.5)], "promoted")],
        B, {A: 0.6, B: 0.5}),
    "a config promoted against a promoted one: estimates chain": (
        [planned(), raced("s0.3", A, REF, [(1.0, 0.5)], "promoted"), raced("s0.4", B, A, [(0.5, 0.25)], "promoted")],
        B, {A: 0.5, B: 0.25}),
    "a config that failed validation has no estimate": (
        [planned(), raced("s0.3", A, REF, [], verdict=TrialVerdict.REJECTED)], REF, {A: None}),
}


@pytest.mark.parametrize("results,incumbent,estimates", CASES.values(), ids=CASES.keys())
def test_the_race_is_rebuilt_from_stored_results_in_any_order(results, incumbent, estimates) -> None:
    for told in (results, list(reversed(results))):
        state = race_state(REF, {r.group: r for r in told}, POLICY)
        assert state.incumbent == incumbent
        for name, estimate in estimates.items():
            assert state.estimates[name] == (pytest.approx(estimate) if estimate is not None else None)


def test_the_noise_is_the_reference_and_incumbent_excesses_each_over_its_own_device() -> None:
    told = [planned(), raced("s0.3", A, REF, [(2.0, 0.9), (2.2, 1.0)], "promoted"),
            raced("s0.4", B, A, [(0.9, 1.5), (0.95, 1.6)], "contender")]
    state = race_state(REF, {r.group: r for r in told}, POLICY)
    assert state.incumbent == A
    expected = excesses(REFERENCE_TIMES) + excesses([2.0, 2.2]) + excesses([0.9, 0.95]) + excesses([0.9, 1.0])
    assert sorted(state.noise) == pytest.approx(sorted(expected))


def test_the_race_is_the_space_search_under_screening_race_and_not_under_full() -> None:
    assert isinstance(strategy_for(StackPolicy(max_configs=3)), RaceSearch)
    full = strategy_for(StackPolicy(max_configs=3, screening="full"))
    assert isinstance(full, SpaceSearch) and not isinstance(full, RaceSearch)


def test_configs_are_sent_with_the_incumbent_and_the_noise_then_the_winner_gets_one_final_group() -> None:
    s, plan = search(), plan_of()
    assert [a.group for a in s.propose(plan, {}, frozenset(), 2)] == ["g0"]
    told = {"g0": planned()}
    first = s.propose(plan, told, frozenset(), 2)
    assert len(first) == 2 and all(a.incumbent == (REF, ROSTER[0].revision) for a in first)
    assert first[0].noise == pytest.approx(excesses(REFERENCE_TIMES))
    (a, b) = first
    told[a.group] = raced(a.group, a.candidates[0][0], REF, [(1.0, 0.5)], "promoted")
    # b still in flight: the next config goes against the new incumbent.
    (c,) = s.propose(plan, told, frozenset({b.group}), 2)
    assert c.incumbent is not None and c.incumbent[0] == a.candidates[0][0]
    told[b.group] = raced(b.group, b.candidates[0][0], REF, [(1.0, 3.0)], verdict=TrialVerdict.DROPPED)
    told[c.group] = raced(c.group, c.candidates[0][0], a.candidates[0][0], [(0.5, 2.0)], verdict=TrialVerdict.DROPPED)
    (d,) = s.propose(plan, told, frozenset(), 1)  # max_configs = 4: the last one
    assert s.propose(plan, told, frozenset({d.group}), 2) == ()  # a config still racing: no final yet
    told[d.group] = raced(d.group, d.candidates[0][0], a.candidates[0][0], [(0.5, 0.51)], "contender")
    (final,) = s.propose(plan, told, frozenset(), 2)
    assert final.group == f"final.{parse_group(a.group)[1]}" and final.candidates == a.candidates  # type: ignore[index]
    assert final.incumbent is None and final.whole_budget
    told[final.group] = GroupResult("run", "pid", final.group, "ok", outcomes=())
    assert s.propose(plan, told, frozenset(), 2) == ()


def test_a_race_the_reference_kept_ends_without_a_final_group() -> None:
    s, plan = search(), plan_of(1)
    told = {"g0": planned()}
    while asks := s.propose(plan, told, frozenset(), 1):
        (ask,) = asks
        told[ask.group] = raced(ask.group, ask.candidates[0][0], REF, [(1.0, 2.0)], verdict=TrialVerdict.DROPPED)
    assert len(told) == 5 and not any(g.startswith("final.") for g in told)


def test_the_final_group_is_sent_with_the_whole_budget_after_the_race_spent_it() -> None:
    s, plan = search(), plan_of(1)
    state = ProblemState(run="r1")
    state.results["g0"] = dataclasses.replace(planned(), search_seconds=1.0)
    (task,), _ = next_tasks(plan, state, 10.0, s, 1)
    state.results[task.group] = dataclasses.replace(raced(task.group, task.candidates[0][0], REF, [(1.0, 0.5)],
                                                          "promoted"), search_seconds=20.0)
    tasks, not_tried = next_tasks(plan, state, 10.0, s, 1)  # the next config is not tried; the final is sent
    assert [r.group for r in not_tried] and [t.group for t in tasks] == [f"final.{parse_group(task.group)[1]}"]  # type: ignore[index]
    assert tasks[0].budget is None and tasks[0].incumbent is None


def test_aggregation_drops_every_raced_config_and_decides_on_the_winners_final_verdict() -> None:
    faster = [(1.0 + 0.001 * i, 0.5 + 0.001 * i) for i in range(9)]
    position = ROSTER.position(A)
    told = {"g0": planned(), "s0.3": raced("s0.3", A, REF, [(1.0, 0.5)], "promoted"),
            "s0.4": raced("s0.4", B, A, [(0.5, 0.49)], "contender"),
            f"final.{position}": GroupResult("run", "pid", f"final.{position}", "ok", reference_times=REFERENCE_TIMES,
                                             outcomes=(Outcome(position or 0, A, pairs=tuple(faster), verified=True,
                                                               verdict=TrialVerdict.PASSED, stop="decided"),))}
    for order in (list(told), list(reversed(told))):
        view = settled({g: told[g] for g in order})
        assert list(view)[-1].startswith("final.")
        outcomes: dict[int, Outcome] = {}
        for r in view.values():
            outcomes.update({o.index: o for o in r.outcomes})
        assert outcomes[ROSTER.position(B) or 0].verdict is TrialVerdict.DROPPED  # a contender never wins
        selection, _ = decide(0, ROSTER.names, [outcomes[i] for i in sorted(outcomes)], POLICY)
        assert ROSTER.names[selection.index] == A
    # Without its final verdict against the reference, the race's winner is not a winner.
    view = settled({g: r for g, r in told.items() if not g.startswith("final.")})
    outcomes = {o.index: o for r in view.values() for o in r.outcomes}
    assert all(o.verdict is TrialVerdict.DROPPED for o in outcomes.values())
    assert decide(0, ROSTER.names, list(outcomes.values()), POLICY)[0].index == 0


# -- the worker's race group (scripted timings) -------------------------------------------------------------------

NAMES = ["reference", "a", "b", "c"]
NOISE = excesses(list(REFERENCE_TIMES))


def test_a_slower_config_is_dropped_after_one_pair_against_the_incumbent_on_this_device() -> None:
    runner = FakeRunner({0: 1.0, 1: 0.5, 2: 3.0})
    got = race_group(runner, POLICY, 0, 1, [2], NAMES, NOISE, budget=60.0)
    (o,) = got.outcomes
    assert o.verdict is TrialVerdict.DROPPED and len(o.pairs) == 1 and o.pairs[0] == (0.5, 3.0)
    assert "slower than 'a'" in o.note and got.standings == {}
    # Validated against the reference; the incumbent warmed up once, untimed.
    assert ("validate", 0, 2) in runner.calls and runner.calls.count(("measure", 1)) == 2


def test_a_faster_config_is_promoted_and_a_close_one_is_a_contender() -> None:
    runner = FakeRunner({0: 1.0, 1: 0.3, 2: [1.0, 1.01, 1.02, 1.0, 1.01]})
    got = race_group(runner, POLICY, 0, 0, [1, 2], NAMES, NOISE, budget=60.0)
    a, b = got.outcomes
    assert got.standings == {"a": "promoted", "b": "contender"}
    assert a.verdict is TrialVerdict.PASSED and a.stop == "decided" and len(a.pairs) < POLICY.samples
    assert b.verdict is TrialVerdict.PASSED and len(b.pairs) == POLICY.samples


def test_a_config_that_fails_is_a_verdict_never_a_standing() -> None:
    runner = FakeRunner({0: 1.0, 2: [TuneFailure.rejected("launch failed")]},
                        {1: TuneFailure.rejected("wrong output: max abs error 1")})
    got = race_group(runner, POLICY, 0, 0, [1, 2], NAMES, NOISE, budget=60.0)
    a, b = got.outcomes
    assert a.verdict is TrialVerdict.REJECTED and "wrong output" in a.note and b.verdict is TrialVerdict.REJECTED and "launch failed" in b.note
    assert got.standings == {}


def test_a_race_group_past_its_budget_leaves_its_configs_not_tried() -> None:
    got = race_group(FakeRunner({0: 1.0}), POLICY, 0, 0, [1], NAMES, NOISE, budget=-1.0)
    assert got.outcomes[0].verdict is TrialVerdict.NOT_TRIED and got.budget_exhausted


# -- real Redis, two replay workers of one recording ----------------------------------------------------------

POLICY_TOML = "[policy]\nsamples = 5\nwarmups = 1\nbudget = 3.0\nstrategy = \"random\"\nseed = 1\nmax_configs = 32\n"
OPTIMUM = "kernel[block_size_x=64,block_size_y=4,unroll=0]"


def tune_recording(redis_srv, tmp_path, screening: str) -> list[dict]:
    """The decisions ``farm tune --json`` publishes for one recording raced (or not) by two replay workers."""
    folder = tmp_path / screening
    (folder / "recordings").mkdir(parents=True)
    recording = write_recording(folder / "recordings" / "vector_add_A.json", "GPU A", (64, 4, 0), 1)
    catalog = folder / "catalog.toml"
    catalog.write_text(POLICY_TOML + f'screening = "{screening}"\n\n'
                       '[[problems]]\nrecording = "recordings/vector_add_A.json"\n')
    with fleet(redis_srv, recording.parent, (f"replay:{recording.name}", f"replay:{recording.name}#1")) as f:
        env = {**f.env, "FARM_KERNEL_CACHE": str(folder / "kcache"), "COLUMNS": "400"}
        done = farm("tune", str(catalog), "--broker", f.broker, "--redis", f.results_url, "--json", env=env,
                    cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    decisions: list[dict] = json.loads(done.stdout)["decisions"]
    return decisions


def pairs_of(decision: dict) -> int:
    return sum(c["pairs"] for c in decision["record"]["meta"]["candidates"])


@pytest.mark.servers
def test_two_replay_workers_race_a_recording_to_its_optimum_with_fewer_pairs_than_the_full_protocol(
        redis_srv, tmp_path):
    (race,) = tune_recording(redis_srv, tmp_path, "race")  # one decision published
    (full,) = tune_recording(redis_srv, tmp_path, "full")
    assert race["record"]["name"] == full["record"]["name"] == OPTIMUM  # the recording's optimum
    assert race["record"]["meta"]["confirmation"] is None or "unconfirmed" not in str(race["record"]["meta"])
    notes = {c["name"]: c["note"] for c in race["record"]["meta"]["candidates"]}
    pairs = {c["name"]: c["pairs"] for c in race["record"]["meta"]["candidates"]}
    # Failed configs are verdicts (the compile failure rejected before any group, the runtime failure when run).
    assert notes[COMPILE_FAILED].startswith("rejected:") and "RuntimeFailedConfig" in notes[RUNTIME_FAILED]
    # Most configs are dropped after one or two pairs against the incumbent; the winner's verdict is the full one.
    dropped = {n: note for n, note in notes.items() if note.startswith("dropped:")}
    assert len(dropped) >= 20, notes
    assert sum(1 for n in dropped if pairs[n] <= 2) >= 0.8 * len(dropped), pairs
    assert notes[OPTIMUM].startswith("selected:") and pairs[OPTIMUM] >= 5
    assert pairs_of(race) < pairs_of(full) / 2, (pairs_of(race), pairs_of(full))


SPACE = """
[[problems]]
operation = "farmtest_space"
workloads = [{ n = 2500, dtype = "float64" }]
"""


@pytest.mark.servers
def test_a_coordinator_killed_mid_race_resumes_from_the_stored_results(redis_srv, tmp_path):
    catalog = load_catalog(write_catalog(tmp_path / "c.toml", SPACE, policy="samples = 5\nwarmups = 1\nbudget = 3.0\n"
                                         'max_relative_mad = 1.0\nstrategy = "random"\nmax_configs = 6\nseed = 2\n'),
                           ("farm_spaceops",))
    seen, again, attempts = interrupted_then_resumed(catalog, redis_srv, tmp_path / "fleet", ("cpu:0", "cpu:1"))
    assert again.published == 1
    agg = again.aggregates[0]
    raced = [g for g in agg.results if parse_group(g) is not None]
    assert set(seen) <= set(raced) and len(raced) == 6 and again.reused >= len(seen)
    assert all(agg.results[g].incumbent is not None for g in raced if agg.results[g].status == "ok")
    assert set(attempts.values()) == {1}, attempts  # no group ran twice
    finals = [g for g in agg.results if g.startswith("final.")]
    # A winner other than the reference took its full trials in one final group; none was dropped and won.
    assert len(finals) == (0 if agg.winner == "slow_reference" else 1)
    notes = {j.name: j.note for j in agg.judged}
    assert all(notes[agg.results[g].outcomes[0].name].startswith(("dropped:", "rejected:", "selected:"))
               for g in raced if agg.results[g].status == "ok")
