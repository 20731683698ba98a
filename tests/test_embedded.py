"""The embedded farm: `farm tune CATALOG` without a broker runs the whole pipeline here, through the same task
function as the Celery workers, and writes decisions the runtime reads from its cache directory."""

from __future__ import annotations

import json
import subprocess
import sys

from farm_helpers import runtime_select, write_catalog
from servers import farm_env

import farm
from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore
from farm_coordinator.aggregate import META_FIELDS

CATALOG = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 2000, dtype = "float64" }, { n = 13, dtype = "float64" }]
"""


def farm_tune(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", "tune", *args, "--kernels", "farm_testops"],
                          capture_output=True, text=True, env=farm_env(), cwd=cwd, timeout=300)


def test_the_embedded_farm_writes_decisions_the_runtime_reuses(tmp_path):
    catalog = write_catalog(tmp_path / "c.toml", CATALOG)
    done = farm_tune(str(catalog), "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "2 decisions published" in done.stdout
    assert "farmtest_scale" in done.stdout and "vectorized" in done.stdout

    records = [DecisionRecord.from_json(text) for batch in LocalStore(tmp_path / "cache").scan() for text, _, _ in batch]
    assert len(records) == 2
    assert all(set(r.meta) == set(META_FIELDS) for r in records)

    got = runtime_select(catalog, "farm_testops", "farmtest_scale", {"n": 2000, "dtype": "float64"}, tmp_path / "cache")
    decision, tuner = got.decision, got.tuner
    assert decision.source is farm.DecisionSource.DISK_CACHE
    assert decision.name == "vectorized"
    assert tuner.stats().tunes == 0


def test_a_second_embedded_run_skips_what_is_decided(tmp_path):
    catalog = write_catalog(tmp_path / "c.toml", CATALOG)
    cache = str(tmp_path / "cache")
    assert farm_tune(str(catalog), "--cache-dir", cache, cwd=tmp_path).returncode == 0
    again = farm_tune(str(catalog), "--cache-dir", cache, "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)
    assert data["published"] == 0 and {d["source"] for d in data["decisions"]} == {"reused"}


def test_a_malformed_catalog_exits_with_a_message_naming_file_problem_and_field(tmp_path):
    catalog = write_catalog(tmp_path / "bad.toml", """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 0, dtype = "float64" }]
""")
    done = farm_tune(str(catalog), "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert done.returncode == 2
    assert "bad.toml" in done.stderr and "problems[0].workloads[0].n" in done.stderr
    assert not (tmp_path / "cache").exists()
