"""What a run says about what it did not do: trials short of the plan, groups not tried, unconfirmed wins with
their reason, CUDA workloads a CPU-only fleet cannot tune."""

from __future__ import annotations

from types import SimpleNamespace

from farm_cli.progress import Counts
from farm_cli.summary import LEGEND, confirmation_text, not_tuned
from farm_coordinator.status import groups_done, published


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
    cases = [({"published": "3"}, "3"), ({"published": "3", "partial": "0"}, "3"),
             ({"published": "3", "partial": "1"}, "3 (1 partial: the budget stopped its search; raise budget in "
                                                  "[policy], the next farm tune continues it)"),
             ({"published": "3", "partial": "2"}, "3 (2 partial: the budget stopped their search; raise budget in "
                                                  "[policy], the next farm tune continues them)")]
    for run, want in cases:
        assert published(run) == want  # farm status's runs table


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


def test_ctrl_c_ends_the_progress_lines_stopped_not_finished_and_says_how_to_resume_once(tmp_path):
    """Issue 34, item 11: the last progress line of an interrupted run does not say ``(finished)``, and the resume
    advice is printed once."""
    import os
    import signal
    import subprocess
    import sys

    from farm_helpers import write_catalog
    from servers import farm_env

    slow = "\n".join(f'[[problems]]\noperation = "uxtest_slow"\nworkloads = [{{ n = {n}, dtype = "float64" }}]\n'
                     for n in range(16, 56, 4))
    catalog = write_catalog(tmp_path / "c.toml", slow)
    process = subprocess.Popen([sys.executable, "-m", "farm_cli", "tune", str(catalog), "--kernels", "farm_uxops",
                                "--cache-dir", str(tmp_path / "cache")], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=farm_env(), cwd=tmp_path, start_new_session=True)
    with process:
        assert process.stderr is not None
        lines: list[str] = []
        for line in process.stderr:  # the first progress line: the run is under way
            lines.append(line)
            if "0/10 problems" in line:
                break
        os.killpg(process.pid, signal.SIGINT)
        err = "".join(lines) + process.stderr.read()  # to the end: the process closes it on exit
        process.wait(timeout=120)
    assert process.returncode == 130, err
    progress = [line for line in err.splitlines() if "farm.coordinator" in line and "problems" in line]
    assert progress and "(finished" not in progress[-1] and "(stopped)" in progress[-1], err
    assert err.count("run the same command again to resume") == 1, err
    assert "rerun `farm tune" in err and "--run" in err and "Traceback" not in err
