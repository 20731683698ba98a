"""Nearest decisions (issue 27): the workload family and distance, the policy, and the controller's borrowing of a
validated nearest decision from the local cache and archives (real SQLite, real Parquet)."""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from fakes import FAST, FakeRunner, candidates, problem

import farm
from farm.engine import DecisionSource, StackTuner
from farm.errors import TuneFailure
from farm.nearest import FamilyIndex, distance, family_of, parse_workload, query_of, rank
from farm.policy import Mode, StackPolicy
from farm.stores.archive import ArchiveEntry, ArchiveStore
from farm.stores.base import DecisionRecord
from farm.stores.local import FARM, LocalStore
from farm_archives import write_archive

ENV = "8:backend16:device-class-text"
C = candidates("ref", "a", "b")


def sig(*shapes: tuple[int, ...], dtype: str = "<f4", extra: str = "") -> str:
    """An array_signature of C-contiguous arrays of these shapes."""
    parts = []
    for shape in shapes:
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
        parts.append(f"numpy:{dtype}{shape}s{tuple(strides)}".replace(",)", ",)"))
    return ";".join(parts) + extra


def square(n: int, **options: Any) -> farm.Problem:
    return problem(environment=ENV, workload=sig((n, n), (n, n), **options), persistent=True)


def key_of(p: farm.Problem, policy: StackPolicy = FAST) -> str:
    return StackTuner(policy).request(p, C, 0).key


def record(key: str, index: int = 1, name: str = "a", **changes: Any) -> DecisionRecord:
    fields: dict[str, Any] = {"cache_key": key, "index": index, "reference_index": 0, "name": name, "verified": True,
                              "ratio": 0.5, "created": time.time()}
    fields.update(changes)
    return DecisionRecord(**fields)


# -- the distance and the family: tables ------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b", "expected"), [
    ((64, 64), (64, 64), 0.0),
    ((8,), (64,), 3.0),
    ((64, 8), (8, 64), 3.0),  # the largest per-dimension distance
    ((3,), (24,), 3.0),
    ((100, 100), (200, 50), 1.0),
    ((0, 4), (0, 4), 0.0),
    ((0, 4), (1, 4), math.inf),  # a zero dimension is near only another zero
    ((4, 4), (4, 4, 4), math.inf),  # another rank is never near
])
def test_the_distance_is_the_largest_log2_ratio_of_any_dimension(a, b, expected) -> None:
    assert distance(a, b) == pytest.approx(expected)


def test_ties_in_distance_go_to_the_smaller_sum_of_per_dimension_distances() -> None:
    assert rank((64, 64), (128, 64)) < rank((64, 64), (128, 128))
    assert rank((64, 64), (128, 64))[0] == rank((64, 64), (128, 128))[0] == 1.0


@pytest.mark.parametrize(("workload", "family", "dims"), [
    ("numpy:<f4(4, 8)s(8, 1)", "numpy:<f4[2]C", (4, 8)),
    ("numpy:<f4(8, 4)s(1, 8)", "numpy:<f4[2]F", (8, 4)),  # a transposed view
    ("numpy:<f4(4, 4)s(8, 2)", "numpy:<f4[2]s(8, 2)", (4, 4)),  # strided: its strides stay exact
    ("numpy:<f8(1, 5)s(5, 1);int=3", "numpy:<f8[2]C;int=3", (1, 5)),  # a parameter stays exact
    ("cupy:<f2(16,)s(1,)", "cupy:<f2[1]C", (16,)),
    ("numpy:<f4(4,)s('bytes', 6)", "numpy:<f4[1]s('bytes', 6)", (4,)),
    ("f32[64,128]", "f32[#,#]", (64, 128)),  # the bracketed form: integer lists are shapes, the rest is exact
    ("f16[8];f16[8, 3];causal=True", "f16[#];f16[#,#];causal=True", (8, 8, 3)),
])
def test_a_workload_splits_into_its_family_and_its_dimensions(workload, family, dims) -> None:
    parsed = parse_workload(workload)
    assert parsed is not None and parsed.family == family and parsed.dims == dims


@pytest.mark.parametrize("workload", ["int=3;float=2.5", "numpy:<f4 garbage", "f32[]", "f32[a,b]", ""])
def test_a_workload_of_another_form_or_without_dimensions_has_no_family(workload) -> None:
    assert parse_workload(workload) is None


def test_two_keys_share_a_family_only_when_everything_but_the_dimensions_is_equal() -> None:
    base = family_of(key_of(square(64)))
    assert base is not None
    assert family_of(key_of(square(256))).digest == base.digest
    differs = [
        square(64, dtype="<f8"), square(64, extra=";int=2"),
        problem(environment=ENV, workload=sig((64, 64)), persistent=True),  # another argument list
        problem(environment="another-fingerprint", workload=sig((64, 64), (64, 64)), persistent=True),
        problem(operation="softmax", environment=ENV, workload=sig((64, 64), (64, 64)), persistent=True),
    ]
    for p in differs:
        assert family_of(key_of(p)).digest != base.digest, p
    assert family_of(key_of(square(64), FAST.replace(min_speedup=1.2))).digest != base.digest  # accuracy key
    other_set = StackTuner(FAST).request(square(64), candidates("ref", "a", "c"), 0).key
    assert family_of(other_set).digest != base.digest


def test_the_family_index_answers_the_nearest_within_the_window_and_never_the_query_itself() -> None:
    index = FamilyIndex()
    query = query_of(key_of(square(64)))
    assert query is not None
    for ref, n in enumerate((8, 32, 64, 100, 128, 1024)):
        index.add(query.digest, (n, n, n, n), ref)
    index.add("another-family", (64, 64, 64, 64), 99)
    found = index.near(query, 3.0)
    assert [ref for _, ref in found] == [3, 1, 4, 0]  # 100, then 32 and 128 (a tie: by ref), then 8; not 1024
    assert [order[0] for order, _ in found] == [pytest.approx(math.log2(100 / 64)), 1.0, 1.0, 3.0]
    assert [ref for _, ref in index.near(query, 0.5)] == []


# -- the policy and the tunable set ------------------------------------------------------------------------------


def test_nearest_is_on_by_default_in_explore_and_cache_only_within_a_factor_of_8() -> None:
    for mode in (Mode.EXPLORE, Mode.CACHE_ONLY):
        policy = StackPolicy(mode=mode).validate()
        assert policy.nearest is True and policy.max_distance == 3.0
    assert StackPolicy.from_dict({"nearest": False, "max_distance": 1.5}) == StackPolicy(nearest=False,
                                                                                         max_distance=1.5)


@pytest.mark.parametrize(("field", "value"), [("nearest", "yes"), ("max_distance", -1.0),
                                              ("max_distance", math.nan), ("max_distance", True)])
def test_a_bad_nearest_setting_is_invalid_input_naming_the_field(field, value) -> None:
    with pytest.raises(TuneFailure, match=f"policy.{field}"):
        StackPolicy(**{field: value}).validate()


def test_the_nearest_settings_are_not_part_of_the_accuracy_key() -> None:
    assert StackPolicy(nearest=False, max_distance=1.0).accuracy_key() == StackPolicy().accuracy_key()


def test_a_tunable_set_may_refuse_nearest_decisions() -> None:
    assert farm.TunableSet("op", signature=farm.array_signature).nearest is True
    assert farm.TunableSet("op", signature=farm.array_signature, nearest=False).nearest is False
    with pytest.raises(TuneFailure, match="nearest must be a bool"):
        farm.TunableSet("op", signature=farm.array_signature, nearest="no")  # type: ignore[arg-type]


# -- the controller, with the local cache as the tier ------------------------------------------------------------


def disk_with(tmp_path: Path, *records: DecisionRecord) -> Path:
    store = LocalStore(tmp_path, 64)
    for r in records:
        store.put(r)
    store.close()
    return tmp_path


@pytest.mark.parametrize("mode", [Mode.EXPLORE, Mode.CACHE_ONLY])
def test_a_miss_borrows_the_nearest_decision_after_validating_it_once(tmp_path: Path, mode: Mode) -> None:
    origin = square(64)
    disk_with(tmp_path, record(key_of(origin)), record(key_of(square(8)), index=2, name="b"))
    tuner = StackTuner(FAST.replace(mode=mode), cache_directory=tmp_path)
    runner = FakeRunner()
    decision = tuner.select(square(128), C, 0, runner)
    assert decision.source is DecisionSource.NEAREST
    assert (decision.index, decision.name, decision.ratio) == (1, "a", 0.5)
    assert isinstance(decision, farm.NearestDecision)
    assert decision.origin == origin.workload and decision.distance == 1.0
    assert decision.origin_key == key_of(origin)
    assert decision.cache_key == tuner.request(square(128), C, 0).key
    assert runner.calls == [("validate", 0, 1)]  # validated once on the live workload, nothing measured
    again = tuner.select(square(128), C, 0, runner)
    assert again == decision and again.source is DecisionSource.NEAREST
    assert runner.calls == [("validate", 0, 1)]  # held in memory: no second validation
    assert LocalStore(tmp_path).get(decision.cache_key) is None  # never stored as the exact key's record
    stats = tuner.stats()
    assert (stats.nearest_hits, stats.misses, stats.tunes, stats.memory_hits) == (2, 1, 0, 0)


def test_a_borrowed_winner_that_fails_on_the_live_workload_falls_back_and_is_remembered(tmp_path: Path) -> None:
    disk_with(tmp_path, record(key_of(square(64))))
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path)
    runner = FakeRunner(verdicts={1: TuneFailure.rejected("wrong output")})
    first = tuner.select(square(128), C, 0, runner)
    assert (first.source, first.name) == (DecisionSource.CACHE_MISS, "ref")
    second = tuner.select(square(128), C, 0, runner)
    assert (second.source, second.name) == (DecisionSource.CACHE_MISS, "ref")
    assert runner.calls == [("validate", 0, 1)]  # the refusal is remembered: never validated again
    assert tuner.stats().nearest_refused == 1 and tuner.stats().nearest_hits == 0
    assert LocalStore(tmp_path).get(key_of(square(64))) is not None  # the origin's own record stays


def test_a_failed_borrowed_winner_in_explore_goes_on_to_the_search(tmp_path: Path) -> None:
    disk_with(tmp_path, record(key_of(square(64))))
    tuner = StackTuner(FAST, cache_directory=tmp_path)
    decision = tuner.select(square(128), C, 0, FakeRunner({0: 1.0, 1: 0.5, 2: 0.4},
                                                          verdicts={1: TuneFailure.rejected("wrong output")}))
    assert (decision.source, decision.name) == (DecisionSource.TUNED, "b")


def test_nothing_within_max_distance_is_a_plain_miss(tmp_path: Path) -> None:
    disk_with(tmp_path, record(key_of(square(8))))
    runner = FakeRunner()
    cache_only = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path)
    assert cache_only.select(square(128), C, 0, runner).source is DecisionSource.CACHE_MISS  # a factor of 16
    wider = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY, max_distance=4.0), cache_directory=tmp_path)
    assert wider.select(square(128), C, 0, runner).source is DecisionSource.NEAREST
    assert runner.calls == [("validate", 0, 1)]


def test_a_policy_without_nearest_and_a_refusing_request_never_borrow(tmp_path: Path) -> None:
    disk_with(tmp_path, record(key_of(square(64))))
    runner = FakeRunner()
    off = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY, nearest=False), cache_directory=tmp_path)
    assert off.select(square(128), C, 0, runner).source is DecisionSource.CACHE_MISS
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path)
    refusing = tuner.request(square(128), C, 0)._replace(nearest=False)
    assert tuner.select_request(refusing, runner).source is DecisionSource.CACHE_MISS
    assert runner.calls == []


def test_an_unusable_nearer_record_gives_way_to_the_next_one(tmp_path: Path) -> None:
    disk_with(tmp_path, record(key_of(square(100)), verified=False), record(key_of(square(32)), index=2, name="b"))
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path)
    decision = tuner.select(square(64), C, 0, FakeRunner())
    assert decision.source is DecisionSource.NEAREST and decision.name == "b"
    assert decision.origin == square(32).workload


def test_a_borrowed_decision_that_fails_live_is_forgotten_and_its_winner_banned(tmp_path: Path) -> None:
    disk_with(tmp_path, record(key_of(square(64))))
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path)
    decision = tuner.select(square(128), C, 0, FakeRunner())
    tuner.invalidate(decision, ban_candidate=True)
    after = tuner.select(square(128), C, 0, FakeRunner())
    assert (after.source, after.name) == (DecisionSource.CACHE_MISS, "ref")


def test_a_bracketed_workload_borrows_like_a_signature(tmp_path: Path) -> None:
    near = problem(environment=ENV, workload="f32[64,64]", persistent=True)
    disk_with(tmp_path, record(key_of(near)))
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path)
    decision = tuner.select(problem(environment=ENV, workload="f32[96,64]", persistent=True), C, 0, FakeRunner())
    assert decision.source is DecisionSource.NEAREST and decision.origin == "f32[64,64]"
    other_dtype = problem(environment=ENV, workload="f64[96,64]", persistent=True)
    assert tuner.select(other_dtype, C, 0, FakeRunner()).source is DecisionSource.CACHE_MISS


def test_a_session_only_problem_never_borrows(tmp_path: Path) -> None:
    disk_with(tmp_path, record(key_of(square(64))))
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path)
    session = problem(environment=ENV, workload=sig((128, 128), (128, 128)), persistent=False)
    assert tuner.select(session, C, 0, FakeRunner()).source is DecisionSource.CACHE_MISS


# -- the local cache's index (real SQLite) -----------------------------------------------------------------------


def test_the_local_index_answers_nearest_first_and_forgets_deleted_decisions(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, 64)
    for n in (16, 48, 64, 1024):
        store.put(record(key_of(square(n))))
    query = query_of(key_of(square(40)))
    hits = store.nearest(query, 3.0)
    assert [h.workload for h in hits] == [square(48).workload, square(64).workload, square(16).workload]
    store.delete(key_of(square(48)))
    assert [h.workload for h in store.nearest(query, 3.0)][0] == square(64).workload
    rows = sqlite3.connect(store.path).execute("SELECT COUNT(*) FROM nearest").fetchone()[0]
    assert rows == 3


def test_farm_publications_are_indexed_in_their_transaction(tmp_path: Path) -> None:
    built = LocalStore(tmp_path / "fresh", owner=FARM)  # a new file: built aside
    built.publish_many([farm.stores.base.Publication(record(key_of(square(n))), ENV) for n in (32, 64)])
    assert [h.workload for h in built.nearest(query_of(key_of(square(40))), 3.0)] == [
        square(32).workload, square(64).workload]
    built.publish(record(key_of(square(40))), ENV)  # into the existing file: one transaction
    assert built.nearest(query_of(key_of(square(41))), 3.0)[0].workload == square(40).workload


def test_a_cache_file_written_before_the_index_gets_it_when_opened(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, 64)
    store.put(record(key_of(square(64))))
    store.close()
    conn = sqlite3.connect(tmp_path / "farm-cache.sqlite3")
    conn.executescript("DROP TRIGGER decisions_unindexed; DROP TABLE nearest;")
    conn.close()
    reopened = LocalStore(tmp_path, 64)
    assert [h.workload for h in reopened.nearest(query_of(key_of(square(128))), 3.0)] == [square(64).workload]


# -- archives (real Parquet) -------------------------------------------------------------------------------------


def test_an_archive_answers_nearest_from_an_index_built_at_its_first_lookup(tmp_path: Path) -> None:
    entries = [ArchiveEntry(record(key_of(square(n)), created=100.0 + n)) for n in (16, 64, 256, 4096)]
    write_archive(tmp_path, ENV, entries)
    archives = ArchiveStore(tmp_path)
    hits = archives.nearest(query_of(key_of(square(100))), 3.0)
    assert [h.workload for h in hits] == [square(64).workload, square(256).workload, square(16).workload]
    assert hits[0].record == entries[1].record
    assert archives.nearest(query_of(key_of(square(100), FAST.replace(min_speedup=1.5))), 3.0) == []


def test_the_controller_borrows_from_an_archive_fleet_tier(tmp_path: Path) -> None:
    write_archive(tmp_path / "archives", ENV, [ArchiveEntry(record(key_of(square(64))))])
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), fleet=[tmp_path / "archives"])
    decision = tuner.select(square(96), C, 0, FakeRunner())
    assert decision.source is DecisionSource.NEAREST and decision.origin == square(64).workload


def test_a_busy_device_during_the_check_is_busy_and_never_a_refusal(tmp_path: Path) -> None:
    from farm.errors import DeviceBusy

    disk_with(tmp_path, record(key_of(square(64))))
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path)
    assert tuner.select(square(128), C, 0, FakeRunner(verdicts={1: DeviceBusy("lock taken")})).source is \
        DecisionSource.BUSY
    assert tuner.select(square(128), C, 0, FakeRunner()).source is DecisionSource.NEAREST
    assert tuner.stats().nearest_refused == 0


def test_a_held_borrowed_decision_ends_with_its_origin_records_ttl(tmp_path: Path, monkeypatch) -> None:
    import farm.borrowing

    disk_with(tmp_path, record(key_of(square(64))))
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path)
    runner = FakeRunner()
    assert tuner.select(square(128), C, 0, runner).source is DecisionSource.NEAREST

    class Later:
        @staticmethod
        def time() -> float:
            return time.time() + FAST.ttl + 1.0

    monkeypatch.setattr(farm.borrowing, "time", Later)
    assert tuner.select(square(128), C, 0, runner).source is DecisionSource.CACHE_MISS  # expired: the origin too
    assert runner.calls == [("validate", 0, 1)]


def test_a_tier_whose_nearest_lookup_fails_is_a_logged_warning_and_no_answer(tmp_path: Path, caplog) -> None:
    class Unreachable:
        def get(self, cache_key: str) -> None:
            return None

        def put(self, record: DecisionRecord) -> None:
            raise AssertionError("read-only")

        def delete(self, cache_key: str) -> None:
            raise AssertionError("read-only")

        def nearest(self, query: Any, max_distance: float) -> list[Any]:
            raise ConnectionError("fleet down")

    disk_with(tmp_path, record(key_of(square(64))))
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path, fleet=[Unreachable()])
    with caplog.at_level("WARNING", logger="farm.borrowing"):
        decision = tuner.select(square(128), C, 0, FakeRunner())
    assert decision.source is DecisionSource.NEAREST  # the local cache still answers
    assert any("fleet down" in r.getMessage() for r in caplog.records)
