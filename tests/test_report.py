"""`farm report`: a self-contained HTML page from an archive, with every problem in it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from farm_helpers import write_catalog
from servers import farm_env

from farm.stores.archive import ArchiveEntry
from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore
from farm.stores.redis import field_for
from farm_archives import write_archive

CATALOG = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 2000, dtype = "float64" }, { n = 17, dtype = "float64" }, { n = 301, dtype = "float64" }]
"""


def archive_from_embedded_run(tmp_path):
    """Tune a small catalog with the embedded farm, then archive its cache directory by hand."""
    cache = tmp_path / "cache"
    done = subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(write_catalog(tmp_path / "c.toml", CATALOG)),
                           "--cache-dir", str(cache), "--kernels", "farm_testops"],
                          capture_output=True, text=True, env=farm_env(), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    store = LocalStore(cache)
    (fingerprint,) = store.fingerprints().values()
    entries = []
    for batch in store.scan():
        for text, pid, trials in batch:
            record = DecisionRecord.from_json(text)
            field = field_for(record.cache_key)
            entries.append(ArchiveEntry(record, pid, tuple({**t, "key_sha256": field} for t in json.loads(trials))))
    return write_archive(tmp_path / "archive", fingerprint, entries).path


def test_the_report_is_one_self_contained_page_with_every_problem(tmp_path):
    archive = archive_from_embedded_run(tmp_path)
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "farm_cli", "report", "--archive", str(archive.parent),
                           "--out", str(out)], capture_output=True, text=True, env=farm_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "3 problems written" in done.stdout
    page = out.read_text()
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing to fetch: it opens offline
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1))
    (fingerprint,) = data
    assert {p["workload"] for p in fingerprint["problems"]} == {
        "n=2000 float64", "n=17 float64", "n=301 float64"}  # as `farm tune` and `farm archive inspect` write them
    big = next(p for p in fingerprint["problems"] if "2000" in p["workload"])
    assert big["winner"] == "vectorized"
    losers = {c["name"]: c["note"] for c in big["candidates"]}
    assert "wrong output" in losers["wrong_but_fast"] and "RuntimeError" in losers["raises"]
    vectorized = next(c for c in big["candidates"] if c["name"] == "vectorized")
    # One point per timing pair, for the plot: samples = 5, then more at the looks while undecided.
    assert len(vectorized["ratios"]) in (5, 11, 17, 21)
    assert fingerprint["winners"] and fingerprint["median_speedup"] > 1.0


def test_a_missing_archive_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, "-m", "farm_cli", "report", "--archive", str(tmp_path / "empty"),
                           "--out", str(tmp_path / "r.html")], capture_output=True, text=True, env=farm_env(),
                          timeout=120)
    assert done.returncode == 2
    assert "holds no archive" in done.stderr
    assert not (tmp_path / "r.html").exists()


def test_the_report_summarizes_the_environment_names_the_archive_and_scales_every_ratio(tmp_path):
    import shutil

    from farm_coordinator.report import axis_range, environment_summary, ratio_ticks

    archive = archive_from_embedded_run(tmp_path)
    out = tmp_path / "report.html"
    shutil.move(str(archive.parent), str(tmp_path / "fleet-2026-12"))
    done = subprocess.run([sys.executable, "-m", "farm_cli", "report", "--archive", str(tmp_path / "fleet-2026-12"),
                           "--out", str(out)], capture_output=True, text=True, env=farm_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    title = re.search(r"<title>(.*?)</title>", page).group(1)
    assert title.startswith("Tuning report: fleet-2026-12 (") and "1 fingerprint" in title
    assert "<details><summary" in page and "raw fingerprint" in page  # the raw text is folded away
    assert "<th>confirmation</th>" in page
    (fingerprint,) = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page,
                                          re.S).group(1))
    labels = dict(fingerprint["environment"])
    assert {"device", "threads", "driver", "compiler", "build"} <= set(labels)
    assert "logical cores" in labels["device"] and "cpus=" in labels["threads"] and "blas=" in labels["threads"]
    for problem in fingerprint["problems"]:  # the ticks bracket every ratio but the outlier pairs
        low, high = axis_range(problem["candidates"], fingerprint["min_speedup"])
        assert min(problem["ticks"]) <= low <= 1.0 <= high <= max(problem["ticks"])
    assert environment_summary("not an encoding") == [("fingerprint", "not an encoding")]
    ticks = ratio_ticks(0.011, 1.05)
    assert ticks[0] <= 0.011 and ticks[-1] >= 1.05 and 1.0 in ticks


NODE_DOM = """
const fs = require("fs");
const page = fs.readFileSync(process.argv[2], "utf8");
const data = page.match(/<script id="data" type="application\\/json">([\\s\\S]*?)<\\/script>/)[1];
const code = page.match(/<script>\\n([\\s\\S]*?)<\\/script>/)[1];
function element() {
  return {innerHTML: "", textContent: "", value: "", hidden: false, children: [], dataset: {},
          appendChild(c) { this.children.push(c); }, addEventListener() {}, after() {},
          querySelector() { return element(); }};
}
const root = element();
global.document = {getElementById: id => id === "data" ? {textContent: data} : root, createElement: element};
global.location = {hash: ""};
eval(code + `
let svgs = 0;
FPS.forEach(fp => fp.problems.forEach(p => { const html = detail(p, fp.min_speedup); if (!html.includes("<svg")) throw new Error("no plot"); svgs++; }));
console.log(JSON.stringify({sections: root.children.length, svgs}));
`);
"""


def test_the_pages_script_draws_every_problem_without_errors(tmp_path):
    import shutil

    node = shutil.which("node")
    if node is None:
        import pytest

        pytest.skip("node is not installed: the page's script is not run")
    archive = archive_from_embedded_run(tmp_path)
    out = tmp_path / "report.html"
    from farm_coordinator.report import write_report

    assert write_report(archive.parent, out) == 3
    script = tmp_path / "dom.js"
    script.write_text(NODE_DOM)
    done = subprocess.run([node, str(script), str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"sections": 1, "svgs": 3}
