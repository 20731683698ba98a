"""Parquet archives: Redis -> archive -> a fresh Redis or cache directory, the runtime's archive tier, every
corrupt-archive refusal (nothing imported), the fingerprint rule with --force, merge and diff, and the CLI."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from servers import farm_env

import farm
from farm.environment import fingerprint_digest, runtime_environment
from farm.identity import Candidate, Problem, Scope, cache_key, fields, key_environment, split_fields
from farm.stores import archive as arc
from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore
from farm.stores.redis import RedisDecisions, field_for
from farm_coordinator import archive as ops
from farm_coordinator.aggregate import TRIAL_FIELDS
from farm_coordinator.sinks import DirectorySink
from farm_fleet.settings import Settings

FP_A = fields(["host-numpy", "cpu", "model A", "driver 1", "cpython", "build 1", "", "opts"])
FP_B = fields(["host-numpy", "cpu", "model B", "driver 1", "cpython", "build 1", "", "opts"])
POLICY = farm.StackPolicy()
NAMES = ("ref", "fast", "other")
PREFIX = "t"


def key_for(fingerprint: str, workload: str, operation: str = "scale", names: tuple[str, ...] = NAMES) -> str:
    problem = Problem(Scope.OPERATOR, operation, fingerprint, workload, persistent=True)
    return cache_key(problem, [Candidate(n) for n in names], 0, POLICY)


def make_record(key: str, winner: int = 1, *, verified: bool = True, created: float = 1000.0, ratio: float = 0.5,
                run: str = "run-1", names: tuple[str, ...] = NAMES, **meta: object) -> DecisionRecord:
    workload = split_fields(key)[4]
    body = {"run": run, "problem_id": f"pid-{hashlib.sha256(key.encode()).hexdigest()[:8]}",
            "operation": split_fields(key)[2], "device_kind": "cpu", "spec": {"workload": workload, "n": 4},
            "fingerprint": fingerprint_digest(key_environment(key)), "reference": names[0], "relative_mad": 0.01,
            "samples": 5, "accuracy_key": POLICY.accuracy_key(), "farm_version": "0.1.0", "confirmation": None,
            **meta}
    return DecisionRecord(key, winner, 0, names[winner], verified, ratio if winner else 1.0, created, body)


def make_trials(record: DecisionRecord, n: int = 3) -> list[dict[str, object]]:
    rows = []
    for i in range(n):
        rows.append({"run": record.meta.get("run"), "problem_id": record.meta.get("problem_id"), "group": "0",
                     "role": "candidate", "candidate": record.name, "candidate_index": record.index,
                     "verdict": "passed", "note": "", "pair": i, "reference_seconds": 0.002 + i * 1e-4,
                     "candidate_seconds": 0.001 + i * 1e-5, "max_abs_error": 0.0, "max_rel_error": None,
                     "host": "host-1", "device": "cpu:0", "worker": "local-cpu0", "attempt": 1})
    rows.append({**rows[0], "role": "reference", "candidate": "ref", "candidate_index": 0, "verdict": "reference",
                 "pair": 0, "candidate_seconds": None})
    return rows


def entry(key: str, **kw: object) -> arc.ArchiveEntry:
    record = make_record(key, **kw)  # type: ignore[arg-type]
    return arc.ArchiveEntry(record, str(record.meta["problem_id"]), tuple(make_trials(record)))


@pytest.fixture
def store(redis_db):
    return RedisDecisions(client=redis_db, settings=Settings(prefix=PREFIX))


def publish_fleet(store: RedisDecisions) -> list[DecisionRecord]:
    """Five decisions over two fingerprints, with trial rows and problem ids; one without either."""
    records = []
    for fp, workloads in ((FP_A, ("n=1", "n=2", "n=3")), (FP_B, ("n=1", "n=9"))):
        for i, w in enumerate(workloads):
            r = make_record(key_for(fp, w), winner=1 + i % 2, verified=i != 1, created=1000.0 + i)
            if w == "n=3":
                store.publish(r, fp)
            else:
                store.publish(r, fp, str(r.meta["problem_id"]), make_trials(r))
            records.append(r)
    return records


def redis_state(client) -> dict[str, object]:
    """Every key of the database with its content (hashes; streams as their entries' fields)."""
    state: dict[str, object] = {}
    for key in sorted(client.keys("*")):
        kind = client.type(key)
        if kind == "hash":
            value = client.hgetall(key)
            if ":trials:" in key:
                value = {k: json.loads(v) for k, v in value.items()}
            state[key] = value
        elif kind == "stream":
            state[key] = [fields_ for _, fields_ in client.xrange(key)]
        else:
            state[key] = (kind, client.dump(key))
    return state


def tree(directory: Path) -> dict[str, bytes]:
    if not directory.exists():
        return {}
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def cache_state(cache: Path) -> list[tuple[object, ...]]:
    """Every row of a local cache (records, problem ids, trial rows) and its fingerprints."""
    local = LocalStore(cache)
    state = sorted(row for batch in local.scan() for row in batch)
    fingerprints = sorted(local.fingerprints().items())
    local.close()
    return [*state, *fingerprints]


def reseal(folder: Path) -> None:
    """Recompute the manifest's checksums, byte and row counts after a hand edit (so deeper checks are reached)."""
    manifest = json.loads((folder / arc.MANIFEST_FILE).read_text())
    for name in arc.DATA_FILES:
        data = (folder / name).read_bytes()
        manifest["sha256"][name] = hashlib.sha256(data).hexdigest()
        manifest["bytes"][name] = len(data)
    manifest["rows"] = {"decisions": pq.read_metadata(folder / arc.DECISIONS_FILE).num_rows,
                        "trials": pq.read_metadata(folder / arc.TRIALS_FILE).num_rows}
    (folder / arc.MANIFEST_FILE).write_text(json.dumps(manifest))


def edit_rows(folder: Path, name: str, change) -> None:
    table = pq.read_table(folder / name)
    rows = change(table.to_pylist())
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), folder / name)
    reseal(folder)


def edit_manifest(folder: Path, change) -> None:
    manifest = json.loads((folder / arc.MANIFEST_FILE).read_text())
    change(manifest)
    (folder / arc.MANIFEST_FILE).write_text(json.dumps(manifest))


def hand_archive(parent: Path, fingerprint: str, entries: list[arc.ArchiveEntry]) -> Path:
    return arc.write_archive(parent, fingerprint, entries).path


def farm_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", "archive", *args], capture_output=True, text=True,
                          env=farm_env({"FARM_PREFIX": PREFIX}), cwd=cwd, timeout=120)


# -- format -----------------------------------------------------------------------------------------------------


def test_the_trial_columns_are_the_coordinators_trial_fields_and_keys_are_named_as_in_redis():
    assert arc.TRIAL_FIELDS == TRIAL_FIELDS
    key = key_for(FP_A, "n=1")
    assert arc.key_sha256(key) == field_for(key)
    # Schema 2 stores the key's parts (the environment is the manifest's fingerprint), never the key or its hash.
    assert arc.DECISION_FIELDS[:7] == tuple(p for p in arc.KEY_PARTS if p not in ("environment",
                                                                              "reference_position"))
    assert not {"key_sha256", "cache_key", "record_json", "environment"} & set(arc.DECISION_FIELDS)


def test_an_archive_has_the_documented_layout_manifest_and_column_types(tmp_path):
    e = entry(key_for(FP_A, "n=1"))
    folder = hand_archive(tmp_path, FP_A, [e])
    assert folder == tmp_path / fingerprint_digest(FP_A)
    assert sorted(p.name for p in folder.iterdir()) == ["decisions.parquet", "manifest.json", "trials.parquet"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["schema_version"] == 2 == arc.ARCHIVE_SCHEMA_VERSION
    assert manifest["fingerprint"] == FP_A and manifest["digest"] == fingerprint_digest(FP_A)
    assert manifest["rows"] == {"decisions": 1, "trials": 4}
    for name in arc.DATA_FILES:
        assert manifest["sha256"][name] == hashlib.sha256((folder / name).read_bytes()).hexdigest()
    row = pq.read_table(folder / "decisions.parquet").to_pylist()[0]
    schema = pq.read_schema(folder / "decisions.parquet")
    assert schema.field("winner_index").type == pa.int32() and schema.field("ratio").type == pa.float64()
    assert schema.field("verified").type == pa.bool_() and schema.field("checksum").type == pa.binary(32)
    assert schema.field("key_hash").type == pa.int64()
    text = e.record.to_json()
    assert row["meta_json"] == arc.canonical_json(dict(e.record.meta)) and row["checksum"].hex() == text[-66:-2]
    body = arc.record_body(e.record.cache_key, row["created"], row["winner_index"], row["meta_json"], row["winner"],
                           row["ratio"], row["reference_index"], row["verified"])
    assert body[:-1] + ',"checksum":"' + hashlib.sha256(body.encode()).hexdigest() + '"}' == text
    assert row["key_hash"] == int.from_bytes(hashlib.sha256(e.record.cache_key.encode()).digest()[:8], "big",
                                             signed=True)
    assert (row["winner"], row["winner_index"], row["reference_index"]) == ("fast", 1, 0)
    assert row["accuracy_key"] == POLICY.accuracy_key() and row["workload"] == "n=1"
    assert row["problem_id"] == e.problem_id
    trials = pq.read_table(folder / "trials.parquet").to_pylist()
    assert [t["decision"] for t in trials] == [0, 0, 0, 0]
    assert [{k: v for k, v in t.items() if k not in ("decision", "extra_json")} for t in trials] == list(e.trials)
    (read,) = arc.read_archive(folder).entries.values()
    assert read == e and read.text == text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left behind


def test_trial_fields_a_newer_farm_adds_survive_and_a_repeated_key_is_refused(tmp_path):
    e = entry(key_for(FP_A, "n=1"))
    rows = tuple({**t, "pid": 4242, "key_sha256": e.key_sha256} for t in e.trials)
    folder = hand_archive(tmp_path, FP_A, [arc.ArchiveEntry(e.record, e.problem_id, rows)])
    (read,) = arc.read_archive(folder).entries.values()
    assert read.trials == tuple({k: v for k, v in t.items() if k != "key_sha256"} for t in rows)
    edit_rows(folder, arc.DECISIONS_FILE, lambda decisions: decisions + decisions)
    with pytest.raises(arc.ArchiveError, match="row 1 .*duplicate key: refused"):
        arc.read_archive(folder)


def test_rewriting_an_archive_replaces_it_whole_and_a_refused_write_leaves_the_old_one(tmp_path):
    first = hand_archive(tmp_path, FP_A, [entry(key_for(FP_A, "n=1"))])
    hand_archive(tmp_path, FP_A, [entry(key_for(FP_A, "n=2")), entry(key_for(FP_A, "n=3"))])
    assert len(arc.read_archive(first).entries) == 2
    before = tree(first)
    with pytest.raises(arc.ArchiveError, match="environment is not the archive's fingerprint"):
        hand_archive(tmp_path, FP_A, [entry(key_for(FP_B, "n=1"))])
    assert tree(first) == before
    assert [p.name for p in tmp_path.iterdir()] == [first.name]


# -- round trips ------------------------------------------------------------------------------------------------


def test_redis_to_archive_to_a_fresh_redis_gives_identical_decisions_trials_and_problem_index(store, redis_db,
                                                                                            tmp_path):
    records = publish_fleet(store)
    before = redis_state(redis_db)
    results = ops.export_redis(store, tmp_path / "out")
    assert sorted(r.digest for r in results) == sorted([fingerprint_digest(FP_A), fingerprint_digest(FP_B)])
    assert sum(r.written.decisions for r in results) == len(records)
    assert all(not r.skipped for r in results)

    redis_db.flushdb()
    archives = ops.load_archives(tmp_path / "out")
    imported = ops.import_redis(archives, RedisDecisions(client=redis_db, settings=Settings(prefix=PREFIX)))
    assert sum(r.new for r in imported) == len(records) and not any(r.forced for r in imported)
    after = redis_state(redis_db)
    events = "t:events"
    assert {k: v for k, v in after.items() if k != events} == {k: v for k, v in before.items() if k != events}
    assert len(after[events]) == len(records)  # type: ignore[arg-type]


def test_redis_to_archive_to_a_fresh_cache_directory_gives_the_decisions_the_runtime_and_sink_read(store, tmp_path):
    records = publish_fleet(store)
    ops.export_redis(store, tmp_path / "out", fingerprint=fingerprint_digest(FP_A))
    archives = ops.load_archives(tmp_path / "out")
    assert [a.digest for a in archives] == [fingerprint_digest(FP_A)]
    cache = tmp_path / "cache"
    result = ops.import_cache(archives, cache, FP_A)
    assert result[0].new == 3
    local = LocalStore(cache, capacity=100)
    for r in records[:3]:
        assert local.get(r.cache_key) == r
        assert local.trials(r.cache_key) == store.trials(fingerprint_digest(FP_A), r.cache_key)
    sink = DirectorySink(cache)
    pids = [str(r.meta["problem_id"]) for r in records[:3]]
    assert sink.decided(fingerprint_digest(FP_A), pids) == set(pids[:2])  # the third was published without one
    # ... and the cache directory exports back to the same decisions.
    again = ops.export_cache(cache, tmp_path / "again")
    assert sorted(e.record.to_json() for e in arc.read_archive(again[0].written.path).entries.values()) == sorted(
        r.to_json() for r in records[:3])


def test_importing_into_a_cache_directory_applies_the_replacement_rule_to_what_is_there(tmp_path):
    key = key_for(FP_A, "n=1")
    cache = tmp_path / "cache"
    LocalStore(cache, 100).put(make_record(key, verified=True, created=50.0, winner=2))
    folder = hand_archive(tmp_path / "a", FP_A, [entry(key, verified=False, created=99.0),
                                                  entry(key_for(FP_A, "n=2"))])
    result = ops.import_cache([arc.read_archive(folder)], cache, FP_A)
    assert (result[0].new, result[0].replaced, result[0].kept) == (1, 0, 1)
    assert LocalStore(cache, 100).get(key).name == "other"


# -- the runtime's fleet tier -----------------------------------------------------------------------------------


class CountingRunner:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def validate(self, reference, candidate, tolerance):
        self.calls.append("validate")
        return self.inner.validate(reference, candidate, tolerance)

    def measure(self, candidate):
        self.calls.append("measure")
        return self.inner.measure(candidate)


def scale_operation():
    from farm_kernels import registry

    registry.ensure_loaded(("farm_testops",))
    return registry.get("farmtest_scale")


def publish_runtime_decision(store: RedisDecisions, fingerprint: str | None = None) -> DecisionRecord:
    """The decision a fresh runtime on cpu:0 looks up for farmtest_scale, n=64, under ``fingerprint``'s key."""
    from farm.adapter import prepare

    op = scale_operation()
    client = farm.HostClient(0)
    env = runtime_environment(client)
    assert env.persistent
    inputs = op.build({"n": 64, "dtype": "float64"}, client)
    prepared = prepare(farm.StackTuner(POLICY), op.name, "cpu", client, op.host, inputs)
    key = prepared.request.key
    if fingerprint is not None:
        parts = split_fields(key)
        parts[3] = fingerprint
        key = fields(parts)
    names = tuple(c.name for c in prepared.request.candidates)
    record = DecisionRecord(key, names.index("vectorized"), 0, "vectorized", True, 0.2, time.time() - 60,
                            {"run": "r1", "operation": op.name, "problem_id": "p-runtime"})
    store.publish(record, key_environment(key), "p-runtime")
    return record


def test_a_runtime_with_only_an_archive_hits_after_one_validation_and_no_tuning(store, tmp_path):
    from farm.adapter import RuntimeTrials, prepare

    published = publish_runtime_decision(store)
    ops.export_redis(store, tmp_path / "archives")
    op = scale_operation()
    client = farm.HostClient(0)
    inputs = op.build({"n": 64, "dtype": "float64"}, client)
    tuner = farm.StackTuner(POLICY, fleet=[arc.ArchiveStore(tmp_path / "archives")])
    prepared = prepare(tuner, op.name, "cpu", client, op.host, inputs)
    assert prepared.request.key == published.cache_key
    runner = CountingRunner(RuntimeTrials(client, op.host, inputs, prepared.indices, POLICY.timing))
    first = tuner.select_request(prepared.request, runner)
    second = tuner.select_request(prepared.request, runner)
    assert (first.source, first.name) == (farm.DecisionSource.FLEET_CACHE, "vectorized")
    assert second.source is farm.DecisionSource.MEMORY_CACHE
    stats = tuner.stats()
    assert (stats.fleet_hits, stats.memory_hits, stats.tunes, stats.misses) == (1, 1, 0, 0)
    assert runner.calls == ["validate"]


RUNTIME_SCRIPT = """
import json, sys
import farm
from farm.stores.archive import ArchiveStore
from farm_kernels import registry

calls = {"validate": 0, "measure": 0}
for name in calls:
    original = getattr(farm.RuntimeTrials, name)
    def counting(self, *args, _original=original, _name=name):
        calls[_name] += 1
        return _original(self, *args)
    setattr(farm.RuntimeTrials, name, counting)
registry.ensure_loaded(("farm_testops",))
op = registry.get("farmtest_scale")
tuner = farm.enable_stack_autotune(farm.StackPolicy(), fleet=[ArchiveStore(sys.argv[1])])
client = farm.HostClient(0)
x = op.build({"n": 64, "dtype": "float64"}, client)[0]
outputs = [farm.try_execute_stack(op.name, "cpu", client, op.host, (x,)) for _ in range(2)]
s = tuner.stats()
print(json.dumps({"calls": calls, "fleet_hits": s.fleet_hits, "memory_hits": s.memory_hits, "tunes": s.tunes,
                  "correct": all(bool((y == 2.0 * x).all()) for y in outputs)}))
"""


def test_a_runtime_process_started_with_only_an_archive_directory_hits_without_tuning(store, tmp_path):
    publish_runtime_decision(store)
    ops.export_redis(store, tmp_path / "archives")
    script = tmp_path / "runtime.py"
    script.write_text(RUNTIME_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "archives")], capture_output=True, text=True,
                          env=farm_env(), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {"calls": {"validate": 1, "measure": 0}, "fleet_hits": 1, "memory_hits": 1, "tunes": 0,
                      "correct": True}


def test_a_non_persistent_environment_never_consults_the_archive(tmp_path):
    from fakes import FakeRunner

    policy = farm.StackPolicy(mode=farm.Mode.CACHE_ONLY)
    cands = [Candidate(n) for n in NAMES]
    persistent = Problem(Scope.OPERATOR, "scale", FP_A, "n=1", persistent=True)
    session = Problem(Scope.OPERATOR, "scale", FP_A, "n=2", persistent=False)
    entries = [arc.ArchiveEntry(make_record(cache_key(p, cands, 0, policy), created=time.time() - 60))
               for p in (persistent, session)]
    hand_archive(tmp_path, FP_A, entries)
    archives = arc.ArchiveStore(tmp_path)
    tuner = farm.StackTuner(policy, fleet=[archives])
    assert tuner.select(persistent, cands, 0, FakeRunner()).source is farm.DecisionSource.FLEET_CACHE
    assert archives.lookups == 1
    assert tuner.select(session, cands, 0, FakeRunner()).source is farm.DecisionSource.CACHE_MISS
    assert archives.lookups == 1


def test_an_archive_directory_path_is_a_fleet_source_of_the_controller(tmp_path):
    from fakes import FakeRunner

    policy = farm.StackPolicy(mode=farm.Mode.CACHE_ONLY)
    cands = [Candidate(n) for n in NAMES]
    problem = Problem(Scope.OPERATOR, "scale", FP_A, "n=1", persistent=True)
    hand_archive(tmp_path, FP_A, [arc.ArchiveEntry(make_record(cache_key(problem, cands, 0, policy),
                                                               created=time.time() - 60))])
    tuner = farm.StackTuner(policy, fleet=[str(tmp_path)])
    decision = tuner.select(problem, cands, 0, FakeRunner())
    assert (decision.source, decision.name) == (farm.DecisionSource.FLEET_CACHE, "fast")


def test_the_archive_tier_is_read_only_and_picks_by_the_replacement_rule_across_directories(tmp_path):
    key = key_for(FP_A, "n=1")
    hand_archive(tmp_path / "one", FP_A, [entry(key, verified=True, created=10.0, winner=1)])
    hand_archive(tmp_path / "two", FP_A, [entry(key, verified=False, created=20.0, winner=2)])
    hand_archive(tmp_path / "two", FP_B, [entry(key_for(FP_B, "n=1"), winner=2)])
    archives = arc.ArchiveStore(tmp_path / "one", tmp_path / "two")
    assert archives.get(key).name == "fast"
    assert archives.get(key_for(FP_A, "n=404")) is None
    assert archives.get(key_for(fields(["unknown"]), "n=1")) is None
    assert archives.get(key_for(FP_B, "n=1")).name == "other"
    assert archives.load() == 3
    with pytest.raises(farm.TuneFailure, match="read-only"):
        archives.put(make_record(key))
    archives.delete(key)
    assert archives.get(key).name == "fast"
    with pytest.raises(arc.ArchiveError, match="no such archive directory"):
        arc.ArchiveStore(tmp_path / "missing")


def test_a_corrupt_archive_is_a_cache_warning_for_the_runtime_never_an_error(tmp_path):
    key = key_for(FP_A, "n=1")
    folder = hand_archive(tmp_path, FP_A, [entry(key, created=time.time() - 60)])
    with open(folder / arc.DECISIONS_FILE, "r+b") as f:
        f.truncate(100)
    tuner = farm.StackTuner(farm.StackPolicy(mode=farm.Mode.CACHE_ONLY), fleet=[arc.ArchiveStore(tmp_path)])
    from fakes import FakeRunner

    problem = Problem(Scope.OPERATOR, "scale", FP_A, "n=1", persistent=True)
    decision = tuner.select(problem, [Candidate(n) for n in NAMES], 0, FakeRunner())
    assert decision.source is farm.DecisionSource.CACHE_MISS
    assert tuner.stats().cache_warnings == 1


# -- hostile archives: refused at once, never followed, never a hang ---------------------------------------------


def _symlink_to_dev_zero(folder: Path) -> None:
    (folder / arc.DECISIONS_FILE).unlink()
    os.symlink("/dev/zero", folder / arc.DECISIONS_FILE)


def _fifo(name: str):
    def make(folder: Path) -> None:
        (folder / name).unlink()
        os.mkfifo(folder / name)
    return make


def _copies_of_one_row(folder: Path) -> None:
    table = pq.read_table(folder / arc.DECISIONS_FILE)
    pq.write_table(table.take([0] * 20000), folder / arc.DECISIONS_FILE, compression="zstd", row_group_size=1024)
    reseal(folder)


def _one_huge_row_group(folder: Path) -> None:
    table = pq.read_table(folder / arc.DECISIONS_FILE)
    pq.write_table(table.take([0] * 70000), folder / arc.DECISIONS_FILE, compression="zstd", row_group_size=70000)
    reseal(folder)


HOSTILE = {
    "decisions.parquet is a symlink to /dev/zero": (
        _symlink_to_dev_zero, "decisions.parquet: a symbolic link, not a regular file: refused"),
    "decisions.parquet is a FIFO": (_fifo(arc.DECISIONS_FILE), "decisions.parquet: a FIFO, not a regular file"),
    "manifest.json is a FIFO": (_fifo(arc.MANIFEST_FILE), "manifest.json: a FIFO, not a regular file"),
    "20,000 copies of one row": (_copies_of_one_row, "decisions.parquet: row 1 .*duplicate key: refused"),
    "one row group of 70,000 rows": (_one_huge_row_group, "row group 0 holds 70000 rows"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_archive_is_a_one_line_refusal_for_the_cli_and_a_warning_and_miss_for_an_application(
        case, tmp_path, caplog):
    make_hostile, message = HOSTILE[case]
    key = key_for(FP_A, "n=1")
    folder = hand_archive(tmp_path / "in", FP_A, [entry(key, created=time.time() - 60), entry(key_for(FP_A, "n=2"))])
    make_hostile(folder)
    for command in ("inspect", "import"):
        args = [command, str(folder)] + (["--into-cache", str(tmp_path / "cache")] if command == "import" else [])
        done = farm_cli(*args, cwd=tmp_path)  # (a hang would exceed farm_cli's timeout)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and re.search(message, done.stderr), done.stderr
    assert not (tmp_path / "cache").exists()

    from fakes import FakeRunner

    with caplog.at_level(logging.WARNING):
        tuner = farm.StackTuner(farm.StackPolicy(mode=farm.Mode.CACHE_ONLY), fleet=[arc.ArchiveStore(tmp_path / "in")])
        problem = Problem(Scope.OPERATOR, "scale", FP_A, "n=1", persistent=True)
        decision = tuner.select(problem, [Candidate(n) for n in NAMES], 0, FakeRunner())
    assert decision.source is farm.DecisionSource.CACHE_MISS
    assert re.search(message, caplog.text)


def test_archives_and_a_new_cache_follow_the_umask_and_an_existing_cache_keeps_its_mode(tmp_path):
    old = os.umask(0o022)
    try:
        folder = hand_archive(tmp_path / "out", FP_A, [entry(key_for(FP_A, "n=1"))])
        ops.import_cache([arc.read_archive(folder)], tmp_path / "new-cache", FP_A)
        shared = tmp_path / "shared-cache"
        shared.mkdir(mode=0o750)
        os.chmod(shared, 0o750)
        ops.import_cache([arc.read_archive(folder)], shared, FP_A)
    finally:
        os.umask(old)

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(folder) == 0o755 and {mode(p) for p in folder.iterdir()} == {0o644}
    assert mode(tmp_path / "new-cache") == 0o755
    assert {mode(p) for p in (tmp_path / "new-cache").iterdir()} == {0o644}
    assert mode(shared) == 0o750


# -- refusals: nothing imported ---------------------------------------------------------------------------------


def _truncate(folder: Path) -> None:
    path = folder / arc.DECISIONS_FILE
    path.write_bytes(path.read_bytes()[:-200])


def _truncate_resealed(folder: Path) -> None:
    path = folder / arc.TRIALS_FILE
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    manifest = json.loads((folder / arc.MANIFEST_FILE).read_text())
    manifest["sha256"][arc.TRIALS_FILE] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest["bytes"][arc.TRIALS_FILE] = len(path.read_bytes())
    (folder / arc.MANIFEST_FILE).write_text(json.dumps(manifest))


def _bad_sha(folder: Path) -> None:
    edit_manifest(folder, lambda m: m["sha256"].__setitem__(arc.DECISIONS_FILE, "0" * 64))


def row_key(row: dict[str, object], fingerprint: str) -> str:
    """The cache key a schema 2 row stands for."""
    return fields([row["key_version"], row["scope"], row["operation_key"], fingerprint, row["workload"],
                   row["execution_context"], str(row["reference_index"]), row["manifest"], row["accuracy_key"]])


def resealed_row(row: dict[str, object], fingerprint: str = FP_A) -> dict[str, object]:
    """The row with a checksum and key hash recomputed from its columns (an edit a reader must still refuse)."""
    key = row_key(row, fingerprint)
    body = arc.record_body(key, row["created"], row["winner_index"], row["meta_json"], row["winner"], row["ratio"],
                           row["reference_index"], row["verified"])
    digest = hashlib.sha256(key.encode()).digest()
    return {**row, "checksum": hashlib.sha256(body.encode()).digest(),
            "key_hash": int.from_bytes(digest[:8], "big", signed=True)}


def v2_row(e: arc.ArchiveEntry, fingerprint: str) -> dict[str, object]:
    from farm.stores.archive.writer import decision_values

    return dict(zip(arc.DECISION_FIELDS, decision_values(e, fingerprint), strict=True))


def _edit_meta(folder: Path) -> None:
    def change(rows):
        rows[0]["meta_json"] = rows[0]["meta_json"].replace('"run":"run-1"', '"run":"run-2"')
        return rows
    edit_rows(folder, arc.DECISIONS_FILE, change)


def _set_column(column: str, value: object, reseal_row: bool = False):
    def corrupt(folder: Path) -> None:
        def change(rows):
            rows[0][column] = value
            if reseal_row:
                rows[0] = resealed_row(rows[0])
            return rows
        edit_rows(folder, arc.DECISIONS_FILE, change)
    return corrupt


def _duplicate_conflicting(folder: Path) -> None:
    def change(rows):
        other = arc.ArchiveEntry(make_record(key_for(FP_A, "n=2"), winner=2, created=5000.0), "p")
        return [*rows, v2_row(other, FP_A)]
    edit_rows(folder, arc.DECISIONS_FILE, change)


def _foreign_record(folder: Path) -> None:
    def change(rows):
        return [*rows, v2_row(arc.ArchiveEntry(make_record(key_for(FP_B, "n=9"))), FP_B)]
    edit_rows(folder, arc.DECISIONS_FILE, change)


def _orphan_trial(folder: Path) -> None:
    def change(rows):
        return [*rows, {**rows[0], "decision": 99}]
    edit_rows(folder, arc.TRIALS_FILE, change)


def _trials_out_of_order(folder: Path) -> None:
    edit_rows(folder, arc.TRIALS_FILE, lambda rows: rows[4:] + rows[:4])


def _negative_seconds(folder: Path) -> None:
    def change(rows):
        rows[0]["reference_seconds"] = -1.0
        return rows
    edit_rows(folder, arc.TRIALS_FILE, change)


def _wrong_type(folder: Path) -> None:
    table = pq.read_table(folder / arc.DECISIONS_FILE)
    i = table.schema.get_field_index("winner_index")
    table = table.set_column(i, pa.field("winner_index", pa.string(), nullable=False),
                             pa.array(["1"] * table.num_rows))
    pq.write_table(table, folder / arc.DECISIONS_FILE)
    reseal(folder)


CORRUPTIONS = {
    "truncated parquet": (_truncate, "decisions.parquet.*bytes.*truncated"),
    "truncated parquet with a resealed manifest": (_truncate_resealed, "trials.parquet: not a readable Parquet"),
    "unknown schema version": (lambda f: edit_manifest(f, lambda m: m.update(schema_version=3)),
                               "manifest.json: field 'schema_version' = 3: this farm reads archive schema versions "
                               "1 and 2 only"),
    "manifest sha256 mismatch": (_bad_sha, "decisions.parquet: sha256 .* 'sha256.decisions.parquet'"),
    "edited meta_json": (_edit_meta, "decisions.parquet: row 0 .*column 'checksum' = [0-9a-f]{12}… is not the "
                                     "sha256 of the record rebuilt"),
    "edited winner column": (_set_column("winner", "other"),
                             "row 0 .*column 'winner' = 'other' is not candidate 1 of the key \\('fast'\\)"),
    "edited created column": (_set_column("created", 1.5), "row 0 .*column 'checksum'"),
    "edited key_hash": (_set_column("key_hash", 7), "row 0 .*column 'key_hash' = 7 is not the sha256"),
    "edited workload (a key no longer sorted)": (_set_column("workload", "n=9", reseal_row=True),
                                                 "row 1 .*keys out of order"),
    "wrong fingerprint in the manifest": (lambda f: edit_manifest(f, lambda m: m.update(fingerprint=FP_B)),
                                          "field 'digest' .* is not the digest of field 'fingerprint'"),
    "a record of another fingerprint": (_foreign_record, "row 2 .*column 'key_hash' = -?[0-9]+ is not the sha256"),
    "duplicate keys with conflicting rows": (_duplicate_conflicting, "row 2 .*(duplicate key|keys out of order)"),
    "ratio <= 0": (_set_column("ratio", 0.0), "column 'ratio' = 0.0 is out of range"),
    "ratio NaN": (_set_column("ratio", math.nan), "column 'ratio' = nan is out of range"),
    "negative index": (_set_column("winner_index", -1), "column 'winner_index' = -1 is out of range"),
    "winner index past the candidates": (_set_column("winner_index", 7, reseal_row=True),
                                         "column 'winner_index' = 7 is out of range for the key's 3 candidates"),
    "another key version": (_set_column("key_version", "farm-stack-key-v0", reseal_row=True),
                            "column 'key_version' = 'farm-stack-key-v0': this farm reads farm-stack-key-v1 keys"),
    "a malformed candidate manifest": (_set_column("manifest", "3:abc", reseal_row=True),
                                       "column 'manifest' = '3:abc' is not a candidate manifest"),
    "meta_json not JSON, with a valid checksum": (_set_column("meta_json", '{"run":"x",}', reseal_row=True),
                                                  "row 0 .*column 'meta_json' is not JSON"),
    "meta_json not an object, with a valid checksum": (_set_column("meta_json", '[{"run":"x"}]', reseal_row=True),
                                                       "row 0 .*column 'meta_json' is a list, not an object"),
    "meta_json of two objects on one line": (_set_column("meta_json", '{"a":1}{"b":2}', reseal_row=True),
                                             "row 0 .*column 'meta_json' is not JSON: Extra data"),
    "negative trial seconds": (_negative_seconds, "trials.parquet: row 0: column 'reference_seconds'"),
    "orphan trial row": (_orphan_trial, "trials.parquet: row 8: column 'decision' = 99 names no row of "
                                        "decisions.parquet \\(2 rows\\)"),
    "trial rows out of order": (_trials_out_of_order, "trials.parquet: row 4: column 'decision' = 0: rows out of order"),
    "wrong column type": (_wrong_type, "column 'winner_index' is string not null, expected int32 not null"),
    "missing file": (lambda f: (f / arc.TRIALS_FILE).unlink(), "trials.parquet: missing"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_corrupt_archive_is_refused_with_nothing_imported_into_redis_or_a_cache_directory(case, store, redis_db,
                                                                                           tmp_path):
    corrupt, message = CORRUPTIONS[case]
    # Two archives in one directory: the good one must not be imported either.
    good = hand_archive(tmp_path / "in", FP_B, [entry(key_for(FP_B, "n=7"))])
    folder = hand_archive(tmp_path / "in", FP_A, [entry(key_for(FP_A, "n=1")), entry(key_for(FP_A, "n=2"))])
    assert good.parent == folder.parent
    corrupt(folder)
    publish_fleet(store)  # what Redis holds already must stay exactly as it is
    before = redis_state(redis_db)
    cache = tmp_path / "cache"
    LocalStore(cache, 100).put(make_record(key_for(FP_A, "n=5")))
    cache_before = cache_state(cache)
    with pytest.raises(arc.ArchiveError, match=message):
        ops.import_redis(ops.load_archives(tmp_path / "in"), store)
    with pytest.raises(arc.ArchiveError, match=message):
        ops.import_cache(ops.load_archives(tmp_path / "in"), cache, FP_A, force=True)
    assert redis_state(redis_db) == before
    assert cache_state(cache) == cache_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "in"]  # no staging folder left


def test_a_fingerprint_mismatch_is_refused_and_force_rekeys_to_the_target(store, redis_db, tmp_path):
    key = key_for(FP_A, "n=1")
    folder = hand_archive(tmp_path, FP_A, [entry(key)])
    archives = [arc.read_archive(folder)]
    with pytest.raises(arc.ArchiveError, match="fingerprint mismatch.*nothing imported"):
        ops.import_redis(archives, store, fingerprint=FP_B)
    assert redis_db.dbsize() == 0
    result = ops.import_redis(archives, store, fingerprint=FP_B, force=True)
    assert result[0].forced and result[0].target_digest == fingerprint_digest(FP_B)
    parts = split_fields(key)
    parts[3] = FP_B
    moved = store.get(fields(parts))
    assert moved is not None and moved.name == "fast"
    assert moved.meta["forced_from"] == fingerprint_digest(FP_A)
    assert moved.meta["fingerprint"] == fingerprint_digest(FP_B)
    assert store.get(key) is None
    assert store.fingerprints() == {fingerprint_digest(FP_B): FP_B}
    # The archive's own digest as the target is no mismatch.
    assert not ops.import_redis(archives, store, fingerprint=fingerprint_digest(FP_A))[0].forced


# -- merge and diff ---------------------------------------------------------------------------------------------


def test_merge_keeps_per_key_what_the_replacement_rule_keeps_with_its_trials(tmp_path):
    k1, k2, k3 = (key_for(FP_A, w) for w in ("n=1", "n=2", "n=3"))
    a = hand_archive(tmp_path / "a", FP_A, [entry(k1, verified=True, created=10.0, winner=1, run="a"),
                                            entry(k2, verified=False, created=30.0, winner=1, run="a")])
    b = hand_archive(tmp_path / "b", FP_A, [entry(k1, verified=False, created=99.0, winner=2, run="b"),
                                            entry(k2, verified=True, created=20.0, winner=2, run="b"),
                                            entry(k3, created=5.0, run="b")])
    c = hand_archive(tmp_path / "c", FP_A, [entry(k1, verified=True, created=50.0, winner=2, run="c")])
    result = ops.merge_archives([a, b, c], tmp_path / "m")
    assert result.written.decisions == 3 and result.replaced == 2
    merged = arc.read_archive(result.written.path).entries
    runs = {e.record.cache_key: (e.record.meta["run"], e.record.name, e.record.verified) for e in merged.values()}
    assert runs == {k1: ("c", "other", True), k2: ("b", "other", True), k3: ("b", "fast", True)}
    assert all(t["run"] == e.record.meta["run"] for e in merged.values() for t in e.trials)
    assert all(len(e.trials) == 4 for e in merged.values())
    other = hand_archive(tmp_path / "x", FP_B, [entry(key_for(FP_B, "n=1"))])
    with pytest.raises(arc.ArchiveError, match="different fingerprints"):
        ops.merge_archives([a, other], tmp_path / "m")


def test_diff_reports_new_dropped_and_changed_winners_with_ratios(tmp_path):
    k1, k2, k3, k4 = (key_for(FP_A, w) for w in ("n=1", "n=2", "n=3", "n=4"))
    a = hand_archive(tmp_path / "a", FP_A, [entry(k1, winner=1), entry(k2), entry(k3, ratio=0.5)])
    b = hand_archive(tmp_path / "b", FP_A, [entry(k1, winner=2, ratio=0.4), entry(k3, ratio=0.6), entry(k4)])
    report = ops.diff_archives(a, b).to_json()
    assert report["matched_by"] == "cache key"
    assert [r["workload"] for r in report["new"]] == [split_fields(k4)[4]]
    assert [r["workload"] for r in report["dropped"]] == [split_fields(k2)[4]]
    assert [(c["winner_a"], c["winner_b"], c["ratio_a"], c["ratio_b"]) for c in report["changed"]] == [
        ("fast", "other", 0.5, 0.4)]
    assert [(u["ratio_a"], u["ratio_b"]) for u in report["updated"]] == [(0.5, 0.6)]
    assert report["unchanged"] == 0
    # Different fingerprints: decisions are matched by the key without its environment.
    c = hand_archive(tmp_path / "c", FP_B, [entry(key_for(FP_B, "n=1"), winner=1)])
    across = ops.diff_archives(a, c).to_json()
    assert across["matched_by"] == "cache key without the environment"
    assert across["unchanged"] == 1 and len(across["dropped"]) == 2


# -- the CLI ----------------------------------------------------------------------------------------------------


def test_the_cli_exports_inspects_and_imports_an_archive(store, redis_db, redis_srv, tmp_path):
    records = publish_fleet(store)
    before = redis_state(redis_db)
    url = redis_srv.url(1)
    done = farm_cli("export", "--redis", url, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"exported 3 decisions (8 trial rows) of fingerprint {fingerprint_digest(FP_A)}" in done.stdout

    shown = farm_cli("inspect", str(tmp_path / "out"), "--json", "--operation", "scale", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert sorted(r["key_sha256"] for r in rows) == sorted(field_for(r.cache_key) for r in records)
    unknown = farm_cli("inspect", str(tmp_path / "out"), "--json", "--operation", "nope", cwd=tmp_path)
    assert unknown.returncode == 2 and "operations: scale" in unknown.stderr  # an error naming the known ones
    table = farm_cli("inspect", str(tmp_path / "out" / fingerprint_digest(FP_B)), cwd=tmp_path)
    assert table.returncode == 0 and "scale" in table.stdout and "fast" in table.stdout

    redis_db.flushdb()
    loaded = farm_cli("import", str(tmp_path / "out"), "--redis", url, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    assert "3 decisions (3 new, 0 replaced, 0 kept" in loaded.stdout
    after = redis_state(redis_db)
    assert {k: v for k, v in after.items() if k != "t:events"} == {
        k: v for k, v in before.items() if k != "t:events"}


def test_the_cli_refuses_a_corrupt_archive_with_exit_2_naming_the_file_and_field(redis_srv, redis_db, tmp_path):
    folder = hand_archive(tmp_path / "in", FP_A, [entry(key_for(FP_A, "n=1"))])
    edit_manifest(folder, lambda m: m.update(schema_version=7))
    done = farm_cli("import", str(tmp_path / "in"), "--redis", redis_srv.url(1), cwd=tmp_path)
    assert done.returncode == 2
    assert "manifest.json" in done.stderr and "'schema_version' = 7" in done.stderr
    assert "Traceback" not in done.stderr
    assert redis_db.dbsize() == 0
    bad = farm_cli("import", str(tmp_path / "in"), cwd=tmp_path)
    assert bad.returncode == 2 and "give exactly one of --redis or --into-cache" in bad.stderr


def test_the_cli_imports_into_a_cache_directory_only_with_force_when_the_fingerprint_differs(store, tmp_path):
    # A decision tuned on another machine class (its key names another fingerprint) for farmtest_scale.
    published = publish_runtime_decision(store, fingerprint=FP_A)
    folder = hand_archive(tmp_path / "in", FP_A, [arc.ArchiveEntry(published, "p-runtime")])
    cache = tmp_path / "cache"
    refused = farm_cli("import", str(folder), "--into-cache", str(cache), "--device", "cpu:0", cwd=tmp_path)
    assert refused.returncode == 2
    assert "fingerprint mismatch" in refused.stderr and "nothing imported" in refused.stderr
    assert not cache.exists()
    forced = farm_cli("import", str(folder), "--into-cache", str(cache), "--device", "cpu:0", "--force",
                      cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "fingerprint check overridden by --force" in forced.stderr

    from farm.adapter import RuntimeTrials, prepare

    op = scale_operation()
    client = farm.HostClient(0)
    inputs = op.build({"n": 64, "dtype": "float64"}, client)
    tuner = farm.StackTuner(POLICY, cache_directory=cache)
    prepared = prepare(tuner, op.name, "cpu", client, op.host, inputs)
    decision = tuner.select_request(prepared.request, RuntimeTrials(client, op.host, inputs, prepared.indices,
                                                                    POLICY.timing))
    assert (decision.source, decision.name) == (farm.DecisionSource.DISK_CACHE, "vectorized")
    assert tuner.stats().tunes == 0


def test_the_cli_merges_and_diffs_archives(tmp_path):
    k1, k2 = key_for(FP_A, "n=1"), key_for(FP_A, "n=2")
    a = hand_archive(tmp_path / "a", FP_A, [entry(k1, winner=1, created=1.0)])
    b = hand_archive(tmp_path / "b", FP_A, [entry(k1, winner=2, created=2.0), entry(k2)])
    merged = farm_cli("merge", str(tmp_path / "m"), str(a), str(b), cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    assert "2 decisions, 1 replaced" in merged.stdout
    diff = farm_cli("diff", str(a), str(tmp_path / "m"), "--json", cwd=tmp_path)
    assert diff.returncode == 0, diff.stderr
    report = json.loads(diff.stdout)
    assert len(report["new"]) == 1 and [c["winner_b"] for c in report["changed"]] == ["other"]
