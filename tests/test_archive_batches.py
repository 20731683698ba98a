"""Archives published in batches: records and trial rows rebuilt exactly, into Redis through the store's one
publication (``farm_publish``, a batch per call) leaving what one publication per call leaves, and all or nothing
into a local cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
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

import farm_archives
from farm.environment import fingerprint_digest
from farm.stores import archive as arc
from farm.stores.base import DecisionRecord, Publication, PublicationBatch, event_run
from farm.stores.local import LocalStore
from farm.stores.redis import RedisDecisions
from farm_archives import operations as ops
from farm_fleet.settings import Settings


@pytest.fixture
def store(redis_db):
    return RedisDecisions(client=redis_db, settings=Settings(prefix=PREFIX))


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
    folder = farm_archives.write_archive(tmp_path, FP_A, [arc.ArchiveEntry(r) for r in records]).path
    archive = farm_archives.read_archive(folder)
    by_key = dict(zip(archive.rows.keys, zip(archive.rows.texts, archive.rows.runs, strict=True), strict=True))
    for r in records:
        text, run = by_key[r.cache_key]
        assert text == r.to_json()
        assert run == event_run(r.meta.get("run")) == {"run-1": "run-1", 42: "42", None: ""}[r.meta.get("run")]
    assert farm_archives.read_archive(folder).rows.digests == [hashlib.sha256(k.encode()).digest() for k in archive.rows.keys]


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
    archive = farm_archives.read_archive(farm_archives.write_archive(tmp_path, FP_A, entries).path)
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
    archive = farm_archives.read_archive(farm_archives.write_archive(tmp_path, FP_A, entries).path)
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
    from farm_archives.checks import join_fields

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
    folder = farm_archives.write_archive(tmp_path, FP_A, entries).path

    def change(rows):
        rows[12]["key_hash"] += 1  # a later row: a wrong key hash
        rows[5]["ratio"] = rows[5]["ratio"] * 2  # an earlier row: a column that no longer matches its checksum
        rows[9]["winner"] = "nobody"
        return rows

    edit_rows(folder, arc.DECISIONS_FILE, change)
    with pytest.raises(arc.ArchiveError, match=r"row 5 \(key [0-9a-f]{12}\): column 'checksum'"):
        farm_archives.read_archive(folder)


def test_a_row_group_of_no_rows_is_read_as_nothing(tmp_path):
    entries = [entry(key_for(FP_A, f"n={i}")) for i in range(3)]
    folder = farm_archives.write_archive(tmp_path, FP_A, entries).path
    table = pq.read_table(folder / arc.DECISIONS_FILE)
    with pq.ParquetWriter(folder / arc.DECISIONS_FILE, table.schema) as writer:
        writer.write_table(table.slice(0, 0))  # an empty row group first (a hand-made file), then the rows
        writer.write_table(table)
    assert pq.ParquetFile(folder / arc.DECISIONS_FILE).num_row_groups == 2
    reseal(folder)
    archive = farm_archives.read_archive(folder)
    assert archive.rows.texts == [e.record.to_json() for e in sorted(entries, key=lambda e: e.record.cache_key)]


def test_a_meta_json_fault_is_reported_before_a_fault_in_a_later_batch(tmp_path):
    """meta_json is checked on a thread beside the rest: still, the fault earliest in the file is reported."""
    entries = [entry(key_for(FP_A, f"n={i}")) for i in range(2500)]  # the reader decodes 1,024 rows at a time
    folder = farm_archives.write_archive(tmp_path, FP_A, entries).path

    def change(rows):
        rows[3]["meta_json"] = "[1, 2]"
        rows[2100]["key_hash"] += 1
        return rows

    edit_rows(folder, arc.DECISIONS_FILE, change)
    with pytest.raises(arc.ArchiveError, match=r"row 3 \(key [0-9a-f]{12}\): column 'meta_json' is a list"):
        farm_archives.read_archive(folder)


# -- Redis: a batch leaves what one publication per call leaves ---------------------------------------------------


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
    got = RedisDecisions(client=batched, settings=settings).publish_batch(PublicationBatch.of(FP_A, pubs), size=4)
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
    got = RedisDecisions(client=batched, settings=settings).publish_batch(batch, size=5)
    assert got == expected
    assert {r for _, r in got} == {"new", "kept: the stored record is newer", "replaced: newer run",
                                   "kept: a verified record beats an unverified one",
                                   "replaced: verified beats unverified"}
    assert redis_state(batched) == redis_state(one)  # hashes, and every event's fields
    for key in (settings.decisions_key(digest), settings.trials_key(digest), settings.problems_key(digest)):
        assert batched.hgetall(key) == one.hgetall(key)  # the texts themselves (redis_state reads trial rows)
    assert any(ord(c) > 0xFFFF for text in one.hgetall(settings.trials_key(digest)).values() for c in text)


def test_a_key_published_twice_in_one_batch_ends_as_published_one_after_the_other(redis_srv):
    """Within one call the second publication of a key is judged against the first (kept or replacing it), and the
    trial rows and problem ids are the last winner's, as after one call per publication."""
    settings = Settings(prefix=PREFIX)
    one, batched = redis_srv.client(1), redis_srv.client(2)
    one.flushall()
    a, b = key_for(FP_A, "n=1"), key_for(FP_A, "n=2")
    first, newer, older = make_record(a, created=10.0), make_record(a, winner=2, created=20.0), make_record(b, created=5.0)
    pubs = [Publication(first, FP_A, "p1", tuple(make_trials(first))), Publication(newer, FP_A, "p2"),
            Publication(make_record(b, created=9.0), FP_A, "", tuple(make_trials(first))), Publication(older, FP_A, "p3")]
    expected = [RedisDecisions(client=one, settings=settings).publish_many([p])[0] for p in pubs]
    got = RedisDecisions(client=batched, settings=settings).publish_batch(PublicationBatch.of(FP_A, pubs))
    assert got == expected == [(True, "new"), (True, "replaced: newer run"), (True, "new"),
                               (False, "kept: the stored record is newer")]
    assert redis_state(batched) == redis_state(one)
    digest = fingerprint_digest(FP_A)
    for key in (settings.decisions_key(digest), settings.trials_key(digest), settings.problems_key(digest)):
        assert batched.hgetall(key) == one.hgetall(key)


def test_fenced_publications_in_one_batch_are_each_checked_and_consume_their_lease(store, redis_db):
    records = [make_record(key_for(FP_A, f"n={i}"), created=10.0) for i in range(3)]
    redis_db.set("lease:0", "t0")
    redis_db.set("lease:2", "t2")
    pubs = [Publication(records[0], FP_A, fence=("lease:0", "t0")), Publication(records[1], FP_A),
            Publication(records[2], FP_A, fence=("lease:2", "stale"))]
    got = store.publish_many(pubs)
    assert got == [(True, "new"), (True, "new"), (False, "refused: stale lease (held by t2)")]
    assert redis_db.get("lease:0") is None and redis_db.get("lease:2") == "t2"  # consumed; a refusal keeps it
    assert store.get(records[2].cache_key) is None and store.get(records[0].cache_key) == records[0]


def test_an_import_into_redis_publishes_problem_ids_trial_rows_and_fingerprints(store, redis_db, tmp_path):
    entries = [entry(key_for(FP_A, f"n={i}")) for i in range(5)] + [arc.ArchiveEntry(make_record(key_for(FP_A, "x")))]
    archive = farm_archives.read_archive(farm_archives.write_archive(tmp_path, FP_A, entries).path)
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
    archives = [farm_archives.read_archive(farm_archives.write_archive(tmp_path / "a", fp, [entry(key_for(fp, f"n={i}"))
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
    folder = farm_archives.write_archive(tmp_path, FP_A, [entry(key_for(FP_A, f"n={i}")) for i in range(3)]).path

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
    archive = farm_archives.read_archive(with_meta_json(tmp_path, 1, meta_json))
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
        farm_archives.read_archive(folder)
