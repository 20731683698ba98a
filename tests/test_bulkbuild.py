"""A farm publication into a directory without a cache file builds the file aside and links it into place: the
same file an ordinary transaction writes, all or nothing, never over a file another process created meanwhile.
And the text columns an import carries from the archive's arrays to the stores."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from farm.environment import fingerprint_digest
from farm.stores import bulkbuild
from farm.stores import local as local_module
from farm.stores.base import DecisionRecord, Publication
from farm.stores.local import APP, FARM, STORE_FILE, LocalStore
from farm_archives.columns import TextColumn, arrow_texts


def record(key: str, **changes: Any) -> DecisionRecord:
    fields: dict[str, Any] = {"cache_key": key, "index": 1, "reference_index": 0, "name": "a", "verified": True,
                              "ratio": 0.5, "created": time.time() - 100}
    fields.update(changes)
    return DecisionRecord(**fields)


def publications(now: float) -> list[Publication]:
    """New keys, a key published twice (the newer wins), one kept, two problems sharing a key, two fingerprints."""
    return [Publication(record(f"k{n}", created=now - n), "fp", f"pid-{n}", ({"pair": n},)) for n in range(30)] + [
        Publication(record("k3", name="newer", created=now), "fp", "pid-3b", ({"pair": 99},)),
        Publication(record("k4", name="older", created=now - 1000), "fp", "pid-4b"),
        Publication(record("other", created=now), "fp2", "", ()),
    ]


def file_state(directory: Path) -> dict[str, Any]:
    """Everything a cache file holds that a reader can see: schema, rows of every table, journal mode, version."""
    with contextlib.closing(sqlite3.connect(directory / STORE_FILE)) as conn:
        state: dict[str, Any] = {
            "schema": sorted(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall(),
                             key=lambda r: (r[0], r[1])),
            "journal": conn.execute("PRAGMA journal_mode").fetchone()[0],
            "version": conn.execute("PRAGMA user_version").fetchone()[0],
            "page_size": conn.execute("PRAGMA page_size").fetchone()[0],
        }
        for table, order in (("decisions", "key"), ("trials", "key"), ("fingerprints", "digest"),
                             ("problems", "digest, problem_id"), ("counts", "owner")):
            columns = "key, owner, created, problem_id, record" if table == "decisions" else "*"
            state[table] = conn.execute(f"SELECT {columns} FROM {table} ORDER BY {order}").fetchall()
    return state


def test_a_first_publication_builds_the_file_a_transaction_would_have_written(tmp_path: Path) -> None:
    now = time.time()
    pubs = publications(now)
    built = LocalStore(tmp_path / "built", owner=FARM)
    replies = built.publish_many(pubs)
    assert not list((tmp_path / "built").glob(".*"))  # no file left aside
    # The same publications through an ordinary transaction: the file exists already (one row, then deleted).
    (tmp_path / "tx").mkdir()
    seeded = LocalStore(tmp_path / "tx", owner=FARM)
    seeded.put(record("seed"))
    seeded.delete("seed")
    assert seeded.publish_many(pubs) == replies
    assert replies[30:] == [(True, "replaced"), (False, "kept: the stored record wins under the replacement rule"),
                            (True, "new")]
    built.close()
    seeded.close()
    assert file_state(tmp_path / "built") == file_state(tmp_path / "tx")
    assert file_state(tmp_path / "built")["journal"] == "wal"


def test_a_built_file_serves_applications_and_later_publications_like_any_other(tmp_path: Path) -> None:
    now = time.time()
    farm_side = LocalStore(tmp_path, owner=FARM)
    farm_side.publish_many(publications(now))
    app = LocalStore(tmp_path, capacity=2)
    for n in range(4):
        app.put(record(f"app-{n}"))
    assert (app.count(FARM), app.count(APP)) == (31, 2)  # the count triggers were built with the file
    assert app.get("k3").name == "newer" and farm_side.trials("k3") == [{"pair": 99}]
    assert farm_side.decided(fingerprint_digest("fp"), ["pid-3", "pid-3b", "pid-4b", "pid-x"]) == {"pid-3", "pid-3b"}
    assert farm_side.publish_many([Publication(record("k5", created=now + 1), "fp", "pid-5")]) == [(True, "replaced")]
    assert len(farm_side) == 33


def test_a_file_created_meanwhile_is_kept_and_the_publication_goes_through_a_transaction(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    other = LocalStore(tmp_path, capacity=10)
    real_link = os.link

    def racing_link(src: Any, dst: Any) -> None:  # another process creates the cache just before the link
        other.put(record("theirs"))
        real_link(src, dst)

    monkeypatch.setattr(bulkbuild.os, "link", racing_link)
    farm_side = LocalStore(tmp_path, owner=FARM)
    assert farm_side.publish_many(publications(now))[:2] == [(True, "new"), (True, "new")]
    assert other.get("theirs") is not None and farm_side.get("k0") is not None
    assert (farm_side.count(APP), farm_side.count(FARM)) == (1, 31)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_build_that_fails_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(path: Path) -> None:
        raise OSError("injected: the disk is full")

    monkeypatch.setattr(bulkbuild, "_fsync", failing)
    with pytest.raises(OSError, match="injected"):
        LocalStore(tmp_path / "cache", owner=FARM).publish_many(publications(time.time()))
    assert list((tmp_path / "cache").iterdir()) == []
    monkeypatch.undo()
    assert LocalStore(tmp_path / "cache", owner=FARM).publish_many(publications(time.time()))[0] == (True, "new")


def test_a_built_file_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        LocalStore(tmp_path / "cache", owner=FARM).publish_many(publications(time.time()))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "cache" / STORE_FILE).stat().st_mode) == 0o640


# -- text columns ------------------------------------------------------------------------------------------------


def column(parts: list[Any]) -> TextColumn:
    """A column built from Arrow arrays (string or large_string) and Python values, in that order of parts."""
    texts = TextColumn()
    for part in parts:
        if isinstance(part, list):
            texts.extend(part)
        else:
            texts.append_array(part)
    return texts


@pytest.mark.parametrize("parts", [
    [["a", "b", "c", "d", "e"]],
    [pa.array(["a", "b"]), pa.array(["c", "d", "e"], pa.large_string())],
    [pa.array(["a"]), ["b", "c"], pa.array(["x", "d", "e"]).slice(1), []],
    [pa.array([], pa.string()), ["a", "b", "c", "d", "e"], pa.array([], pa.string())],
])
def test_a_text_column_reads_as_the_list_of_its_texts_however_it_was_built(parts: list[Any]) -> None:
    texts = column(parts)
    want = ["a", "b", "c", "d", "e"]
    assert len(texts) == 5 and list(texts) == want and texts == want and texts == tuple(want)
    assert [texts[i] for i in range(-5, 5)] == want + want
    for start in range(6):
        for stop in range(start, 7):
            assert texts[start:stop] == want[start:stop]
            assert arrow_texts(texts, start, stop).to_pylist() == want[start:stop]
            assert arrow_texts(want, start, stop).type == pa.large_string()
    assert texts[::2] == ["a", "c", "e"]
    with pytest.raises(IndexError):
        texts[5]
    assert texts != ["a"] and texts != want[::-1]


def test_a_text_column_refuses_nulls() -> None:
    with pytest.raises(ValueError, match="no nulls"):
        TextColumn().append_array(pa.array(["a", None]))


def test_a_sqlite_failure_while_building_is_an_oserror_naming_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> None:
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(bulkbuild.sqlite3, "connect", refused)
    with pytest.raises(OSError, match=r"cache/farm-cache\.sqlite3: unable to open database file"):
        LocalStore(tmp_path / "cache", owner=FARM).publish_many(publications(time.time()))


def test_a_publication_into_an_existing_file_goes_straight_to_a_transaction(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a directory without a cache file is built aside: later publications (the embedded farm's batches)
    stage their decisions once, in their transaction."""
    LocalStore(tmp_path, owner=FARM).publish_many(publications(time.time()))

    def never(*args: Any, **kwargs: Any) -> bool:
        raise AssertionError("a file was built aside over an existing cache")

    monkeypatch.setattr(local_module, "build_aside", never)
    later = LocalStore(tmp_path, owner=FARM)  # a new process's store: no connection open yet
    assert later.publish_many([Publication(record("k0", created=time.time()), "fp", "pid-0")]) == [(True, "replaced")]
