"""Partial decisions (issue 34, item 3): a search the budget cut is published as partial, every summary says what it
left out, why and what changes it, and the next run continues it from the stored results instead of reusing it.

Table tests of the rule (``farm_coordinator.partial``) and of a continuation's plan, then the user's path: a real
2-worker fleet (a private redis-server, two `farm worker` processes) where the budget runs out, `farm tune` run
again with a larger budget, `farm status` in between."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from farm_helpers import fleet, write_catalog

from farm.stores.redis import RedisDecisions
from farm.trials import Outcome, TrialVerdict
from farm_coordinator.catalog import load_catalog
from farm_coordinator.partial import carried, describe, is_partial, judged_before, partial_meta
from farm_coordinator.plan import plan_groups

SPACE = """
[[problems]]
operation = "farmtest_space"
workloads = [{ n = 20000, dtype = "float64" }]
"""
POLICY = 'samples = 5\nwarmups = 1\nbudget = {budget}\nmax_relative_mad = 1.0\nstrategy = "exhaustive"\n'
FEASIBLE = {f"chunked[chunk={c},twice={t}]" for c in (7, 256, 1024, 4096) for t in (False, True)} - {
    "chunked[chunk=7,twice=True]"}


def outcome(index: int, name: str, verdict: TrialVerdict | None = None, note: str = "",
            cut: bool = False) -> Outcome:
    return Outcome(index, name, verdict=verdict, note=note, budget_exhausted=cut)


def test_a_search_is_partial_when_the_budget_left_candidates_not_tried_or_cut_one_mid_trial():
    judged = outcome(1, "a")
    budget = outcome(2, "b", TrialVerdict.NOT_TRIED, "budget of 10s exhausted", cut=True)
    sampling = outcome(3, "c", TrialVerdict.REJECTED, "budget of 10s exhausted during sampling", cut=True)
    limit = outcome(4, "d", TrialVerdict.NOT_TRIED, "the task's time limit is near")
    capped = outcome(5, "e", TrialVerdict.NOT_TRIED, "max_candidates 4 reached", cut=True)
    cases = [
        ([judged], (), None),
        ([judged, budget, sampling], (), {"not_tried": ["b", "c"], "reason": "the budget of 10 s ran out",
                                          "fix": "raise budget in the catalog's [policy] table; the next `farm "
                                                 "tune` continues the search from these results"}),
        # another cause (a task's time limit, a run-level budget) is quoted as recorded, never guessed
        ([judged, limit], (), {"not_tried": ["d"], "reason": "the task's time limit is near",
                               "fix": "the next `farm tune` continues the search from these results"}),
        # the run's device-second budget (farm_coordinator.runbudget) cuts a search too, and has its own setting
        ([judged, outcome(6, "f", TrialVerdict.NOT_TRIED, "the run's budget of 60 device seconds was spent", cut=True)],
         (), {"not_tried": ["f"], "reason": "the run's budget of 60 device seconds was spent",
              "fix": "raise --budget-device-seconds (or run_budget in the catalog's [policy] table); the next `farm "
                     "tune` continues the search from these results"}),
        # a bound set at planning time (max_candidates, a ban) is no cut of the search
        ([judged, capped], ("e",), None),
    ]
    for outcomes, planned_out, want in cases:
        assert partial_meta(outcomes, planned_out) == want, outcomes


def test_a_continuation_knows_what_the_earlier_searches_judged_and_carries_their_verdicts():
    meta = {"run": "r1", "partial": {"not_tried": ["c", "d"], "reason": "the budget of 1 s ran out", "fix": "x"},
            "candidates": [{"name": "a", "note": "selected: ratio 0.5"}, {"name": "b", "note": "rejected: wrong"},
                           {"name": "old", "note": "slower", "from_run": "r0"},
                           {"name": "c", "note": "not tried: budget of 1s exhausted"},
                           {"name": "d", "note": "budget of 1s exhausted during sampling"}]}
    assert is_partial(meta) and not is_partial({**meta, "partial": None}) and not is_partial({})
    assert judged_before(meta) == {"a", "b", "old"}
    # the winner judged again now replaces its old verdict; the others keep theirs, naming the run that judged them
    assert carried(meta, {"a", "c"}) == [{"name": "b", "note": "rejected: wrong", "from_run": "r1"},
                                         {"name": "old", "note": "slower", "from_run": "r0"}]
    assert describe(meta) == ("PARTIAL: the budget of 1 s ran out with 2 candidates not tried (c, d): x")
    many = {**meta, "partial": {**meta["partial"], "not_tried": [f"n{i}" for i in range(8)]}}
    assert "(n0, n1, n2, n3, n4 and 3 more)" in describe(many)
    assert describe({**meta, "partial": None}) == ""


def test_a_continued_problem_plans_the_earlier_winner_then_only_what_its_searches_did_not_judge(tmp_path):
    catalog = load_catalog(write_catalog(tmp_path / "c.toml", SPACE, POLICY.format(budget=1.0)), ("farm_spaceops",))
    winner = "chunked[chunk=256,twice=False]"
    meta = {"run": "r1", "winner": winner,
            "partial": {"not_tried": sorted(FEASIBLE - {winner, "chunked[chunk=7,twice=False]"}), "reason": "r",
                        "fix": "f"},
            "candidates": [{"name": "chunked[chunk=7,twice=False]", "note": "rejected: wrong output"},
                           {"name": winner, "note": "selected: ratio 0.05"}]}
    full = plan_groups("farmtest_space", "cpu", catalog)
    continued = plan_groups("farmtest_space", "cpu", catalog, continues=meta)
    names = [name for _, candidates in continued.groups for name, _ in candidates]
    assert {n for _, c in full.groups for n, _ in c} == FEASIBLE
    assert names[0] == winner and set(names) == FEASIBLE - {"chunked[chunk=7,twice=False]"}
    assert continued.checksum == full.checksum  # the same problem, continued


KERNELS = ("farm_spaceops", "farm_uxops")  # farm_uxops: uxtest_broken, whose reference fails every group


def farm_tune(f, catalog, *extra: str) -> subprocess.CompletedProcess[str]:
    kernels = [arg for module in KERNELS for arg in ("--kernels", module)]
    return subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(catalog), "--broker", f.broker, "--redis",
                           f.results_url, *kernels, *extra], capture_output=True, text=True, env=f.env, timeout=300)


def farm_status(f) -> dict[str, dict[str, object]]:
    """`farm status --json`'s runs, by run id."""
    done = subprocess.run([sys.executable, "-m", "farm_cli", "status", "--redis", f.results_url, "--json"],
                          capture_output=True, text=True, env=f.env, timeout=60)
    assert done.returncode == 0, done.stderr
    return {str(r["run"]): r for r in json.loads(done.stdout)["runs"]}


def run_id(done: subprocess.CompletedProcess[str]) -> str:
    (found,) = set(re.findall(r"run (\d{8}-\d{6}-[0-9a-f]{6})", done.stdout + done.stderr))
    return found


@pytest.fixture(scope="module")
def two_workers(redis_srv, tmp_path_factory):
    from servers import start_worker, wait_worker_ready

    with fleet(redis_srv, tmp_path_factory.mktemp("fleet"), ()) as f:
        for device in ("cpu:0", "cpu:1"):
            worker = start_worker(device, f.broker, f.results_url, f.directory, f.env, kernels=KERNELS)
            f.workers.append(worker)
            wait_worker_ready(worker, f.client(), f.settings.prefix)
        yield f


@pytest.mark.servers
def test_a_budget_cut_search_on_a_two_worker_fleet_is_published_partial_and_the_next_run_continues_it(
        two_workers, tmp_path) -> None:
    f = two_workers
    small = write_catalog(tmp_path / "small.toml", SPACE, POLICY.format(budget=0.05))
    large = write_catalog(tmp_path / "large.toml", SPACE, POLICY.format(budget=3.0))
    store = RedisDecisions(client=f.client(), settings=f.settings)

    first = farm_tune(f, small)
    said = " ".join(first.stdout.split())  # the table's caption wraps
    assert first.returncode == 0, first.stdout + first.stderr
    (cut,) = [r for d in store.fingerprints() for r in store.records(d)]
    partial = cut.meta["partial"]
    assert partial is not None and partial["reason"] == "the budget of 0.05 s ran out", cut.meta
    assert set(partial["not_tried"]) and set(partial["not_tried"]) <= FEASIBLE
    assert "raise budget in the catalog's [policy] table" in partial["fix"]
    assert cut.meta["covered"] is None and cut.meta["continues"] is None
    assert "1 tuned and published (1 partial)" in said and "ran, partial" in said, said
    assert (f"PARTIAL: the budget of 0.05 s ran out with {len(partial['not_tried'])} candidate" in said
            and "raise budget in the catalog's [policy] table; the next `farm tune` continues the search" in said
            ), said

    run = farm_status(f)[cut.meta["run"]]
    assert (run["state"], run["published"], run["partial"]) == ("finished", 1, 1), run

    # The same problem (the budget is no part of it), never reused while partial: each run continues the last
    # one (on a loaded machine even the larger budget may need more than one run; each makes progress).
    earlier, left = cut, set(partial["not_tried"])
    for _ in range(3):
        again = farm_tune(f, large)
        said = " ".join(again.stdout.split())
        assert again.returncode == 0, again.stdout + again.stderr
        assert "0 problems reused from earlier runs" in said, said
        (final,) = [r for d in store.fingerprints() for r in store.records(d)]
        assert final.meta["continues"] == earlier.meta["run"]
        if final.meta["partial"] is None:
            assert "partial" not in said.split("source:")[0], said  # the table; the legend explains the word
            break
        assert set(final.meta["partial"]["not_tried"]) < left, final.meta["partial"]
        earlier, left = final, set(final.meta["partial"]["not_tried"])
    assert final.meta["partial"] is None
    by_name = {c["name"]: c for c in final.meta["candidates"]}
    assert set(by_name) == FEASIBLE  # every config judged once over the two runs
    # What the first run judged is carried forward, not judged again (its winner excepted: judged again).
    again_judged = {n for n, c in by_name.items() if c.get("from_run") is None}
    assert set(partial["not_tried"]) <= again_judged
    assert {n for n, c in by_name.items() if c.get("from_run") == cut.meta["run"]} <= (
        FEASIBLE - set(partial["not_tried"]) - {cut.name})
    # complete now: an exhaustive search of the whole space, indexed under its family for a grown space's next run
    assert final.meta["evaluated"] == len(FEASIBLE) and final.meta["covered"] is not None
    assert final.name in FEASIBLE - {"chunked[chunk=7,twice=False]"}


@pytest.mark.servers
def test_a_strategys_run_counts_the_groups_and_trials_it_planned_as_it_went(two_workers, tmp_path) -> None:
    """Issue 34, item 10: a sampling search plans its groups as it goes; progress, the summary and `farm status`
    count them (never ``5/1 trials`` or ``groups done 5/1``)."""
    policy = 'samples = 5\nwarmups = 1\nbudget = 3.0\nmax_relative_mad = 1.0\nstrategy = "random"\nmax_configs = 4\n'
    catalog = write_catalog(tmp_path / "c.toml", SPACE.replace("20000", "3000"), policy)
    done = farm_tune(two_workers, catalog)
    assert done.returncode == 0, done.stdout + done.stderr
    (last,) = [line for line in done.stderr.splitlines() if "(finished" in line]
    trials, total = map(int, re.search(r"(\d+)/(\d+) trials", last).groups())
    assert trials == total > 1, last
    tasks, ran = map(int, re.search(r"\((\d+) group tasks: (\d+) group results ran", done.stdout).groups())
    assert tasks == ran > 1, done.stdout
    run = farm_status(two_workers)[run_id(done)]
    assert (run["state"], run["done"], run["groups"]) == ("finished", ran, tasks), run


@pytest.mark.servers
def test_a_run_whose_every_group_failed_is_failed_in_farm_status(two_workers, tmp_path) -> None:
    """Issue 34, item 11: a run that published nothing because every group failed does not show as finished."""
    broken = '[[problems]]\noperation = "uxtest_broken"\nworkloads = [{ n = 64, dtype = "float64" }]\n'
    done = farm_tune(two_workers, write_catalog(tmp_path / "c.toml", broken))
    assert done.returncode == 1, done.stdout + done.stderr
    run = farm_status(two_workers)[run_id(done)]
    assert (run["state"], run["published"]) == ("failed", 0), run
