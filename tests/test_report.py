"""`farm report`: a self-contained HTML page from an archive, with every problem in it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from farm_helpers import write_catalog
from servers import farm_env

from farm.stores.archive import ArchiveEntry, write_archive
from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore
from farm.stores.redis import field_for

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
        "dtype=float64 n=2000", "dtype=float64 n=17", "dtype=float64 n=301"}
    big = next(p for p in fingerprint["problems"] if "2000" in p["workload"])
    assert big["winner"] == "vectorized"
    losers = {c["name"]: c["note"] for c in big["candidates"]}
    assert "wrong output" in losers["wrong_but_fast"] and "RuntimeError" in losers["raises"]
    vectorized = next(c for c in big["candidates"] if c["name"] == "vectorized")
    assert len(vectorized["ratios"]) == 5  # one point per timing pair, for the plot
    assert fingerprint["winners"] and fingerprint["median_speedup"] > 1.0


def test_a_missing_archive_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, "-m", "farm_cli", "report", "--archive", str(tmp_path / "empty"),
                           "--out", str(tmp_path / "r.html")], capture_output=True, text=True, env=farm_env(),
                          timeout=120)
    assert done.returncode == 2
    assert "holds no archive" in done.stderr
    assert not (tmp_path / "r.html").exists()
