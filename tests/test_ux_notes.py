"""What a run says about what it did not do: trials short of the plan, groups not tried, the one spelling of
the `not tried` verdict, unconfirmed wins with their reason, CUDA workloads a CPU-only fleet cannot tune."""

from __future__ import annotations

from types import SimpleNamespace

from farm.trials import TrialVerdict, canonical_verdict
from farm_cli.progress import Counts
from farm_cli.summary import LEGEND, confirmation_text, not_tuned
from farm_coordinator.status import groups_done


def test_a_trial_rows_verdict_has_one_spelling_and_old_group_statuses_are_read_as_it():
    cases = [("not_tried", "not tried"), ("not tried", "not tried"), ("failed", "group failed"),
             ("validation_unavailable", "group failed"), ("passed", "passed"), ("reference", "reference")]
    for text, want in cases:
        assert canonical_verdict(text) == want
    assert canonical_verdict("not_tried") == TrialVerdict.NOT_TRIED.value


def test_a_finished_run_with_fewer_trials_than_planned_says_the_budget_ran_out():
    def agg(*statuses):
        return SimpleNamespace(results={str(i): SimpleNamespace(status=s) for i, s in enumerate(statuses)})

    counts = Counts("r1", problems=2, trials_total=301)
    counts.settled["published"] = 2
    counts.trials = 298
    counts.count(agg("ok", "not_tried"))
    counts.count(agg("ok"))
    counts.count(None)
    assert counts.why_fewer() == ("; 3 planned trials not run: the budget ran out before 1 group's turn "
                                  "(verdict: not tried)")
    counts.not_tried = 0
    assert "not run" in counts.why_fewer() and "budget" not in counts.why_fewer()
    counts.trials = 301
    assert counts.why_fewer() == ""
    cases = [({"state": "finished", "done": "111", "groups": "112"}, "111/112 (1 not tried: the budget ran out first)"),
             ({"state": "running", "done": "5", "groups": "112"}, "5/112"),
             ({"state": "finished", "done": "3", "groups": "3"}, "3/3")]
    for run, want in cases:
        assert groups_done(run) == want


def test_the_tune_table_shows_why_a_win_is_unconfirmed_and_the_legend_does_not_guess():
    cases = [("confirmed", "confirmed"),
             ("unconfirmed: confirmation did not decide a win: undecided: noisy (rel. MAD 0.2)",
              "unconfirmed: confirmation did not decide a win: undecided: noisy (rel. MAD 0.2)"),
             ("unconfirmed: no second device of this fingerprint online",
              "unconfirmed: no second device of this fingerprint online"),
             ("-", "-")]
    for note, want in cases:
        assert confirmation_text(note) == want
    assert "no second device was online" not in LEGEND and "reason" in LEGEND


def test_workloads_no_online_device_kind_can_run_are_counted_with_what_to_do():
    catalog = SimpleNamespace(path="examples/catalog.toml", workloads=[
        SimpleNamespace(devices=("cpu",)), SimpleNamespace(devices=("cuda",)), SimpleNamespace(devices=("cuda",)),
        SimpleNamespace(devices=("cpu", "cuda"))])
    (line,) = not_tuned(catalog, {"cpu"})
    assert line.startswith("2 workloads of examples/catalog.toml not tuned: they need a cuda device and none is "
                           "online (online: cpu)")
    assert "farm worker --device cuda:N" in line
    assert not_tuned(catalog, {"cpu", "cuda"}) == []


def test_a_real_run_whose_budget_ran_out_says_why_its_trials_fall_short(tmp_path):
    import subprocess
    import sys

    from farm_helpers import write_catalog
    from servers import farm_env

    slow = '[[problems]]\noperation = "uxtest_slow"\nworkloads = [{ n = 64, dtype = "float64" }]\n'
    catalog = write_catalog(tmp_path / "c.toml", slow, "samples = 5\nwarmups = 1\nbudget = 0.5\nmax_relative_mad = 1.0\n")
    done = subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(catalog), "--kernels", "farm_uxops",
                           "--cache-dir", str(tmp_path / "cache")], capture_output=True, text=True, env=farm_env(),
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    (last,) = [line for line in done.stderr.splitlines() if "(finished" in line]
    # Four groups of slow candidates, a budget that covers about one: the rest are recorded not tried.
    assert "1/1 problems" in last and "planned trials not run: the budget ran out before" in last, last
    assert "(verdict: not tried)" in last
