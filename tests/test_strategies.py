"""Search strategies over spaces: each strategy's budget, replay determinism, the validation rules, and
incremental spaces (a grown space searches only its new configs against the stored winner)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fakes import problem

import farm
from farm.engine import StackTuner, Validation
from farm.errors import TuneFailure
from farm.policy import StackPolicy, Tolerance
from farm.roster import Roster
from farm.strategies import effort, make_sampler, replay

FAST = StackPolicy(warmups=1, samples=3, min_speedup=1.0)


def cost(block: int, unroll: int, vector: str) -> float:
    """A known cost: one optimum at block=64, unroll=4, vector=wide (0.2); block=8 is a faster trap."""
    if block == 8:
        return 0.01
    return 0.2 + abs(block - 64) / 256 + abs(unroll - 4) / 16 + (0.1 if vector == "narrow" else 0.0)


def space_set(blocks: tuple[int, ...] = (8, 16, 32, 64, 128), restrict: str = "block * unroll <= 512") -> farm.TunableSet:
    ts = farm.TunableSet("known", signature=farm.array_signature)
    ts.add(lambda x: x, name="reference", reference=True)
    ts.add(lambda x: x, name="plain", group=1)
    ts.space(name="known", block=list(blocks), unroll=[1, 2, 4, 8], vector=["narrow", "wide"], restrict=restrict)(
        lambda x, *, block, unroll, vector: x)
    return ts


class CostRunner:
    """A TrialRunner timing each config by :func:`cost`; block=8 configs give a wrong output."""

    def __init__(self, roster: Roster) -> None:
        self.roster = roster
        self.measured: list[int] = []
        self.validated: list[int] = []

    def validate(self, reference: int, candidate: int, tolerance: Tolerance) -> Validation:
        self.validated.append(candidate)
        config = self.roster.config(candidate)
        if config is not None and config["block"] == 8:
            raise TuneFailure.rejected("wrong output: values differ beyond tolerance")
        return Validation.PASSED

    def measure(self, candidate: int) -> float:
        config = self.roster.config(candidate)
        if candidate != 0:
            self.measured.append(candidate)
        if config is None:
            return 1.0 if candidate == 0 else 0.9
        return cost(**config)  # type: ignore[arg-type]


def select(ts: farm.TunableSet, policy: StackPolicy, tuner: StackTuner | None = None, persistent: bool = False
           ) -> tuple[farm.Decision, farm.TuneReport, CostRunner]:
    roster = ts.roster()
    tuner = tuner or StackTuner(policy)
    runner = CostRunner(roster)
    p = problem(operation=f"known-{ts.checksum()}", persistent=persistent)
    decision = tuner.select(p, roster, 0, runner)
    return decision, tuner.reports()[-1], runner


def test_exhaustive_evaluates_every_feasible_config_and_finds_the_optimum_never_the_trap() -> None:
    decision, report, _ = select(space_set(), FAST)
    assert decision.name == "known[block=64,unroll=4,vector=wide]"
    assert (report.strategy, report.evaluated, report.space_size) == ("exhaustive", 38, 40)
    trap = next(c for c in report.candidates if c.name == "known[block=8,unroll=1,vector=narrow]")
    assert trap.note.startswith("rejected: wrong output")


@pytest.mark.parametrize("strategy", ["random", "bayes", "exhaustive"])
def test_a_strategy_evaluates_exactly_max_configs_distinct_feasible_configs(strategy: str) -> None:
    policy = FAST.replace(strategy=strategy, max_configs=12, seed=5)
    decision, report, runner = select(space_set(), policy)
    # Run at all (validated: racing validates before any timing, so a wrong output is never timed).
    configs = {p for p in runner.measured + runner.validated if runner.roster.config(p) is not None}
    assert report.evaluated == 12 and report.seed == 5 and report.max_configs == 12
    assert len(configs) == 12
    assert all(runner.roster[p].eligible for p in configs)
    assert not decision.name.startswith("known[block=8,")
    assert report.covered is None  # a bounded search covers only what it evaluated


@pytest.mark.parametrize("strategy", ["random", "bayes"])
def test_the_same_seed_and_told_results_give_the_same_next_asks(strategy: str) -> None:
    roster = space_set().roster()
    policy = FAST.replace(strategy=strategy, max_configs=30, seed=11)

    def ratio(p: int) -> float:
        config = roster.config(p)
        assert config is not None
        return cost(**config)  # type: ignore[arg-type]

    first = make_sampler(roster, policy)
    rounds = []
    for _ in range(3):
        asked = first.ask(4)
        rounds.append([(p, ratio(p)) for p in asked])
        first.tell(rounds[-1])
    resumed = replay(make_sampler(roster, policy), rounds)
    assert resumed.ask(4) == first.ask(4)
    other = make_sampler(roster, policy.replace(seed=12))
    assert [other.ask(4) for _ in range(3)] != [[p for p, _ in r] for r in rounds]


def test_replaying_rounds_from_another_seed_is_refused() -> None:
    roster = space_set().roster()
    policy = FAST.replace(strategy="random", seed=1)
    asked = make_sampler(roster, policy).ask(3)
    with pytest.raises(ValueError, match="differs from the sampler's asks"):
        replay(make_sampler(roster, policy.replace(seed=2)), [[(p, 1.0) for p in asked]])


def test_a_random_draw_from_a_mostly_infeasible_space_still_ends_with_every_feasible_config() -> None:
    roster = space_set(restrict="block == 128 and unroll == 8 and vector == 'wide'").roster()
    sampler = make_sampler(roster, FAST.replace(strategy="random", seed=3))
    asked = sampler.ask(5)
    assert [roster[p].name for p in asked] == ["known[block=128,unroll=8,vector=wide]"]
    assert sampler.ask(5) == []


def test_bayes_without_optuna_is_invalid_input_saying_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(TuneFailure, match=r"pip install 'tuning-farm\[bayes\]'"):
        make_sampler(space_set().roster(), FAST.replace(strategy="bayes"))
    ts = space_set()
    runner = CostRunner(ts.roster())
    with pytest.raises(TuneFailure, match=r"tuning-farm\[bayes\]"):
        StackTuner(FAST.replace(strategy="bayes")).select(problem(), ts.roster(), 0, runner)
    assert runner.measured == []  # refused before any trial


def test_a_grown_space_evaluates_only_its_new_configs_against_the_stored_winner() -> None:
    tuner = StackTuner(FAST)
    first, report, _ = select(space_set(blocks=(8, 16, 32, 48)), FAST, tuner)
    assert first.name == "known[block=48,unroll=4,vector=wide]" and not report.incremental
    grown, again, runner = select(space_set(blocks=(8, 16, 32, 48, 64)), FAST, tuner)
    new = {p for p in runner.measured if (c := runner.roster.config(p)) is not None and c["block"] == 64}
    old = [runner.roster[p].name for p in runner.measured if (c := runner.roster.config(p)) is not None and c["block"] != 64]
    assert grown.name == "known[block=64,unroll=4,vector=wide]"
    assert again.incremental and again.evaluated == 8 and len(new) == 8
    assert set(old) == {"known[block=48,unroll=4,vector=wide]"}  # the stored winner, re-judged with the new ones
    assert "plain" not in {c.name for c in again.candidates}
    assert again.covered == {"known": {"block": [8, 16, 32, 48, 64], "unroll": [1, 2, 4, 8], "vector": ["narrow", "wide"]}}


def test_a_grown_space_finds_the_old_decision_on_disk_in_a_new_process(tmp_path: Path) -> None:
    select(space_set(blocks=(8, 16)), FAST, StackTuner(FAST, cache_directory=tmp_path), persistent=True)
    _, again, _ = select(space_set(blocks=(8, 16, 32)), FAST, StackTuner(FAST, cache_directory=tmp_path), persistent=True)
    assert again.incremental and again.evaluated == 8


def test_a_changed_restriction_is_a_new_space_searched_in_full() -> None:
    tuner = StackTuner(FAST)
    select(space_set(blocks=(8, 16)), FAST, tuner)
    _, again, _ = select(space_set(blocks=(8, 16, 32), restrict="block * unroll <= 256"), FAST, tuner)
    assert not again.incremental and again.evaluated == 24


def test_the_summary_says_how_many_configs_of_how_many_a_strategy_evaluated() -> None:
    assert effort(60, 10240, "bayes", 0) == "evaluated 60 of 10,240 configs (bayes, seed 0)"
    assert effort(7, 8, "exhaustive", 0) == "evaluated 7 of 8 configs (exhaustive)"


def test_max_candidates_and_the_4096_limit_bound_listed_candidates_not_a_space() -> None:
    policy = FAST.replace(max_candidates=2)
    decision, report, _ = select(space_set(), policy)
    assert report.evaluated == 38 and decision.name == "known[block=64,unroll=4,vector=wide]"
    big = farm.TunableSet("big", signature=farm.array_signature)
    big.add(lambda x: x, name="reference", reference=True)
    big.space(name="wide", a=list(range(100)), b=list(range(100)))(lambda x, *, a, b: x)
    tuner = StackTuner(FAST.replace(strategy="random", max_configs=5))
    decision = tuner.select(problem(), big.roster(), 0, Halving())
    report = tuner.reports()[-1]
    assert (report.evaluated, report.space_size) == (5, 10_000)
    assert decision.name.startswith("wide[a=") and len(big.roster()) > 4096


class Halving:
    """A TrialRunner in which every candidate but the reference takes half its time."""

    def validate(self, reference: int, candidate: int, tolerance: Tolerance) -> Validation:
        return Validation.PASSED

    def measure(self, candidate: int) -> float:
        return 1.0 if candidate == 0 else 0.5
