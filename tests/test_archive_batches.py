"""Schema 2 archives published in batches: schema 1 still read, records and trial rows rebuilt exactly, the Redis
batch path under the same replacement rule as ``farm_publish`` (judged, WATCHed, retried, or one call per
decision), and all or nothing into a local cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import sqlite3
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from archive_helpers import (
    FP_A,
    FP_B,
    PREFIX,
    cache_state,
    edit_rows,
    entry,
    key_for,
    make_record,
    make_trials,
    redis_state,
    reseal,
    resealed_row,
)

from farm.environment import fingerprint_digest
from farm.stores import archive as arc
from farm.stores import redis_batch
from farm.stores.base import DecisionRecord, Publication, PublicationBatch, event_run
from farm.stores.local import LocalStore
from farm.stores.redis import RedisDecisions
from farm_coordinator import archive as ops
from farm_fleet.settings import Settings

V1 = Path(__file__).parent / "data" / "archive-v1" / fingerprint_digest(FP_A)


@pytest.fixture
def store(redis_db):
    return RedisDecisions(client=redis_db, settings=Settings(prefix=PREFIX))


def v1_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "in" / V1.name
    shutil.copytree(V1, folder)
    return folder


# -- schema 1: read only -----------------------------------------------------------------------------------------


def test_a_schema_1_archive_is_read_imported_served_and_rewritten_as_schema_2(store, redis_db, tmp_path):
    folder = v1_copy(tmp_path)
    stored = {r["key_sha256"]: r for r in pq.read_table(folder / arc.DECISIONS_FILE).to_pylist()}
    archive = arc.read_archive(folder)
    assert archive.manifest["schema_version"] == 1 and len(archive.entries) == 4 and archive.trial_rows == 12
    for sha, e in archive.entries.items():
        assert e.record.to_json() == e.text == stored[sha]["record_json"]
        assert e.problem_id == stored[sha]["problem_id"]
    newer = [e for e in archive.entries.values() if e.trials and "pid" in e.trials[0]]
    assert len(newer) == 1 and all(t["pid"] == 4242 for t in newer[0].trials)  # a newer farm's trial field

    (result,) = ops.import_redis([archive], store)
    assert (result.new, result.replaced, result.kept) == (4, 0, 0)
    cache = tmp_path / "cache"
    (result,) = ops.import_cache([archive], cache, FP_A)
    assert result.new == 4
    local = LocalStore(cache)
    served = arc.ArchiveStore(folder.parent)
    for e in archive.entries.values():
        key = e.record.cache_key
        assert store.get(key) == e.record == local.get(key) == served.get(key)
        assert store.trials(fingerprint_digest(FP_A), key) == list(e.trials) == local.trials(key)

    merged = ops.merge_archives([folder, folder], tmp_path / "v2")  # the way to rewrite it as schema 2
    again = arc.read_archive(merged.written.path)
    assert again.manifest["schema_version"] == 2 and again.entries == archive.entries
    assert all(again.entries[sha].text == e.text for sha, e in archive.entries.items())

    def change(rows):
        rows[0]["record_json"] = rows[0]["record_json"].replace('"run":"run-1"', '"run":"run-9"')
        return rows
    edit_rows(folder, arc.DECISIONS_FILE, change)
    with pytest.raises(arc.ArchiveError, match="decisions.parquet: row 0 .*column 'record_json': checksum mismatch"):
        arc.read_archive(folder)


# -- exact records and trial rows -------------------------------------------------------------------------------


def test_every_record_text_is_rebuilt_exactly_and_its_run_read_for_the_update_event(tmp_path):
    odd_workload = 'n="1" \\ größe\u2603 \x01'
    records = [
        make_record(key_for(FP_A, "n=1")),
        make_record(key_for(FP_A, odd_workload), note="größe \"quoted\" \\ \u2603 \x00", big=10**30, nan=math.nan,
                    inf=-math.inf, tiny=5e-324, nested={"b": [1, 2.5, {"c": None}], "a": True}),
        make_record(key_for(FP_A, "n=3"), run=42),  # not a string: the update event shows Lua's tostring
        make_record(key_for(FP_A, "n=4"), many=[[] for _ in range(600)], deep=json.loads("[" * 200 + "]" * 200)),
        make_record(key_for(FP_A, "n=5"), run=None, created=1e9 + 0.123456789, ratio=1 / 3),
        DecisionRecord(key_for(FP_A, "n=6"), 2, 0, "other", False, 2.0, 0.0, {}),
    ]
    folder = arc.write_archive(tmp_path, FP_A, [arc.ArchiveEntry(r) for r in records]).path
    archive = arc.read_archive(folder)
    by_key = dict(zip(archive.rows.keys, zip(archive.rows.texts, archive.rows.runs, strict=True), strict=True))
    for r in records:
        text, run = by_key[r.cache_key]
        assert text == r.to_json()
        assert run == event_run(r.meta.get("run")) == {"run-1": "run-1", 42: "42", None: ""}[r.meta.get("run")]
    assert arc.read_archive(folder).rows.digests == [hashlib.sha256(k.encode()).digest() for k in archive.rows.keys]


def test_trial_rows_come_back_as_the_same_values_through_the_json_an_import_writes(tmp_path):
    record = make_record(key_for(FP_A, "n=1"))
    base = make_trials(record, 1)[0]
    odd = [
        {**base, "note": 'a "quoted" \\ back\\slash', "host": "größe\u2603", "worker": "tab\there\x00"},
        {**base, "reference_seconds": 1.0, "candidate_seconds": 0.0, "max_abs_error": -0.0, "max_rel_error": 1e-7},
        {**base, "reference_seconds": 1e300, "candidate_seconds": 5e-324, "max_abs_error": 0.1 + 0.2,
         "max_rel_error": 123456789.125},
        {**base, "reference_seconds": math.inf, "candidate_seconds": math.nan, "pair": None, "attempt": 2**31 - 1},
        {k: v for k, v in base.items() if k not in ("note", "pair")},  # fields a row did not have come back null
        {**base, "pid": 4242, "nested": {"x": [1, "y"]}},  # a newer farm's fields
    ]
    plain = [{**base, "pair": i, "reference_seconds": 0.001 + i * 1e-6} for i in range(3)]
    entries = [arc.ArchiveEntry(record, "p1", tuple(odd))]
    for i in range(2, 4000):  # 10,000 rows: a decision spans two of the reader's batches of 8,192 rows
        r = make_record(key_for(FP_A, f"n={i}"))
        entries.append(arc.ArchiveEntry(r, None, tuple(plain) if i % 7 else ()))
    archive = arc.read_archive(arc.write_archive(tmp_path, FP_A, entries).path)
    assert archive.trial_rows > 8192
    texts = dict(zip(archive.rows.keys, archive.rows.trials, strict=True))

    def same(a: object, b: object) -> bool:
        if isinstance(a, float) and isinstance(b, float):
            return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) and type(a[k]) is type(b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return type(a) is type(b) and a == b

    for e in entries:
        text = texts[e.record.cache_key]
        if not e.trials:
            assert text == ""
            continue
        want = [{**dict.fromkeys(arc.TRIAL_FIELDS), **t} for t in e.trials]
        assert same(json.loads(text), want), (json.loads(text), want)


@pytest.mark.parametrize("value", [-0.0, 0.0, 1.0, 2.5e-300, math.nan, math.inf, None])
def test_a_trial_value_every_row_holds_is_written_as_json_writes_it(tmp_path, value):
    """A column that holds one value in every row is encoded once: -0.0 stays -0.0, a whole float stays a float,
    a non-finite one goes through json (as every row does), and so does a string json escapes."""
    records = [make_record(key_for(FP_A, f"n={i}")) for i in range(50)]
    entries = [arc.ArchiveEntry(r, None, tuple({**t, "max_abs_error": value, "host": "größe", "note": "same"}
                                               for t in make_trials(r, 3))) for r in records]
    archive = arc.read_archive(arc.write_archive(tmp_path, FP_A, entries).path)
    for text in archive.rows.trials:
        rows = json.loads(text)
        assert [r["host"] for r in rows] == ["größe"] * 4 and {r["note"] for r in rows} == {"same"}
        got = [r["max_abs_error"] for r in rows]
        if value is None or value != value:
            assert all(g is None for g in got) if value is None else all(g != g for g in got)
        else:
            assert all(type(g) is float and g == value and math.copysign(1, g) == math.copysign(1, value)
                       for g in got), got


def test_key_parts_that_hold_one_value_join_as_the_fields_encoding_does():
    import pyarrow as pa

    from farm.encoding import fields
    from farm.stores.archive.checks import join_fields

    one = pa.array(["größe \"q\""] * 3).dictionary_encode()
    two = pa.array(["a", "b", "a"]).dictionary_encode()
    plain = pa.array(["x:1", "", "z"])
    for parts in ([one, "s", one], [one, two, "s", plain], ["s", one], [plain, "t", "u", one]):
        rows = [fields([p if isinstance(p, str) else p[i].as_py() for p in parts]) for i in range(3)]
        assert join_fields(parts).to_pylist() == rows
        assert join_fields(parts, json_text=True).to_pylist() == [json.dumps(r)[1:-1] for r in rows]


def test_the_first_bad_row_of_a_batch_is_reported_whatever_its_fault(tmp_path):
    """Faults in several rows of one batch: the earliest row is named, with its own fault."""
    entries = [entry(key_for(FP_A, f"n={i}")) for i in range(20)]
    folder = arc.write_archive(tmp_path, FP_A, entries).path

    def change(rows):
        rows[12]["key_hash"] += 1  # a later row: a wrong key hash
        rows[5]["ratio"] = rows[5]["ratio"] * 2  # an earlier row: a column that no longer matches its checksum
        rows[9]["winner"] = "nobody"
        return rows

    edit_rows(folder, arc.DECISIONS_FILE, change)
    with pytest.raises(arc.ArchiveError, match=r"row 5 \(key [0-9a-f]{12}\): column 'checksum'"):
        arc.read_archive(folder)


def test_a_row_group_of_no_rows_is_read_as_nothing(tmp_path):
    entries = [entry(key_for(FP_A, f"n={i}")) for i in range(3)]
    folder = arc.write_archive(tmp_path, FP_A, entries).path
    table = pq.read_table(folder / arc.DECISIONS_FILE)
    with pq.ParquetWriter(folder / arc.DECISIONS_FILE, table.schema) as writer:
        writer.write_table(table.slice(0, 0))  # an empty row group first (a hand-made file), then the rows
        writer.write_table(table)
    assert pq.ParquetFile(folder / arc.DECISIONS_FILE).num_row_groups == 2
    reseal(folder)
    archive = arc.read_archive(folder)
    assert archive.rows.texts == [e.record.to_json() for e in sorted(entries, key=lambda e: e.record.cache_key)]


def test_a_meta_json_fault_is_reported_before_a_fault_in_a_later_batch(tmp_path):
    """meta_json is checked on a thread beside the rest: still, the fault earliest in the file is reported."""
    entries = [entry(key_for(FP_A, f"n={i}")) for i in range(2500)]  # the reader decodes 1,024 rows at a time
    folder = arc.write_archive(tmp_path, FP_A, entries).path

    def change(rows):
        rows[3]["meta_json"] = "[1, 2]"
        rows[2100]["key_hash"] += 1
        return rows

    edit_rows(folder, arc.DECISIONS_FILE, change)
    with pytest.raises(arc.ArchiveError, match=r"row 3 \(key [0-9a-f]{12}\): column 'meta_json' is a list"):
        arc.read_archive(folder)


# -- Redis: the batch path keeps farm_publish's rule --------------------------------------------------------------


def rule_cases() -> list[tuple[str, str | None, DecisionRecord]]:
    """(name, what Redis holds for the key, the record imported)."""
    cases: list[tuple[str, str | None, DecisionRecord]] = []
    for i, (old, new) in enumerate([
        (None, dict(verified=True, created=10.0)),
        (dict(verified=True, created=10.0), dict(verified=True, created=20.0)),
        (dict(verified=True, created=20.0), dict(verified=True, created=10.0)),
        (dict(verified=True, created=10.0), dict(verified=True, created=10.0)),
        (dict(verified=True, created=10.0), dict(verified=False, created=99.0)),
        (dict(verified=False, created=99.0), dict(verified=True, created=10.0)),
        (dict(verified=False, created=10.0), dict(verified=False, created=5.0)),
    ]):
        key = key_for(FP_A, f"n={i}")
        cases.append((f"case {i}", make_record(key, **old).to_json() if old else None, make_record(key, **new)))
    malformed = ["{not json", "[1]", json.dumps({"verified": "yes", "created": 1.0}),
                 json.dumps({"verified": True, "created": 4e9 * 10})]
    for j, raw in enumerate(malformed):
        cases.append((f"malformed {j}", raw, make_record(key_for(FP_A, f"m={j}"), verified=False, created=1.0)))
    return cases


def seed(client, settings: Settings, cases) -> None:
    digest = fingerprint_digest(FP_A)
    for _, raw, record in cases:
        if raw is not None:
            client.hset(settings.decisions_key(digest), arc.key_sha256(record.cache_key), raw)
            client.hset(settings.trials_key(digest), arc.key_sha256(record.cache_key), "[{\"old\": true}]")


def test_a_batch_import_judges_every_decision_as_farm_publish_does(redis_srv):
    settings = Settings(prefix=PREFIX)
    one, batched = redis_srv.client(1), redis_srv.client(2)
    one.flushall()
    cases = rule_cases()
    seed(one, settings, cases)
    seed(batched, settings, cases)
    pubs = [Publication(record, FP_A, f"pid-{i}" if i % 2 else "", tuple(make_trials(record)) if i % 3 else ())
            for i, (_, _, record) in enumerate(cases)]
    single = RedisDecisions(client=one, settings=settings)
    expected = [single.publish(p.record, p.fingerprint, p.problem_id, list(p.trials)) for p in pubs]
    got = redis_batch.publish_batch(RedisDecisions(client=batched, settings=settings),
                                    PublicationBatch.of(FP_A, pubs), size=4)
    assert got == expected
    assert {r for _, r in got} >= {"new", "kept: the stored record is newer", "replaced: newer run",
                                   "kept: a verified record beats an unverified one",
                                   "replaced: verified beats unverified", "replaced malformed record (unreadable JSON)",
                                   "replaced malformed record (created is in the future)"}
    assert redis_state(batched) == redis_state(one)  # hashes, and every event's fields


def test_a_batch_import_encodes_every_value_as_farm_publish_receives_it(redis_srv):
    """The column-wise encoding of a batch: multi-byte UTF-8 in texts, trial rows, names, runs and problem ids; no
    trial rows; no problem id (None or ""); verified and unverified; ``created`` whose repr needs 17 digits, the
    stored one a ulp away; new and kept decisions. Redis ends as it does after one farm_publish per decision."""
    settings = Settings(prefix=PREFIX)
    digest = fingerprint_digest(FP_A)
    one, batched = redis_srv.client(1), redis_srv.client(2)
    one.flushall()
    names = ("réf", "schnell\u2603", "其他")
    stamp = 1e9 + 0.123456789
    assert len(repr(stamp).replace(".", "")) == 17
    cases, pubs = [], []
    for i in range(24):
        key = key_for(FP_A, f"n={i} größe\u2603", names=names)
        stored = make_record(key, verified=i % 5 != 4, created=stamp, names=names) if i % 4 else None
        created = (math.nextafter(stamp, 0.0), stamp, math.nextafter(stamp, math.inf))[i % 3]
        record = make_record(key, winner=1 + i % 2, verified=i % 6 != 1, created=created, names=names,
                             run=f"läuft-{i}\U0001d11e", note='größe "\u2603" \\ \U0001d11e')
        cases.append((f"case {i}", stored.to_json() if stored else None, record))
        trials = tuple({**t, "note": "größe\u2603 \U0001d11e"} for t in make_trials(record)) if i % 3 else ()
        text = json.dumps(json.loads(record.to_json()), ensure_ascii=False, separators=(",", ":")) if i % 2 else None
        pubs.append(Publication(record, FP_A, ("", f"pid-ä{i}\u2603", "")[i % 3], trials, text=text,
                                trials_text=json.dumps(list(trials), ensure_ascii=False) if trials else None))
    seed(one, settings, cases)
    seed(batched, settings, cases)
    expected = RedisDecisions(client=one, settings=settings).publish_many(pubs)
    batch = PublicationBatch.of(FP_A, pubs)
    batch = dataclasses.replace(batch, problem_ids=[p if p or i % 2 else None for i, p in enumerate(batch.problem_ids)])
    got = redis_batch.publish_batch(RedisDecisions(client=batched, settings=settings), batch, size=5)
    assert got == expected
    assert {r for _, r in got} == {"new", "kept: the stored record is newer", "replaced: newer run",
                                   "kept: a verified record beats an unverified one",
                                   "replaced: verified beats unverified"}
    assert redis_state(batched) == redis_state(one)  # hashes, and every event's fields
    for key in (settings.decisions_key(digest), settings.trials_key(digest), settings.problems_key(digest)):
        assert batched.hgetall(key) == one.hgetall(key)  # the texts themselves (redis_state reads trial rows)
    assert any(ord(c) > 0xFFFF for text in one.hgetall(settings.trials_key(digest)).values() for c in text)


@pytest.mark.parametrize("size", [1000, 1])
def test_a_batch_judged_before_another_publication_is_judged_again(store, redis_db, monkeypatch, size):
    records = [make_record(key_for(FP_A, f"n={i}"), created=10.0) for i in range(3)]
    newer = make_record(records[1].cache_key, winner=2, created=50.0)
    other = RedisDecisions(client=redis_db, settings=store.settings)
    judge = redis_batch._read_judge
    calls = []

    def racing(conn, part):  # the coordinator publishes between WATCH and EXEC
        reasons = judge(conn, part)
        if not calls:
            other.publish(newer, FP_A)
        calls.append(reasons)
        return reasons

    monkeypatch.setattr(redis_batch, "_read_judge", racing)
    got = redis_batch.publish_batch(store, PublicationBatch.of(FP_A, [Publication(r, FP_A) for r in records]),
                                    size=size)
    parts = 3 if size == 1 else 1
    assert len(calls) > parts  # the first transaction was cancelled, its part judged again
    assert got == [(True, "new"), (False, "kept: the stored record is newer"), (True, "new")]
    assert store.get(records[1].cache_key) == newer and store.get(records[0].cache_key) == records[0]
    assert len(redis_db.xrange(f"{PREFIX}:events")) == 3  # the racing publication and two of the batch


def test_a_batch_that_keeps_losing_its_watch_is_published_one_call_at_a_time(store, redis_db, monkeypatch):
    monkeypatch.setattr(redis_batch, "RETRIES", 0)
    pubs = [Publication(r, FP_A, "p", tuple(make_trials(r))) for r in
            (make_record(key_for(FP_A, f"n={i}")) for i in range(3))]
    got = redis_batch.publish_batch(store, PublicationBatch.of(FP_A, pubs))
    assert got == [(True, "new")] * 3
    assert all(store.get(p.record.cache_key) == p.record for p in pubs)
    assert store.trials(fingerprint_digest(FP_A), pubs[0].record.cache_key) == list(pubs[0].trials)


def test_an_import_into_redis_publishes_problem_ids_trial_rows_and_fingerprints(store, redis_db, tmp_path):
    entries = [entry(key_for(FP_A, f"n={i}")) for i in range(5)] + [arc.ArchiveEntry(make_record(key_for(FP_A, "x")))]
    archive = arc.read_archive(arc.write_archive(tmp_path, FP_A, entries).path)
    (result,) = ops.import_redis([archive], store)
    assert result.new == 6
    digest = fingerprint_digest(FP_A)
    assert store.fingerprints() == {digest: FP_A}
    for e in entries:
        assert store.trials(digest, e.record.cache_key) == list(e.trials)
        if e.problem_id:
            assert store.problem_records(digest, [e.problem_id]) == {e.problem_id: e.record}
    (again,) = ops.import_redis([archive], store)  # idempotent: a tie goes to the newcomer, as farm_publish does
    assert (again.new, again.replaced, again.kept) == (0, 6, 0)


# -- the local cache: all or nothing ----------------------------------------------------------------------------


class _FailingTrials:
    """A connection whose trial-row insert fails (after the decisions were inserted in the same transaction)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, *args):  # type: ignore[no-untyped-def]
        if sql.startswith("INSERT OR REPLACE INTO trials"):
            raise sqlite3.OperationalError("disk I/O error (injected)")
        return self.conn.execute(sql, *args)

    def executemany(self, sql: str, rows):  # type: ignore[no-untyped-def]
        if sql.startswith("INSERT OR REPLACE INTO trials"):
            raise sqlite3.OperationalError("disk I/O error (injected)")
        return self.conn.executemany(sql, rows)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.conn, name)


def test_an_import_into_a_cache_that_fails_midway_leaves_the_cache_as_it_was(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    LocalStore(cache, 100).put(make_record(key_for(FP_A, "n=1"), verified=False, created=1.0))
    before = cache_state(cache)
    archives = [arc.read_archive(arc.write_archive(tmp_path / "a", fp, [entry(key_for(fp, f"n={i}"))
                                                                       for i in range(3)]).path)
                for fp in (FP_A, FP_B)]
    connect = LocalStore._connect
    monkeypatch.setattr(LocalStore, "_connect", lambda self, create: _FailingTrials(connect(self, create)))
    with pytest.raises(OSError, match="injected"):
        ops.import_cache(archives, cache, FP_A, force=True)
    monkeypatch.undo()
    assert cache_state(cache) == before
    results = ops.import_cache(archives, cache, FP_A, force=True)
    assert [(r.new, r.replaced) for r in results] == [(2, 1), (0, 3)]  # FP_B's re-keyed decisions: the same keys


def with_meta_json(tmp_path: Path, row: int, meta_json: str) -> Path:
    """An archive of 3 decisions whose row ``row`` holds ``meta_json``, with its checksum recomputed."""
    folder = arc.write_archive(tmp_path, FP_A, [entry(key_for(FP_A, f"n={i}")) for i in range(3)]).path

    def change(rows):
        rows[row]["meta_json"] = meta_json
        rows[row] = resealed_row(rows[row])
        return rows

    edit_rows(folder, arc.DECISIONS_FILE, change)
    return folder


@pytest.mark.parametrize(("meta_json", "run"), [
    ('{"run":"r1","note":"plain"}', "r1"),
    ('{"run":\t"r2",\n"x": [1,\r\n2]}', "r2"),  # whitespace JSON allows: not one line, so json.loads decides
    ('{"x":' + "[" * 600 + "]" * 600 + ',"run":"r3"}', "r3"),  # more brackets than the fast path takes
    ('{"run":7}', "7"),
    ('{}', ""),
])
def test_every_meta_json_json_accepts_is_imported_with_its_run(tmp_path, meta_json, run):
    archive = arc.read_archive(with_meta_json(tmp_path, 1, meta_json))
    assert archive.rows.runs[1] == run == event_run(json.loads(meta_json).get("run"))
    assert json.loads(archive.rows.texts[1])["meta"] == json.loads(meta_json)


@pytest.mark.parametrize(("meta_json", "says"), [
    ('{"run":"a\tb"}', "is not JSON: Invalid control character"),  # a raw tab inside a string
    ('{"run":"x"}\n{"run":"y"}', "is not JSON: Extra data"),  # two objects on two lines
    ("", "is not JSON"),
])
def test_a_meta_json_json_refuses_is_refused_naming_its_row(tmp_path, meta_json, says):
    folder = with_meta_json(tmp_path, 2, meta_json)
    with pytest.raises(arc.ArchiveError, match=rf"row 2 \(key [0-9a-f]{{12}}\): column 'meta_json' {says}"):
        arc.read_archive(folder)
