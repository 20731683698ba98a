"""`farm report` opened in a real headless Chromium: the overview is one table with named columns and one row
per problem, the environment is shown, and the ratio plots keep their axis readable."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from browser import screenshot
from servers import ROOT, farm_env

OVERVIEW_COLUMNS = ["operation", "workload", "winner", "ratio", "verified", "confirmation", "candidates"]


def example_catalog(path: Path) -> Path:
    """examples/catalog.toml with a smaller measuring policy (same problems, fewer timings): the page is the
    subject here, not the decisions."""
    text = (ROOT / "examples" / "catalog.toml").read_text()
    text, n = re.subn(r"(?ms)^\[policy\]\n.*?(?=^\S*#|^\[\[)", "[policy]\nsamples = 3\nwarmups = 1\nbudget = 2.0\n\n",
                      text, count=1)
    assert n == 1, "examples/catalog.toml has no [policy] table to shrink"
    path.write_text(text)
    return path


def farm(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "farm_cli", *args], capture_output=True, text=True, env=farm_env(),
                          cwd=cwd, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def overview(session) -> dict:
    """What a reader sees: every table's header cells and body rows, and the environment block."""
    return session.execute_script("""
      const tables=[...document.querySelectorAll("table")].filter(t=>!t.closest("tr.detail"));
      return {tables: tables.map(t=>({cls: t.className,
                headers: [...t.querySelectorAll(":scope > thead > tr > th")].map(h=>h.textContent.trim()),
                rows: t.querySelectorAll(":scope > tbody > tr").length,
                visible: t.getBoundingClientRect().height > 0})),
              env: [...document.querySelectorAll("table.env tr")].map(r=>[r.cells[0].textContent, r.cells[1].textContent])};
    """)


def test_the_report_of_the_example_catalog_shows_one_overview_table_with_named_columns_and_the_environment(
        tmp_path, chromium, record_property):
    catalog = example_catalog(tmp_path / "catalog.toml")
    tuned = farm("tune", str(catalog), "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    # The embedded farm tunes on cpu:0 only: the catalog's CUDA workloads are left out, and it says so.
    assert f"farm: note: 20 workloads of {catalog} not tuned: they need a cuda device" in tuned.stderr
    farm("archive", "export", "--from-cache", str(tmp_path / "cache"), "--out", str(tmp_path / "archive"), cwd=tmp_path)
    out = tmp_path / "report.html"
    assert "46 problems written" in farm("report", "--archive", str(tmp_path / "archive"), "--out", str(out),
                                         cwd=tmp_path).stdout

    chromium.get(out.as_uri())
    seen = overview(chromium)
    problems = [t for t in seen["tables"] if t["cls"] == "problems"]
    assert len(problems) == 1, seen["tables"]
    assert problems[0]["headers"] == OVERVIEW_COLUMNS
    assert chromium.execute_script("return document.querySelectorAll('table.problems > tbody > tr.p').length") == 46
    assert all(t["rows"] > 0 for t in seen["tables"]), seen["tables"]  # no header-only table
    env = dict(seen["env"])
    assert {"device", "threads", "driver", "compiler", "build"} <= set(env), env
    assert all(value.strip() for value in env.values()), env
    assert "logical cores" in env["device"] and "cpus=" in env["threads"]
    assert chromium.get_log("browser") == []  # the page's script raised nothing
    labels = chromium.execute_script(
        "return [...document.querySelectorAll('table.problems > tbody > tr.p')].map(r=>r.cells[1].textContent)")
    # Workloads as `farm tune` prints them: the schema's order (rows before cols), not the stored sorted keys.
    assert "rows=1 cols=1000 float32" in labels and "rows=3 cols=1000 axis=0 float32" in labels
    assert not any(label.startswith("cols=") for label in labels), labels

    chromium.find_element("css selector", "table.problems > tbody > tr.p").click()  # the detail view opens
    assert chromium.find_elements("css selector", "tr.detail svg")
    shot = screenshot(chromium, "report-example-catalog")
    record_property("screenshot", str(shot))
    print(f"screenshot: {shot}")


def outlier_page(out: Path) -> Path:
    """A page with one problem whose candidate has tight pairs around 0.8 and one outlier pair at 0.05."""
    from farm_coordinator.report import axis_range, environment_summary, ratio_ticks, render

    candidates = [{"name": "vectorized", "ratio": 0.8, "mad": 0.02, "verified": True, "note": "selected",
                   "ratios": [0.79, 0.8, 0.81, 0.8, 0.82, 0.78, 0.05]}]
    problem = {"operation": "farmtest_scale", "workload": "n=64 float64", "winner": "vectorized", "reference": "loop",
               "ratio": 0.8, "verified": True, "confirmation": "", "origin": "", "candidates": candidates,
               "ticks": ratio_ticks(*axis_range(candidates, 1.05))}
    fingerprint = {"digest": "0" * 16, "fingerprint": "raw", "environment": environment_summary("raw"),
                   "problems": [problem], "winners": [["vectorized", 1]], "median_speedup": 1.25, "min_speedup": 1.05,
                   "retuned": []}
    out.write_text(render([fingerprint], "outlier"))
    return out


def test_an_outlier_pair_does_not_stretch_the_plots_axis_and_the_axis_title_clears_the_tick_labels(
        tmp_path, chromium):
    out = outlier_page(tmp_path / "report.html")
    chromium.get(out.as_uri() + "#expand")
    ticks = [float(t) for t in chromium.execute_script(
        "return [...document.querySelectorAll('tr.detail svg text.tick')].map(t=>t.textContent)")]
    assert min(ticks) >= 0.5 and max(ticks) <= 2, ticks  # 0.05 would stretch it to 0.05-1
    assert len(chromium.find_elements("css selector", "tr.detail svg path.outlier")) == 1
    overlaps = chromium.execute_script("""
      const title=document.querySelector("tr.detail svg text.axis-title").getBBox();
      return [...document.querySelectorAll("tr.detail svg text.tick")].map(t=>t.getBBox())
        .filter(b=>b.x<title.x+title.width&&title.x<b.x+b.width&&b.y<title.y+title.height&&title.y<b.y+b.height).length;
    """)
    assert overlaps == 0
    screenshot(chromium, "report-outlier-axis")


def test_the_plots_axis_range_leaves_out_pairs_beyond_their_candidates_fences_but_keeps_every_median():
    from farm_coordinator.report import axis_range

    cases = [
        # (candidates' ratios and medians, min_speedup, expected range)
        ([([0.9, 0.91, 0.92, 0.9, 0.05], 0.9)], 1.05, (0.9, 1.0)),  # the 0.05 pair is an outlier
        ([([0.9, 0.91, 0.92, 0.9, 20.0], 0.9)], 1.05, (0.9, 1.0)),
        ([([0.5, 2.0], 0.7)], 1.05, (0.5, 2.0)),  # too few pairs to call any an outlier
        ([([3.0, 3.1, 3.2, 3.0], 3.1), ([0.5, 0.5, 0.52, 0.51], 0.5)], 1.05, (0.5, 3.2)),  # each its own fences
        ([([], 0.2)], 1.25, (0.2, 1.0)),  # a median without pairs
    ]
    for given, min_speedup, (low, high) in cases:
        candidates = [{"ratios": ratios, "ratio": median} for ratios, median in given]
        got = axis_range(candidates, min_speedup)
        assert abs(got[0] - min(low, 1 / min_speedup)) < 1e-9 and abs(got[1] - high) < 1e-9, (given, got)
