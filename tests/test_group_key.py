"""One GroupKey for (run, problem, group): built from tasks, results and raw messages alike, written into Redis key
names in one form and read back from notices; both results stores satisfy the worker's ResultsStore port."""

from __future__ import annotations

import pytest

from farm_fleet.protocol import STATUS_OK, GroupKey, GroupResult, GroupTask
from farm_fleet.results import MemoryResults, RedisResults, ResultsStore, Runner
from farm_fleet.settings import Settings

TASK = GroupTask("run:with:colons", "p1", "g0", "op", "cpu", {}, (("a", "1"),), {}, "fp")


def test_a_task_its_result_and_its_message_name_the_same_key() -> None:
    key = GroupKey("run:with:colons", "p1", "g0")
    assert TASK.key == key == GroupResult.failed(TASK, "x").key == GroupKey.of(TASK.to_dict())
    assert {TASK.key: 1}[key] == 1  # hashable: a dict key and a set member


@pytest.mark.parametrize("key", [GroupKey("r", "p1", "g0"), GroupKey("run:with:colons", "p1", "confirm"),
                                 GroupKey("", "p", "g")])
def test_a_key_reads_back_from_its_text(key: GroupKey) -> None:
    assert GroupKey.parse(str(key)) == key


def test_text_that_is_no_key_reads_as_none() -> None:
    assert GroupKey.parse("p1:g0") is None


def test_a_message_without_a_key_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        GroupKey.of({"run": "r", "group": "g0"})


def test_every_redis_name_of_a_group_holds_its_key_text() -> None:
    settings, key = Settings(prefix="t"), GroupKey("r", "p1", "g0")
    names = [settings.result_key(key), settings.attempts_key(key), settings.started_key(key),
             settings.running_key(key), settings.unrun_key(key)]
    assert names == ["t:result:v2:r:p1:g0", "t:attempts:r:p1:g0", "t:started:r:p1:g0", "t:running:r:p1:g0",
                     "t:unrun:r:p1:g0"]
    assert settings.notice_of(names[0]) == ("result", key) and settings.notice_of(names[4]) == ("unrun", key)


def test_the_memory_store_keeps_results_and_attempts_by_key() -> None:
    results = MemoryResults()
    key = TASK.key
    me = Runner.here("w1")
    assert results.begin(key, me, 60.0).attempt == 1
    stored = results.put_if_absent(GroupResult(key.run, key.problem_id, key.group, STATUS_OK))
    assert results.get(key) == stored and results.begin(key, me, 60.0).result == stored
    assert results.get_many([key, GroupKey("r", "p2", "g0")]) == [stored, None]
    results.discard([key])
    assert results.get(key) is None


def test_both_results_stores_are_the_workers_results_store(redis_db) -> None:
    assert isinstance(MemoryResults(), ResultsStore)
    assert isinstance(RedisResults(redis_db, Settings(prefix="t")), ResultsStore)
