"""Problem weights (docs/catalog.md, "Weights"): from a catalog's ``weight`` field, from a CSV or Parquet table
imported with ``farm catalog weights``, and from the calls the fleet's runtimes count (farm.feedback, with a real
redis-server and the real FleetReporter thread). A weight never changes a problem's id; bad input is an error
naming the file, the row or field and the value, and then nothing is written."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from servers import farm_env

import farm
from farm.errors import ConfigError, FarmError
from farm.feedback import FleetReporter, stream_key
from farm.stores.memory import MemoryStore
from farm_coordinator.catalog import load_catalog
from farm_coordinator.feedback import (
    CALLS_KEY,
    CALLS_META,
    calls_per_hour,
    fold_calls,
    read_stream,
    tune_from_fleet,
    waiting,
)
from farm_coordinator.plan import Planner, Target
from farm_coordinator.weights import read_weights
from farm_coordinator.weights_import import match, read_rows
from farm_fleet.settings import Settings
from farm_kernels import registry

CATALOG = """\
[[problems]]
operation = "matmul"
devices = ["cpu"]
workloads = [
  { m = 64, n = 64, k = 64, dtype = "float32"WEIGHT },
  { m = 32, n = 64, k = 64, dtype = "float32", layout = "a_transposed" },
  { m = 16, n = 16, k = 16, dtype = "float64" },
]

[[problems]]
operation = "softmax"
devices = ["cpu"]
workloads = [{ rows = 8, cols = 32, dtype = "float32" }]
"""


def catalog_file(tmp_path: Path, weight: str = "", extra: str = "") -> Path:
    path = tmp_path / "release.toml"
    path.write_text(CATALOG.replace("WEIGHT", weight) + extra)
    return path


# ------------------------------------------------------------------------------ the catalog's weight field


@pytest.mark.parametrize("written, weight", [("", 1.0), (", weight = 3", 3.0), (", weight = 0.25", 0.25),
                                             (", weight = 1e9", 1e9)])
def test_a_workload_weight_field_is_read_and_the_default_is_one(tmp_path, written, weight):
    catalog = load_catalog(catalog_file(tmp_path, written))
    assert [w.weight for w in catalog.workloads] == [weight, 1.0, 1.0, 1.0]
    assert "weight" not in catalog.workloads[0].spec and "weight" not in catalog.workloads[0].normalized


@pytest.mark.parametrize("written, value, problem", [
    (", weight = 0", "0", "finite number > 0"),
    (", weight = -2.5", "-2.5", "finite number > 0"),
    (", weight = nan", "nan", "finite number > 0"),
    (", weight = inf", "inf", "finite number > 0"),
    (', weight = "high"', "'high'", "must be a number"),
    (", weight = true", "True", "must be a number"),
])
def test_a_bad_weight_is_an_error_naming_file_field_and_value(tmp_path, written, value, problem):
    path = catalog_file(tmp_path, written)
    with pytest.raises(ConfigError) as caught:
        load_catalog(path)
    assert str(caught.value).startswith(f"{path}: field 'problems[0].workloads[0].weight' = {value}: ")
    assert problem in str(caught.value)


def test_a_weight_changes_no_problem_id_and_no_task_spec(tmp_path):
    plain = load_catalog(catalog_file(tmp_path))
    weighted = load_catalog(catalog_file(tmp_path, ", weight = 1000"))
    target = Target("fp", "fp", "cpu")
    ids = [Planner(c, [target], "run").problem_id(target, c.workloads[0]) for c in (plain, weighted)]
    assert ids[0] == ids[1]
    tasks = [Planner(c, [target], "run").problem(target, c.workloads[0]).tasks for c in (plain, weighted)]
    assert [t.spec for t in tasks[0]] == [t.spec for t in tasks[1]]
    assert plain.workloads[0] == weighted.workloads[0]  # the weight is not part of a workload's identity


def test_a_recorded_problem_takes_a_weight_too(tmp_path):
    from test_replay_farm import write_recording

    write_recording(tmp_path / "vector_add_A.json", "GPU A", (64, 4, 0), 1)
    path = tmp_path / "recorded.toml"
    path.write_text('[[problems]]\nrecording = "vector_add_A.json"\nweight = 42.5\n')
    (workload,) = load_catalog(path).workloads
    assert workload.weight == 42.5 and workload.spec == {"recording": "vector_add_A.json"}
    path.write_text('[[problems]]\nrecording = "vector_add_A.json"\nweight = -1\n')
    with pytest.raises(ConfigError, match=r"field 'problems\[0\]\.weight' = -1: must be a finite number > 0"):
        load_catalog(path)


# ------------------------------------------------------------------------------ farm catalog weights FILE


CSV = """\
operation,workload,calls,seconds_per_call
matmul,m=64 n=64 k=64 float32,3600,0.001
matmul,"{""m"": 32, ""n"": 64, ""k"": 64, ""dtype"": ""float32"", ""layout"": ""a_transposed""}",100,0.002
softmax,rows=8 cols=32 contiguous float32 seed=0,50,0.0001
matmul,m=8 n=8 k=8 float32,5,0.001
conv2d,n=1 c=3 float32,7,0.01
"""


def farm_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", *args], capture_output=True, text=True,
                          env=farm_env({}), timeout=120)


def imported_weights(catalog: Path) -> list[float]:
    return [w.weight for w in load_catalog(catalog).workloads]


def test_a_csv_import_weights_the_catalog_and_farm_tune_reads_it(tmp_path):
    catalog = catalog_file(tmp_path)
    table = tmp_path / "fleet.csv"
    table.write_text(CSV)
    done = farm_cli("catalog", "weights", str(table), "--catalog", str(catalog))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"5 row(s) of {table}: 3 workload(s) of {catalog} weighted, 2 not in it"
    assert f"row 4: unknown workload: matmul m=8 n=8 k=8 float32 (not in {catalog})" in lines
    assert f"row 5: unknown operation: conv2d n=1 c=3 float32 (not in {catalog})" in lines
    assert any(line.startswith("1 workload(s) of the catalog have no row") and "m=16 n=16 k=16 float64" in line
               for line in lines)
    written = tmp_path / "release.weights.json"
    assert lines[-1] == (f'wrote {written} (3 weights); added [weights] file = "release.weights.json" to {catalog}')
    assert catalog.read_text().startswith(CATALOG.replace("WEIGHT", ""))  # the rest of the catalog is kept
    # calls x seconds per call; the workload without a row keeps the default
    assert imported_weights(catalog) == pytest.approx([3.6, 0.2, 1.0, 0.005])
    document = json.loads(written.read_text())
    assert document["schema"] == "farm-weights" and document["v"] == 1 and document["source"] == "fleet.csv"

    # Importing again overwrites the file the catalog names; the catalog is not edited twice.
    table.write_text(CSV.replace(",3600,", ",7200,"))
    again = farm_cli("catalog", "weights", str(table), "--catalog", str(catalog))
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1].endswith(f'{catalog} reads it ([weights] file = "release.weights.json")')
    assert catalog.read_text().count("[weights]") == 1
    assert imported_weights(catalog)[0] == pytest.approx(7.2)


def test_a_parquet_import_matches_labels_and_json_workloads_and_weights_by_calls_alone(tmp_path):
    catalog = catalog_file(tmp_path)
    table = tmp_path / "fleet.parquet"
    pq.write_table(pa.table({
        "operation": ["matmul", "softmax", "matmul"],
        "workload": ["m=32 n=64 k=64 a_transposed float32", json.dumps({"rows": 8, "cols": 32, "dtype": "float32"}),
                     "m=16 n=16 k=16 float64"],
        "calls": [120, 40_000, 7],
    }), table)
    done = farm_cli("catalog", "weights", str(table), "--catalog", str(catalog), "--out", str(tmp_path / "w.json"),
                    "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["not_in_catalog"] == [] and [u["where"] for u in report["unweighted"]] == ["problems[0].workloads[0]"]
    assert imported_weights(catalog) == [1.0, 120.0, 7.0, 40_000.0]
    assert read_weights(tmp_path / "w.json")[("softmax", json.dumps(
        {"cols": 32, "dtype": "float32", "layout": "contiguous", "rows": 8, "seed": 0}, separators=(",", ":")))] == 40_000


BAD_ROWS = [
    ("operation,workload\nmatmul,m=1\n", "<columns>", "missing column 'calls'"),
    ("operation,workload,calls,host\nmatmul,m=1,1,a\n", "<columns>", "unknown column"),
    ("operation,workload,calls\n", "<rows>", "no rows"),
    ("operation,workload,calls\nmatmul,m=64 n=64 k=64 float32,many\n", "row 1.calls", "= 'many': must be a number"),
    ("operation,workload,calls\nmatmul,m=64 n=64 k=64 float32,0\n", "row 1.calls", "finite number > 0"),
    ("operation,workload,calls\nmatmul,m=64 n=64 k=64 float32,1\nmatmul,m=64 n=64 k=64 float32,-3\n",
     "row 2.calls", "= '-3': must be a finite number > 0"),
    ("operation,workload,calls\nmatmul,m=64 n=64 k=64 float32,1\n,m=1,1\n", "row 2.operation", "non-empty"),
    ("operation,workload,calls\nmatmul,{\"m\": 64,1\n", "row 1.workload", "not a JSON object"),
    ("operation,workload,calls\nmatmul,m=64 n=64 k=64 int8,1\n", "row 1.workload.dtype", "does not support dtype int8"),
    ("operation,workload,calls\nmatmul,m=64 n=64 k=64 float32,1\nmatmul,m=64 n=64 k=64 contiguous float32 seed=0,2\n",
     "row 2.workload", "the same workload as row 1"),
    ("operation,workload,calls,seconds_per_call\nmatmul,m=64 n=64 k=64 float32,1,0.5\nsoftmax,rows=8 cols=32 float32,1,\n",
     "row 2.seconds_per_call", "every row or on none"),
    ("operation,workload,calls\nmatmul,m=64 n=64 k=64 float32,1,9\n", "row 1", "more cells than columns"),
]


@pytest.mark.parametrize("text, field, problem", BAD_ROWS)
def test_a_bad_row_is_an_error_naming_file_row_field_and_value_and_nothing_is_written(tmp_path, text, field, problem):
    catalog = catalog_file(tmp_path)
    before = catalog.read_text()
    table = tmp_path / "bad.csv"
    table.write_text(text)
    with pytest.raises(ConfigError) as caught:
        match(load_catalog(catalog).workloads, read_rows(table), str(table))
    assert str(caught.value).startswith(f"{table}: field {field!r}") and problem in str(caught.value)
    done = farm_cli("catalog", "weights", str(table), "--catalog", str(catalog))
    assert done.returncode == 2 and done.stderr.startswith(f"farm: error: {table}: field {field!r}"), done.stderr
    assert catalog.read_text() == before and not (tmp_path / "release.weights.json").exists()


def test_unknown_rows_under_strict_fail_and_write_nothing(tmp_path):
    catalog = catalog_file(tmp_path)
    table = tmp_path / "fleet.csv"
    table.write_text(CSV)
    done = farm_cli("catalog", "weights", str(table), "--catalog", str(catalog), "--strict")
    assert done.returncode == 1
    assert "2 row(s) of" in done.stderr and "nothing written" in done.stderr
    assert "[weights]" not in catalog.read_text() and not (tmp_path / "release.weights.json").exists()


def test_a_workload_weighted_twice_or_a_foreign_weights_file_is_an_error(tmp_path):
    catalog = catalog_file(tmp_path)
    table = tmp_path / "fleet.csv"
    table.write_text(CSV)
    assert farm_cli("catalog", "weights", str(table), "--catalog", str(catalog)).returncode == 0
    catalog.write_text(catalog.read_text().replace('dtype = "float32" },', 'dtype = "float32", weight = 9 },', 1))
    with pytest.raises(ConfigError, match=r"field 'problems\[0\]\.workloads\[0\]\.weight' = 9\.0: "
                                          r"release\.weights\.json weights this workload 3\.6"):
        load_catalog(catalog)
    catalog.write_text(catalog.read_text().replace(", weight = 9", ""))
    weights = tmp_path / "release.weights.json"
    weights.write_text(weights.read_text().replace('"v": 1', '"v": 2'))
    with pytest.raises(ConfigError, match=r"field 'weights\.file' = 'release\.weights\.json': .*field 'v' = 2: "
                                          r"unsupported weights file version"):
        load_catalog(catalog)
    weights.unlink()
    with pytest.raises(ConfigError, match=r"field 'weights\.file' = 'release\.weights\.json': no such weights file"):
        load_catalog(catalog)
    # Importing again repairs it: the import reads the catalog without its weights file.
    assert farm_cli("catalog", "weights", str(table), "--catalog", str(catalog)).returncode == 0
    assert imported_weights(catalog)[0] == pytest.approx(3.6)


# ------------------------------------------------------------------------------ weights from the fleet's reports


def identity_set() -> farm.TunableSet:
    tunable = farm.TunableSet("weights_identity", signature=farm.array_signature)
    tunable.add(lambda x: x.copy(), name="reference", reference=True)
    tunable.add(lambda x: x + 0, name="plus_zero", group=0)
    return tunable


@pytest.mark.servers
def test_the_fleet_counts_calls_per_workload_and_a_fleet_run_weights_its_problems(redis_db, redis_srv):
    """The runtime counts every call (hits too); the real reporter thread sends the counts to a real Redis; the
    coordinator folds them into its hash, deletes them from the stream, and weights the reported problems."""
    settings = Settings.from_env({"FARM_PREFIX": "wt"}, redis_url=redis_srv.url(1))
    reporter = FleetReporter(redis_srv.url(1), prefix="wt", count_interval=3600.0)
    tuner = farm.enable_stack_autotune(farm.StackPolicy(warmups=1, samples=3, budget=5.0), fleet=[MemoryStore(16)])
    tuner.feedback = reporter
    client = farm.HostClient(0)
    registry.ensure_loaded()
    softmax = registry.get("softmax")
    specs = [{"rows": 4, "cols": 8, "dtype": "float32", "layout": "contiguous"},
             {"rows": 4, "cols": 16, "dtype": "float32", "layout": "contiguous"}]
    for spec, calls in zip(specs, (30, 5), strict=True):
        inputs = softmax.build(spec, client)
        for _ in range(calls):  # one miss (tuned here), then memory hits: every call counts
            farm.try_execute_stack("softmax", "cpu", client, softmax.host, inputs)
    identity, x = identity_set(), np.ones(4)  # a workload without a spec: counted, never reported
    farm.try_execute_stack("weights_identity", "cpu", client, identity, (x,))
    assert tuner.stats().memory_hits == 33
    assert reporter.flush(30)
    stats = reporter.stats()
    assert stats.counted == 35 and stats.failures == 0

    reports, calls, malformed = read_stream(redis_db, settings)
    assert malformed == [] and sorted((r.kind, r.spec is None) for r in reports) == [
        ("miss", False), ("miss", False), ("miss", True)]  # the set without a spec: a miss by signature only
    (report,) = calls
    assert [(c.spec, c.calls) for c in report.counts] == [(specs[0], 30), (specs[1], 5)]  # the busiest first
    assert report.since <= report.time and len({c.fingerprint for c in report.counts}) == 1

    # A second flush sends only what was counted since.
    farm.try_execute_stack("softmax", "cpu", client, softmax.host, softmax.build(specs[1], client))
    assert reporter.flush(30)
    reports, calls, _ = read_stream(redis_db, settings)
    assert [[(c.spec, c.calls) for c in r.counts] for r in calls] == [[(specs[0], 30), (specs[1], 5)], [(specs[1], 1)]]
    reporter.close()
    shown = waiting(redis_db, settings)  # farm status: the misses wait; the calls reports are counted apart
    assert (shown["total"], shown["calls_reports"], sum(row["reports"] for row in shown["by"])) == (3, 2, 3)

    # A fleet run folds the counts (and deletes them from the stream) and weights each problem by its calls/hour.
    seen = []

    def run(catalog, fingerprint, force):
        seen.append(catalog)
        raise FarmError("no live workers for this fingerprint")

    before = time.time()
    result = tune_from_fleet(redis_db, settings, farm.StackPolicy(), run)
    (catalog,) = seen
    first, second = sorted(catalog.workloads, key=lambda w: -w.weight)
    assert (first.spec, second.spec) == (specs[0], specs[1])
    assert first.weight / second.weight == pytest.approx(30 / 6)  # calls over the same hours
    assert result.entries[0].reason.endswith("calls/h")
    assert len(read_stream(redis_db, settings)[0]) == 3  # the misses stay: no worker tuned them
    assert read_stream(redis_db, settings)[1] == []  # the counts are folded
    folded = redis_db.hgetall(f"wt:{CALLS_KEY}")
    assert json.loads(folded.pop(CALLS_META)) == {"v": 1, "since": report.since}
    assert sorted(int(v) for v in folded.values()) == [6, 30]
    assert sorted(calls_per_hour(redis_db, settings, before + 3600).values()) == pytest.approx(
        sorted(n * 3600 / (before + 3600 - report.since) for n in (6, 30)))


@pytest.mark.servers
def test_a_calls_hash_of_another_schema_is_refused_never_overwritten(redis_db, redis_srv):
    settings = Settings.from_env({"FARM_PREFIX": "wt"}, redis_url=redis_srv.url(1))
    redis_db.hset(f"wt:{CALLS_KEY}", CALLS_META, json.dumps({"v": 99, "since": 0}))
    redis_db.xadd(stream_key("wt"), {"report": json.dumps({"v": 1, "kind": "calls", "time": 2.0, "since": 1.0,
                                                           "counts": []})})
    _, calls, _ = read_stream(redis_db, settings)
    with pytest.raises(FarmError, match="schema 99"):
        fold_calls(redis_db, settings, calls)
    assert redis_db.xlen(stream_key("wt")) == 1


@pytest.mark.servers
@pytest.mark.parametrize("report", [
    {"v": 2, "kind": "calls", "time": 2.0, "since": 1.0, "counts": []},
    {"v": 1, "kind": "calls", "time": 2.0, "counts": []},
    {"v": 1, "kind": "calls", "time": 2.0, "since": 1.0, "counts": 5},
    {"v": 1, "kind": "calls", "time": 2.0, "since": 1.0, "counts": [{"operation": "softmax", "spec": {}}]},
])
def test_a_malformed_calls_report_is_counted_malformed_never_folded(redis_db, redis_srv, report):
    settings = Settings.from_env({"FARM_PREFIX": "wt"}, redis_url=redis_srv.url(1))
    entry = redis_db.xadd(stream_key("wt"), {"report": json.dumps(report)})
    assert read_stream(redis_db, settings) == ([], [], [entry])


def test_the_reporter_keeps_a_bounded_counter_per_workload_and_reports_an_evicted_ones_calls(monkeypatch):
    from fakes import problem

    import farm.feedback as feedback

    reporter = FleetReporter("redis://127.0.0.1:1/0", count_interval=3600.0)
    reporter.close()  # nothing is sent: the test reads what would be
    monkeypatch.setattr(feedback, "MAX_KEYS", 2)
    for i in range(3):
        reporter.describe(problem(workload=f"w{i}"), f"key{i}", "softmax", "cpu", {"rows": i})
        reporter.counter(f"key{i}")[0] += 10 + i
    assert reporter.counter("key0") == [0, 0]  # evicted: a fresh counter nobody reports
    assert [reporter.counter(f"key{i}")[0] for i in (1, 2)] == [11, 12]
    with reporter._lock:
        pending = [(key, n) for key, n, _ in reporter._uncounted]
    assert pending == [("key0", 10)]  # its calls are still reported with the next counts
