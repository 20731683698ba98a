"""Decision stores (memory and disk), and the controller's disk tier: reuse after one validation, corruption is a
miss with a warning, capacity pruning, and several processes sharing one directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import FAST, FakeRunner, candidates, problem

from farm.engine import DecisionSource, StackTuner, Validation
from farm.errors import FailureKind, TuneFailure
from farm.policy import MemoryEviction, Mode
from farm.stores.base import SCHEMA_VERSION, CorruptRecord, DecisionRecord, _checksum
from farm.stores.disk import DiskStore
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


# -- the store contract, for every implementation ---------------------------------------------------------


@pytest.fixture(params=["memory", "disk"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "memory":
        return MemoryStore(16)
    return DiskStore(tmp_path / "cache", 16)


def test_a_store_returns_none_for_an_unknown_key(store: Any) -> None:
    assert store.get("missing") is None


def test_a_store_returns_what_was_put(store: Any) -> None:
    r = record("k1")
    store.put(r)
    assert store.get("k1") == r


def test_a_store_replaces_a_record_with_the_same_key(store: Any) -> None:
    store.put(record("k1", name="a"))
    store.put(record("k1", name="b", index=2))
    assert store.get("k1").name == "b"


def test_a_store_forgets_a_deleted_record_and_deleting_twice_is_harmless(store: Any) -> None:
    store.put(record("k1"))
    store.delete("k1")
    store.delete("k1")
    assert store.get("k1") is None


def test_keys_that_differ_only_slightly_never_collide(store: Any) -> None:
    store.put(record("ab", name="first"))
    store.put(record("a", name="second"))
    assert (store.get("ab").name, store.get("a").name) == ("first", "second")


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


# -- the disk store ------------------------------------------------------------------------------------------


def test_the_disk_store_names_files_by_key_hash_and_stores_the_full_key(tmp_path: Path) -> None:
    disk = DiskStore(tmp_path, 8)
    disk.put(record("a full key"))
    (path,) = tmp_path.glob("*.json")
    assert path == disk.path("a full key")
    assert json.loads(path.read_text())["cache_key"] == "a full key"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


FILE_DAMAGE: list[tuple[str, Callable[[Path], None]]] = [
    ("corrupt JSON", lambda p: p.write_bytes(b"{not json")),
    ("truncated file", lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])),
    ("empty file", lambda p: p.write_bytes(b"")),
    ("not UTF-8", lambda p: p.write_bytes(b"\xff\xfe\x00\x81")),
    ("bad checksum", lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "ratio": 0.125}))),
    ("wrong schema version", lambda p: p.write_text(json.dumps(retyped(schema=99)(json.loads(p.read_text()))))),
    ("mismatched stored key", lambda p: p.write_text(json.dumps(retyped(cache_key="another")(json.loads(p.read_text()))))),
]


@pytest.mark.parametrize(("case", "damage"), FILE_DAMAGE, ids=[d[0] for d in FILE_DAMAGE])
def test_the_disk_store_reports_a_damaged_file_as_corrupt(case: str, damage: Callable[[Path], None], tmp_path: Path) -> None:
    disk = DiskStore(tmp_path, 8)
    disk.put(record("k"))
    damage(disk.path("k"))
    with pytest.raises(CorruptRecord):
        disk.get("k")


def test_the_disk_store_prunes_the_oldest_files_beyond_capacity(tmp_path: Path) -> None:
    disk = DiskStore(tmp_path, 3)
    past = time.time() - 1000
    for n in range(5):
        disk.put(record(f"k{n}"))
        os.utime(disk.path(f"k{n}"), (past + n, past + n))
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(disk.path(f"k{n}").name for n in (2, 3, 4))
    assert [disk.get(f"k{n}") is not None for n in range(5)] == [False, False, True, True, True]


def test_a_failed_write_keeps_the_old_record_and_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = DiskStore(tmp_path, 8)
    disk.put(record("k", name="old"))

    def no_rename(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError, match="disk full"):
        disk.put(record("k", name="new", index=2))
    monkeypatch.undo()
    assert disk.get("k").name == "old"
    assert [p.name for p in tmp_path.iterdir()] == [disk.path("k").name]


WRITER = """
import sys, time
from pathlib import Path
from farm.stores.base import CorruptRecord, DecisionRecord
from farm.stores.disk import DiskStore

directory, who, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
deadline = time.monotonic() + 30
while not go.exists():
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.001)
store = DiskStore(directory, 12)
for i in range(80):
    key = f"key-{i % 20}"
    store.put(DecisionRecord(key, i % 3, 0, f"{who}-{i}", True, 0.5, time.time()))
    try:
        store.get(f"key-{(i * 7) % 20}")
    except CorruptRecord as e:
        print("reader saw a corrupt record:", e)
        sys.exit(4)
"""


def test_two_processes_writing_one_directory_at_once_leave_only_valid_records(tmp_path: Path) -> None:
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
    files = list(directory.iterdir())
    assert files and all(f.suffix == ".json" for f in files)  # no temporary files left
    assert len(files) <= 12
    disk = DiskStore(directory, 12)
    for f in files:
        data = json.loads(f.read_bytes())
        loaded = disk.get(data["cache_key"])
        assert loaded is not None and disk.path(loaded.cache_key) == f
        assert loaded.name.split("-")[0] in ("left", "right")


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
    stored = DiskStore(cache, 8).get(key)
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
    assert not DiskStore(cache, 8).path(key).exists()
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
    assert DiskStore(cache, 8).path(key).exists()


def rewrite(path: Path, **changes: Any) -> None:
    path.write_text(json.dumps(retyped(**changes)(json.loads(path.read_text()))))


def replace_with_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


STALE: list[tuple[str, Callable[[Path], None]]] = [
    *FILE_DAMAGE,
    ("expired", lambda p: rewrite(p, created=time.time() - FAST.ttl - 100)),
    ("future-dated", lambda p: rewrite(p, created=time.time() + 3600)),
    ("another reference index", lambda p: rewrite(p, reference_index=1)),
    ("winner index out of range", lambda p: rewrite(p, index=7)),
    ("winner name differs", lambda p: rewrite(p, name="zzz")),
    ("a directory in its place", replace_with_directory),
]


@pytest.mark.parametrize(("case", "damage"), STALE, ids=[s[0] for s in STALE])
def test_a_corrupt_or_stale_disk_record_is_a_miss_with_a_cache_warning_never_a_crash(
    case: str, damage: Callable[[Path], None], cache: Path
) -> None:
    _, key = tuned(cache)
    damage(DiskStore(cache, 8).path(key))
    fresh = StackTuner(FAST, cache_directory=cache)
    runner = FakeRunner({1: 0.5, 2: 0.8})
    decision = fresh.select(PERSISTENT, C, 0, runner)
    assert (decision.name, decision.source) == ("a", DecisionSource.TUNED)
    assert ("validate", 0, 1) in runner.calls and runner.measured() != []
    assert fresh.stats().cache_warnings >= 1
    assert fresh.stats().disk_hits == 0


def test_a_search_replaces_a_corrupt_record_with_a_valid_one(cache: Path) -> None:
    _, key = tuned(cache)
    DiskStore(cache, 8).path(key).write_bytes(b"garbage")
    StackTuner(FAST, cache_directory=cache).select(PERSISTENT, C, 0, FakeRunner({1: 0.5}))
    stored = DiskStore(cache, 8).get(key)
    assert stored is not None and stored.name == "a"


def test_an_unverified_stored_record_is_not_reused_when_validation_is_required(cache: Path) -> None:
    _, key = tuned(cache)
    rewrite(DiskStore(cache, 8).path(key), verified=False)
    runner = FakeRunner({1: 0.5})
    decision = StackTuner(FAST, cache_directory=cache).select(PERSISTENT, C, 0, runner)
    assert decision.source is DecisionSource.TUNED


def test_a_banned_winner_on_disk_is_not_reused(cache: Path) -> None:
    tuner, key = tuned(cache)
    decision = tuner.select(PERSISTENT, C, 0, FakeRunner())
    tuner.invalidate(decision, True)
    assert not DiskStore(cache, 8).path(key).exists()  # invalidation deletes the disk record too
    DiskStore(cache, 8).put(record(key))  # another process stores the same winner again
    runner = FakeRunner({1: 0.5, 2: 0.8})
    again = tuner.select(PERSISTENT, C, 0, runner)
    assert (again.name, again.source) == ("b", DecisionSource.TUNED)
    assert runner.validated()[0] == (0, 0)


def test_the_disk_tier_prunes_to_the_policy_capacity(cache: Path) -> None:
    tuner = StackTuner(FAST.replace(capacity=2), cache_directory=cache)
    for n in range(4):
        tuner.select(problem(workload=f"w{n}", persistent=True), C[:2], 0, FakeRunner())
    assert len(list(cache.glob("*.json"))) == 2


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
