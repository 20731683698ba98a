"""Cache tiers on the application path (issues 12.3 and 15): a failing tier is a logged warning and a miss, never
an error for the caller; validated fleet hits are written through to the local cache directory."""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from fakes import FAST, FakeRunner, candidates, problem

from farm.engine import DecisionSource, StackTuner
from farm.errors import TuneFailure
from farm.policy import Mode
from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore

PERSISTENT = problem(persistent=True)
C = candidates("ref", "a", "b")


def record(key: str, **changes: Any) -> DecisionRecord:
    fields: dict[str, Any] = {"cache_key": key, "index": 1, "reference_index": 0, "name": "a", "verified": True,
                              "ratio": 0.5, "created": time.time()}
    fields.update(changes)
    return DecisionRecord(**fields)


class ReadOnlyDisk(LocalStore):
    """A cache directory on a read-only file system: reads work, every write fails as the kernel says."""

    def put(self, record: DecisionRecord) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(self.directory))

    def delete(self, cache_key: str) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(self.directory))


class OneRecordFleet:
    def __init__(self, stored: DecisionRecord) -> None:
        self.stored = stored

    def get(self, cache_key: str) -> DecisionRecord | None:
        return self.stored if cache_key == self.stored.cache_key else None

    def put(self, record: DecisionRecord) -> None:
        raise AssertionError("fleet tiers are read-only for the controller")

    def delete(self, cache_key: str) -> None:
        raise AssertionError("fleet tiers are read-only for the controller")


def test_a_stored_winner_that_fails_validation_on_a_read_only_cache_is_a_warning_and_a_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path)
    key = tuner.request(PERSISTENT, C, 0).key
    LocalStore(tmp_path, 16).put(record(key))
    tuner._disk = ReadOnlyDisk(tmp_path, 16)
    with caplog.at_level(logging.WARNING, logger="farm.engine"):
        decision = tuner.select(PERSISTENT, C, 0, FakeRunner(verdicts={1: TuneFailure.rejected("wrong output")}))
    assert decision.source is DecisionSource.CACHE_MISS
    assert decision.name == "ref"
    assert tuner.stats().cache_warnings == 2  # the failed check and the failed delete
    assert any("Read-only file system" in r.getMessage() for r in caplog.records)


def test_a_tuned_decision_on_a_read_only_cache_is_served_and_the_failed_write_is_a_warning(tmp_path: Path) -> None:
    tuner = StackTuner(FAST, cache_directory=tmp_path)
    tuner._disk = ReadOnlyDisk(tmp_path, 16)
    decision = tuner.select(PERSISTENT, C, 0, FakeRunner({1: 0.5}))
    assert decision.source is DecisionSource.TUNED
    assert tuner.stats().cache_warnings == 1
    tuner.invalidate(decision, ban_candidate=True)  # the failed delete is a warning too
    assert tuner.stats().cache_warnings == 2


def test_a_tier_raising_anything_at_all_is_a_miss(tmp_path: Path) -> None:
    class Weird(OneRecordFleet):
        def get(self, cache_key: str) -> DecisionRecord | None:
            raise ValueError("a store bug")

    tuner = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), fleet=[Weird(record("k"))])
    assert tuner.select(PERSISTENT, C, 0, FakeRunner()).source is DecisionSource.CACHE_MISS
    assert tuner.stats().cache_warnings == 1


def test_a_validated_fleet_hit_is_written_through_to_the_cache_directory(tmp_path: Path) -> None:
    key = StackTuner(FAST).request(PERSISTENT, C, 0).key
    fleet = OneRecordFleet(record(key, index=2, name="b", ratio=0.25))
    first = StackTuner(FAST, cache_directory=tmp_path, fleet=[fleet])
    assert first.select(PERSISTENT, C, 0, FakeRunner()).source is DecisionSource.FLEET_CACHE
    restarted = StackTuner(FAST.replace(mode=Mode.CACHE_ONLY), cache_directory=tmp_path)  # no fleet any more
    decision = restarted.select(PERSISTENT, C, 0, FakeRunner())
    assert (decision.name, decision.source) == ("b", DecisionSource.DISK_CACHE)


def test_write_through_can_be_turned_off(tmp_path: Path) -> None:
    key = StackTuner(FAST).request(PERSISTENT, C, 0).key
    fleet = OneRecordFleet(record(key, index=2, name="b", ratio=0.25))
    tuner = StackTuner(FAST, cache_directory=tmp_path, fleet=[fleet], fleet_write_through=False)
    assert tuner.select(PERSISTENT, C, 0, FakeRunner()).source is DecisionSource.FLEET_CACHE
    assert LocalStore(tmp_path).get(key) is None
