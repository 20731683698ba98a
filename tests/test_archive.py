"""Parquet archives: the format, and Redis -> archive -> a fresh Redis or cache directory."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from archive_helpers import (
    FP_A,
    FP_B,
    POLICY,
    PREFIX,
    edit_rows,
    entry,
    hand_archive,
    key_for,
    make_record,
    publish_fleet,
    redis_state,
    store_fixture,  # noqa: F401  (the store fixture)
    tree,
)

import farm_archives
from farm.environment import fingerprint_digest
from farm.stores import archive as arc
from farm.stores.local import FARM, LocalStore
from farm.stores.redis import RedisDecisions, field_for
from farm_archives import operations as ops
from farm_coordinator.aggregate import TRIAL_FIELDS
from farm_fleet.settings import Settings

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
    (read,) = farm_archives.read_archive(folder).entries.values()
    assert read == e and read.text == text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left behind


def test_trial_fields_a_newer_farm_adds_survive_and_a_repeated_key_is_refused(tmp_path):
    e = entry(key_for(FP_A, "n=1"))
    rows = tuple({**t, "pid": 4242, "key_sha256": e.key_sha256} for t in e.trials)
    folder = hand_archive(tmp_path, FP_A, [arc.ArchiveEntry(e.record, e.problem_id, rows)])
    (read,) = farm_archives.read_archive(folder).entries.values()
    assert read.trials == tuple({k: v for k, v in t.items() if k != "key_sha256"} for t in rows)
    edit_rows(folder, arc.DECISIONS_FILE, lambda decisions: decisions + decisions)
    with pytest.raises(arc.ArchiveError, match="row 1 .*duplicate key: refused"):
        farm_archives.read_archive(folder)


def test_rewriting_an_archive_replaces_it_whole_and_a_refused_write_leaves_the_old_one(tmp_path):
    first = hand_archive(tmp_path, FP_A, [entry(key_for(FP_A, "n=1"))])
    hand_archive(tmp_path, FP_A, [entry(key_for(FP_A, "n=2")), entry(key_for(FP_A, "n=3"))])
    assert len(farm_archives.read_archive(first).entries) == 2
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
    sink = LocalStore(cache, owner=FARM)  # the embedded farm's sink
    pids = [str(r.meta["problem_id"]) for r in records[:3]]
    assert sink.decided(fingerprint_digest(FP_A), pids) == set(pids[:2])  # the third was published without one
    # ... and the cache directory exports back to the same decisions.
    again = ops.export_cache(cache, tmp_path / "again")
    assert sorted(e.record.to_json() for e in farm_archives.read_archive(again[0].written.path).entries.values()) == sorted(
        r.to_json() for r in records[:3])


def test_importing_into_a_cache_directory_applies_the_replacement_rule_to_what_is_there(tmp_path):
    key = key_for(FP_A, "n=1")
    cache = tmp_path / "cache"
    LocalStore(cache, 100).put(make_record(key, verified=True, created=50.0, winner=2))
    folder = hand_archive(tmp_path / "a", FP_A, [entry(key, verified=False, created=99.0),
                                                  entry(key_for(FP_A, "n=2"))])
    result = ops.import_cache([farm_archives.read_archive(folder)], cache, FP_A)
    assert (result[0].new, result[0].replaced, result[0].kept) == (1, 0, 1)
    assert LocalStore(cache, 100).get(key).name == "other"
