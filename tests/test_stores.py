"""Decision stores (memory and disk), and the controller's disk tier: reuse after one validation, corruption is a
miss with a warning, capacity pruning, and several processes sharing one directory."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import FAST, FakeRunner, candidates, problem

from farm.decisions import SCHEMA_VERSION, DecisionRecord, _checksum, key_hash
from farm.engine import DecisionSource, StackTuner, Validation
from farm.environment import fingerprint_digest
from farm.errors import CorruptRecord, FailureKind, TuneFailure
from farm.policy import MemoryEviction, Mode
from farm.stores import local as local_module
from farm.stores.base import Publication
from farm.stores.local import APP, FARM, STORE_FILE, LocalStore
from farm.stores.memory import MemoryStore

ROOT = Path(__file__).resolve().parent.parent
PERSISTENT = problem(persistent=True)
C = candidates("ref", "a", "b")


def record(key: str = "k", **changes: Any) -> DecisionRecord:
    fields: dict[str, Any] = {
        "cache_key": key, "index": 1, "reference_index": 0, "name": "a", "verified": True, "ratio": 0.5,
        "created": time.time(),
    }
    fields.update(changes)
    return DecisionRecord(**fields)


# -- the memory tier (the contract every store holds: tests/test_store_contract.py) ---------------------------------


@pytest.mark.parametrize(("eviction", "kept"), [(MemoryEviction.FIFO, ["b", "c"]), (MemoryEviction.LRU, ["a", "c"])])
def test_the_memory_store_evicts_by_its_policy_and_says_what_it_evicted(eviction: MemoryEviction, kept: list[str]) -> None:
    memory = MemoryStore(2, eviction)
    memory.put(record("a"))
    memory.put(record("b"))
    memory.get("a")
    evicted = memory.put(record("c"))
    assert sorted(memory.keys()) == kept
    assert evicted == [k for k in ("a", "b") if k not in kept]


# -- records -------------------------------------------------------------------------------------------------


def test_a_record_round_trips_through_its_dict_with_schema_and_checksum() -> None:
    r = record()
    data = r.to_dict()
    assert data["schema"] == SCHEMA_VERSION and len(data["checksum"]) == 64
    assert DecisionRecord.from_dict(json.loads(json.dumps(data)), expected_key="k") == r


def with_checksum(data: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in data.items() if k != "checksum"}
    return {**body, "checksum": _checksum(body)}


def retyped(**changes: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda d: with_checksum({**d, **changes})


BAD_RECORDS: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("not an object", lambda d: [d], "not an object"),
    ("missing schema", lambda d: {k: v for k, v in d.items() if k != "schema"}, "schema version"),
    ("other schema version", retyped(schema=SCHEMA_VERSION + 1), "schema version"),
    ("tampered value", lambda d: {**d, "ratio": 0.01}, "checksum"),
    ("missing checksum", lambda d: {k: v for k, v in d.items() if k != "checksum"}, "checksum"),
    ("missing field", lambda d: with_checksum({k: v for k, v in d.items() if k != "name"}), "name"),
    ("index is a bool", retyped(index=True), "index"),
    ("index is text", retyped(index="1"), "index"),
    ("negative index", retyped(index=-1), "out-of-range"),
    ("zero ratio", retyped(ratio=0.0), "out-of-range"),
    ("verified is a number", retyped(verified=1), "verified"),
    ("another key", retyped(cache_key="other"), "differs"),
]


@pytest.mark.parametrize(("case", "mutate", "says"), BAD_RECORDS, ids=[b[0] for b in BAD_RECORDS])
def test_an_untrustworthy_record_is_corrupt_and_says_why(case: str, mutate: Callable[[dict[str, Any]], Any], says: str) -> None:
    with pytest.raises(CorruptRecord) as info:
        DecisionRecord.from_dict(mutate(record().to_dict()), expected_key="k")
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("created", "now", "fresh"),
    [(100.0, 100.0, True), (100.0, 160.0, True), (100.0, 160.5, False), (100.0, 99.0, False)],
)
def test_a_record_is_fresh_within_its_ttl_and_never_when_future_dated(created: float, now: float, fresh: bool) -> None:
    assert record(created=created).is_fresh(now, 60.0) is fresh


# -- the local store (one SQLite file) --------------------------------------------------------------------------


def stored_text(directory: Path, key: str) -> str:
    with contextlib.closing(sqlite3.connect(directory / STORE_FILE)) as db:
        (text,) = db.execute("SELECT record FROM decisions WHERE key = ?", (key_hash(key),)).fetchone()
    return str(text)


def damage_row(directory: Path, key: str, damage: Callable[[str], str | bytes]) -> None:
    """Replace the stored text of ``key`` by ``damage(text)``, as a crashed or hostile writer could."""
    text = damage(stored_text(directory, key))
    with contextlib.closing(sqlite3.connect(directory / STORE_FILE)) as db, db:
        db.execute("UPDATE decisions SET record = ? WHERE key = ?", (text, key_hash(key)))


def test_the_local_store_keeps_one_file_with_the_full_key(tmp_path: Path) -> None:
    local = LocalStore(tmp_path, 8)
    local.put(record("a full key"))
    assert json.loads(stored_text(tmp_path, "a full key"))["cache_key"] == "a full key"
    assert {p.name for p in tmp_path.iterdir()} <= {STORE_FILE, f"{STORE_FILE}-wal", f"{STORE_FILE}-shm"}


def rewritten(**changes: Any) -> Callable[[str], str]:
    return lambda text: json.dumps(retyped(**changes)(json.loads(text)))


ROW_DAMAGE: list[tuple[str, Callable[[str], str | bytes]]] = [
    ("corrupt JSON", lambda t: "{not json"),
    ("truncated text", lambda t: t[: len(t) // 2]),
    ("empty text", lambda t: ""),
    ("not UTF-8", lambda t: b"\xff\xfe\x00\x81"),
    ("bad checksum", lambda t: json.dumps({**json.loads(t), "ratio": 0.125})),
    ("wrong schema version", rewritten(schema=99)),
    ("mismatched stored key", rewritten(cache_key="another")),
]


@pytest.mark.parametrize(("case", "damage"), ROW_DAMAGE, ids=[d[0] for d in ROW_DAMAGE])
def test_the_local_store_reports_a_damaged_record_as_corrupt(case: str, damage: Callable[[str], Any], tmp_path: Path) -> None:
    local = LocalStore(tmp_path, 8)
    local.put(record("k"))
    damage_row(tmp_path, "k", damage)
    with pytest.raises(CorruptRecord):
        local.get("k")


def test_the_local_store_prunes_its_oldest_writes_beyond_capacity(tmp_path: Path) -> None:
    local = LocalStore(tmp_path, 3)
    for n in range(5):
        local.put(record(f"k{n}"))
    local.put(record("k2", name="again"))  # a rewrite counts as the newest write
    assert [local.get(f"k{n}") is not None for n in range(5)] == [False, False, True, True, True]
    assert len(local) == 3
    LocalStore(tmp_path, 3).put(record("k5"))
    assert [local.get(f"k{n}") is not None for n in range(6)] == [False, False, True, False, True, True]


def test_the_local_store_drops_its_expired_records_but_never_a_future_dated_one(tmp_path: Path) -> None:
    local = LocalStore(tmp_path, 8, ttl=60.0)
    local.put(record("old", created=time.time() - 3600))
    local.put(record("future", created=time.time() + 3600))
    local.put(record("new"))
    assert [local.get(k) is not None for k in ("old", "future", "new")] == [False, True, True]


def test_an_application_with_capacity_3_keeps_every_record_the_farm_published(tmp_path: Path) -> None:
    farm_side = LocalStore(tmp_path, owner=FARM)
    farm_keys = [f"farm-{n}" for n in range(20)]
    for n, key in enumerate(farm_keys):
        assert farm_side.publish(record(key, created=time.time() - 30 * 86400), "fp", f"pid-{n}") == (True, "new")
    app = LocalStore(tmp_path, 3, ttl=60.0)
    for n in range(6):
        app.put(record(f"app-{n}"))
    assert all(app.get(k) is not None for k in farm_keys)  # expired for the application, yet kept
    assert [app.get(f"app-{n}") is not None for n in range(6)] == [False, False, False, True, True, True]
    assert (app.count(FARM), app.count(APP)) == (20, 3)
    assert farm_side.decided(fingerprint_digest("fp"), [f"pid-{n}" for n in range(25)]) == {f"pid-{n}" for n in range(20)}


def test_one_batch_of_publications_stores_what_one_by_one_would(tmp_path: Path) -> None:
    """Two problems may share a cache key (workloads differing only in their seed): a batch indexes both, and the
    key holds the last record the replacement rule accepted, as publishing them in turn does."""
    now = time.time()
    batch = [Publication(record("k", created=now - 10), "fp", "pid-a", ({"pair": 0},)),
             Publication(record("k", name="newer", index=2, created=now), "fp", "pid-b", ({"pair": 1},)),
             Publication(record("k", name="older", created=now - 20), "fp", "pid-c"),
             Publication(record("other", created=now), "fp", "pid-d")]
    one_by_one = LocalStore(tmp_path / "one", owner=FARM)
    in_turn = [one_by_one.publish_many([pub])[0] for pub in batch]
    together = LocalStore(tmp_path / "batch", owner=FARM)
    assert together.publish_many(batch) == in_turn == [(True, "new"), (True, "replaced"),
                                                      (False, "kept: the stored record wins under the replacement rule"),
                                                      (True, "new")]
    pids = ["pid-a", "pid-b", "pid-c", "pid-d"]
    for store in (one_by_one, together):
        assert store.decided(fingerprint_digest("fp"), pids) == {"pid-a", "pid-b", "pid-d"}
        assert (store.get("k").name, store.trials("k"), len(store)) == ("newer", [{"pair": 1}], 2)


def _rows_by_owner(directory: Path) -> dict[int, int]:
    with contextlib.closing(sqlite3.connect(directory / STORE_FILE)) as conn:
        return dict(conn.execute("SELECT owner, count(*) FROM decisions GROUP BY owner").fetchall())


def test_the_counts_follow_every_write_of_both_owners(tmp_path: Path) -> None:
    """After publications (new, replaced, kept, a key twice in one batch, in many-row statements), farm puts,
    application puts, pruning and deletes, the counts are the rows each owner holds."""
    now = time.time()
    farm_side = LocalStore(tmp_path, owner=FARM)
    farm_side.publish_many([Publication(record(f"f{n}", created=now - n), "fp", f"pid-{n}") for n in range(10)])
    farm_side.publish_many([Publication(record("f1", created=now + 1), "fp", "pid-1"),  # replaced
                            Publication(record("f2", created=now - 100), "fp", "pid-2"),  # kept
                            Publication(record("g", created=now - 5), "fp", "pid-g"),  # new, then replaced
                            Publication(record("g", created=now), "fp", "pid-g")])
    farm_side.put(record("f3", created=now + 2))  # a farm put replaces a farm row
    farm_side.put(record("h"))
    app = LocalStore(tmp_path, 3)
    for n in range(5):
        app.put(record(f"a{n}"))
    app.put(record("f4"))  # an application's write over a farm row: the row becomes the application's
    app.delete("a4")
    farm_side.delete("f5")
    assert _rows_by_owner(tmp_path) == {FARM: 10, APP: 2}  # capacity 3, then a delete
    assert (app.count(FARM), app.count(APP), len(app)) == (10, 2, 12)


def test_a_store_schema_this_farm_does_not_know_is_refused_naming_the_file(tmp_path: Path) -> None:
    LocalStore(tmp_path).put(record("k"))
    with contextlib.closing(sqlite3.connect(tmp_path / STORE_FILE, isolation_level=None)) as conn:
        conn.execute("PRAGMA user_version = 7")
    with pytest.raises(CorruptRecord, match=r"farm-cache\.sqlite3: store schema version 7; this farm reads 1"):
        LocalStore(tmp_path).get("k")


def test_the_farm_moves_its_write_ahead_log_into_the_file_on_a_thread_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_module, "FARM_CHECKPOINT_BYTES", 1)  # ask after every publication
    farm_side = LocalStore(tmp_path, owner=FARM)
    farm_side.publish_many([Publication(record(f"k{n}"), "fp", f"pid-{n}") for n in range(50)])
    file_only = f"file:{tmp_path / STORE_FILE}?immutable=1"  # what the file holds, without the log
    deadline = time.monotonic() + 60
    while True:
        with contextlib.closing(sqlite3.connect(file_only, uri=True)) as view, contextlib.suppress(sqlite3.Error):
            if view.execute("SELECT count(*) FROM decisions").fetchone()[0] == 50:  # no table yet: not yet
                break
        assert time.monotonic() < deadline, "the checkpoint never ran"
        time.sleep(0.05)
    farm_side.close()  # waits for the checkpoints under way: no thread is left behind
    assert farm_side._checkpoints._thread is None and LocalStore(tmp_path).get("k7") is not None


def test_a_failed_write_keeps_the_old_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = LocalStore(tmp_path, 8)
    local.put(record("k", name="old"))
    real = local_module.replace_row

    def half_then_fail(conn: Any, *args: Any) -> None:
        real(conn, *args)
        raise OSError("disk full")

    monkeypatch.setattr(local_module, "replace_row", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        local.put(record("k", name="new", index=2))
    monkeypatch.undo()
    assert local.get("k").name == "old"
    assert len(local) == 1


def test_the_local_store_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        LocalStore(tmp_path / "a" / "cache", 8).put(record("k"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "cache").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "a" / "cache" / STORE_FILE).stat().st_mode) == 0o644


def test_a_reader_that_may_not_write_the_cache_reads_a_view_that_follows_the_writers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = LocalStore(tmp_path, 8)
    writer.put(record("k", name="first"))
    writer.close()  # the last connection closes: SQLite removes the WAL files another user would need

    def read_only(self: LocalStore) -> Any:
        raise sqlite3.OperationalError("attempt to write a readonly database")  # as for another user, 0755

    monkeypatch.setattr(LocalStore, "_open", read_only)
    reader = LocalStore(tmp_path, 8)
    assert reader.get("k").name == "first"
    monkeypatch.undo()
    writer.put(record("k", name="second", index=2))
    writer.put(record("other"))
    writer.close()
    monkeypatch.setattr(LocalStore, "_open", read_only)
    assert reader.get("k").name == "second" and reader.get("other") is not None
    with pytest.raises(OSError):
        reader.put(record("mine"))


WRITER = """
import sys, time
from pathlib import Path
from farm.stores.base import CorruptRecord, DecisionRecord
from farm.stores.local import LocalStore

directory, who, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
deadline = time.monotonic() + 30
while not go.exists():
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.001)
store = LocalStore(directory, 12)
for i in range(80):
    key = f"key-{i % 20}"
    store.put(DecisionRecord(key, i % 3, 0, f"{who}-{i}", True, 0.5, time.time()))
    try:
        store.get(f"key-{(i * 7) % 20}")
    except CorruptRecord as e:
        print("reader saw a corrupt record:", e)
        sys.exit(4)
"""


def test_two_processes_writing_one_cache_at_once_leave_only_valid_records(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(directory), who, str(go)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for who in ("left", "right")
    ]
    go.touch()
    outputs = [w.communicate(timeout=120)[0] for w in writers]
    assert [w.returncode for w in writers] == [0, 0], outputs
    local = LocalStore(directory, 12)
    found = [local.get(f"key-{n}") for n in range(20)]
    assert len(local) == 12 == sum(r is not None for r in found)
    assert all(r.name.split("-")[0] in ("left", "right") for r in found if r is not None)


# -- the controller's disk tier --------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "decisions"


def tuned(cache: Path, **policy: Any) -> tuple[StackTuner, str]:
    """Tune PERSISTENT (a wins) with a controller on ``cache``; return it and the key."""
    tuner = StackTuner(FAST.replace(**policy), cache_directory=cache)
    decision = tuner.select(PERSISTENT, C, 0, FakeRunner({1: 0.5, 2: 0.8}))
    assert decision.name == "a"
    return tuner, decision.cache_key


def test_a_persistent_problem_writes_its_record_to_disk(cache: Path) -> None:
    _, key = tuned(cache)
    stored = LocalStore(cache).get(key)
    assert stored is not None
    assert (stored.index, stored.reference_index, stored.name, stored.verified, stored.ratio) == (1, 0, "a", True, 0.5)


def test_a_problem_that_is_not_persistent_writes_nothing(cache: Path) -> None:
    tuner = StackTuner(FAST, cache_directory=cache)
    tuner.select(problem(persistent=False), C, 0, FakeRunner({1: 0.5}))
    assert not cache.exists() or list(cache.iterdir()) == []


def test_a_fresh_controller_reuses_a_disk_record_after_one_validation_then_hits_memory(cache: Path) -> None:
    _, key = tuned(cache)
    fresh = StackTuner(FAST, cache_directory=cache)
    runner = FakeRunner()
    decision = fresh.select(PERSISTENT, C, 0, runner)
    assert (decision.index, decision.source, decision.ratio, decision.cache_key) == (1, DecisionSource.DISK_CACHE, 0.5, key)
    assert runner.calls == [("validate", 0, 1)]
    again = FakeRunner()
    assert fresh.select(PERSISTENT, C, 0, again).source is DecisionSource.MEMORY_CACHE
    assert again.calls == []
    assert (fresh.stats().disk_hits, fresh.stats().memory_hits, fresh.stats().tunes) == (1, 1, 0)


def test_a_stored_reference_decision_is_reused_without_any_trial(cache: Path) -> None:
    StackTuner(FAST, cache_directory=cache).select(PERSISTENT, C, 0, FakeRunner({1: 2.0, 2: 2.0}))
    runner = FakeRunner()
    decision = StackTuner(FAST, cache_directory=cache).select(PERSISTENT, C, 0, runner)
    assert (decision.index, decision.source) == (0, DecisionSource.DISK_CACHE)
    assert runner.calls == []


def test_an_explore_cache_serves_a_cache_only_controller(cache: Path) -> None:
    tuned(cache)
    offline = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=cache)
    decision = offline.select(PERSISTENT, C, 0, FakeRunner())
    assert (decision.name, decision.source) == ("a", DecisionSource.DISK_CACHE)


@pytest.mark.parametrize(
    "failure",
    [TuneFailure.rejected("wrong output: values differ"), ValueError("readback crashed"), Validation.UNSUPPORTED],
    ids=["wrong output", "crash", "unsupported"],
)
def test_a_failed_validation_deletes_the_disk_record(cache: Path, failure: Any) -> None:
    _, key = tuned(cache)
    offline = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=cache)
    decision = offline.select(PERSISTENT, C, 0, FakeRunner(verdicts={1: failure}))
    assert (decision.index, decision.source) == (0, DecisionSource.CACHE_MISS)
    assert LocalStore(cache).get(key) is None
    assert offline.stats().cache_warnings == 1


def test_a_failed_validation_falls_through_to_a_new_search(cache: Path) -> None:
    tuned(cache)
    fresh = StackTuner(FAST, cache_directory=cache)
    decision = fresh.select(PERSISTENT, C, 0, FakeRunner({2: 0.8}, {1: TuneFailure.rejected("wrong output")}))
    assert (decision.name, decision.source) == ("b", DecisionSource.TUNED)


def test_a_device_failure_while_validating_a_stored_record_quarantines_and_keeps_the_record(cache: Path) -> None:
    _, key = tuned(cache)
    fresh = StackTuner(FAST, cache_directory=cache)
    with pytest.raises(TuneFailure) as info:
        fresh.select(PERSISTENT, C, 0, FakeRunner(verdicts={1: TuneFailure.device("lost")}))
    assert info.value.kind is FailureKind.DEVICE
    assert fresh.quarantined() == {PERSISTENT.environment}
    assert LocalStore(cache).get(key) is not None


def not_a_database(directory: Path) -> None:
    (directory / STORE_FILE).write_bytes(b"garbage " * 1000)
    for suffix in ("-wal", "-shm"):
        (directory / f"{STORE_FILE}{suffix}").unlink(missing_ok=True)


def row(damage: Callable[[str], Any]) -> Callable[[Path, str], None]:
    return lambda directory, key: damage_row(directory, key, damage)


STALE: list[tuple[str, Callable[[Path, str], None]]] = [
    *((case, row(damage)) for case, damage in ROW_DAMAGE),
    ("expired", row(rewritten(created=time.time() - FAST.ttl - 100))),
    ("future-dated", row(rewritten(created=time.time() + 3600))),
    ("another reference index", row(rewritten(reference_index=1))),
    ("winner index out of range", row(rewritten(index=7))),
    ("winner name differs", row(rewritten(name="zzz"))),
    ("the cache file is not a database", lambda directory, key: not_a_database(directory)),
]


@pytest.mark.parametrize(("case", "damage"), STALE, ids=[s[0] for s in STALE])
def test_a_corrupt_or_stale_disk_record_is_a_miss_with_a_cache_warning_never_a_crash(
    case: str, damage: Callable[[Path, str], None], cache: Path
) -> None:
    tuner, key = tuned(cache)
    tuner._disk.close()  # type: ignore[union-attr]
    damage(cache, key)
    fresh = StackTuner(FAST, cache_directory=cache)
    runner = FakeRunner({1: 0.5, 2: 0.8})
    decision = fresh.select(PERSISTENT, C, 0, runner)
    assert (decision.name, decision.source) == ("a", DecisionSource.TUNED)
    assert ("validate", 0, 1) in runner.calls and runner.measured() != []
    assert fresh.stats().cache_warnings >= 1
    assert fresh.stats().disk_hits == 0


def test_a_search_replaces_a_corrupt_record_with_a_valid_one(cache: Path) -> None:
    _, key = tuned(cache)
    damage_row(cache, key, lambda t: "garbage")
    StackTuner(FAST, cache_directory=cache).select(PERSISTENT, C, 0, FakeRunner({1: 0.5}))
    stored = LocalStore(cache).get(key)
    assert stored is not None and stored.name == "a"


def test_an_unverified_stored_record_is_not_reused_when_validation_is_required(cache: Path) -> None:
    _, key = tuned(cache)
    damage_row(cache, key, rewritten(verified=False))
    runner = FakeRunner({1: 0.5})
    decision = StackTuner(FAST, cache_directory=cache).select(PERSISTENT, C, 0, runner)
    assert decision.source is DecisionSource.TUNED


def test_a_banned_winner_on_disk_is_not_reused(cache: Path) -> None:
    tuner, key = tuned(cache)
    decision = tuner.select(PERSISTENT, C, 0, FakeRunner())
    tuner.invalidate(decision, True)
    assert LocalStore(cache).get(key) is None  # invalidation deletes the disk record too
    LocalStore(cache).put(record(key))  # another process stores the same winner again
    runner = FakeRunner({1: 0.5, 2: 0.8})
    again = tuner.select(PERSISTENT, C, 0, runner)
    assert (again.name, again.source) == ("b", DecisionSource.TUNED)
    assert runner.validated()[0] == (0, 0)


def test_the_disk_tier_prunes_to_the_policy_capacity(cache: Path) -> None:
    tuner = StackTuner(FAST.replace(capacity=2), cache_directory=cache)
    for n in range(4):
        tuner.select(problem(workload=f"w{n}", persistent=True), C[:2], 0, FakeRunner())
    assert len(LocalStore(cache)) == 2


def test_an_unwritable_cache_directory_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    tuner = StackTuner(FAST, cache_directory=blocker / "cache")
    decision = tuner.select(PERSISTENT, C, 0, FakeRunner({1: 0.5}))
    assert decision.source is DecisionSource.TUNED
    assert tuner.stats().cache_warnings == 2  # the failed read and the failed write
    assert tuner.select(PERSISTENT, C, 0, FakeRunner()).source is DecisionSource.MEMORY_CACHE


class BrokenFleet:
    """A fleet tier that cannot be reached."""

    def get(self, cache_key: str) -> None:
        raise ConnectionError("fleet down")

    def put(self, record: DecisionRecord) -> None:
        raise AssertionError("fleet tiers are read-only for the controller")

    def delete(self, cache_key: str) -> None:
        raise AssertionError("fleet tiers are read-only for the controller")


class OneRecordFleet(BrokenFleet):
    def __init__(self, stored: DecisionRecord) -> None:
        self.stored = stored

    def get(self, cache_key: str) -> DecisionRecord | None:
        return self.stored if cache_key == self.stored.cache_key else None


def test_an_unreachable_fleet_tier_is_a_miss_with_a_warning() -> None:
    tuner = StackTuner(FAST, fleet=[BrokenFleet()])
    assert tuner.select(PERSISTENT, C, 0, FakeRunner({1: 0.5})).source is DecisionSource.TUNED
    assert tuner.stats().cache_warnings == 1


def test_a_fleet_record_is_validated_once_and_then_served_from_memory() -> None:
    key = StackTuner(FAST).request(PERSISTENT, C, 0).key
    tuner = StackTuner(FAST, fleet=[OneRecordFleet(record(key, index=2, name="b", ratio=0.25))])
    runner = FakeRunner()
    decision = tuner.select(PERSISTENT, C, 0, runner)
    assert (decision.name, decision.source, decision.ratio) == ("b", DecisionSource.FLEET_CACHE, 0.25)
    assert runner.calls == [("validate", 0, 2)]
    assert tuner.select(PERSISTENT, C, 0, FakeRunner()).source is DecisionSource.MEMORY_CACHE
    assert tuner.stats().fleet_hits == 1


def test_a_fleet_record_that_fails_validation_is_skipped_and_not_deleted() -> None:
    key = StackTuner(FAST).request(PERSISTENT, C, 0).key
    fleet = OneRecordFleet(record(key))
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), fleet=[fleet])
    decision = tuner.select(PERSISTENT, C, 0, FakeRunner(verdicts={1: TuneFailure.rejected("wrong")}))
    assert decision.source is DecisionSource.CACHE_MISS


def test_the_fleet_is_never_consulted_for_a_session_only_problem() -> None:
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), fleet=[BrokenFleet()])
    assert tuner.select(problem(persistent=False), C, 0, FakeRunner()).source is DecisionSource.CACHE_MISS
    assert tuner.stats().cache_warnings == 0
