"""Parquet archives refused: hostile files (never followed, never a hang), every corrupt-archive
refusal with nothing imported, and the fingerprint rule with --force."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import stat
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from archive_helpers import (
    FP_A,
    FP_B,
    NAMES,
    cache_state,
    edit_manifest,
    edit_rows,
    entry,
    farm_cli,
    hand_archive,
    key_for,
    make_record,
    publish_fleet,
    redis_state,
    reseal,
    resealed_row,
    store_fixture,  # noqa: F401  (the store fixture)
)

import farm
import farm_archives
from farm.environment import fingerprint_digest
from farm.identity import Candidate, Problem, Scope, fields, split_fields
from farm.stores import archive as arc
from farm.stores.local import LocalStore
from farm_archives import operations as ops

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
        ops.import_cache([farm_archives.read_archive(folder)], tmp_path / "new-cache", FP_A)
        shared = tmp_path / "shared-cache"
        shared.mkdir(mode=0o750)
        os.chmod(shared, 0o750)
        ops.import_cache([farm_archives.read_archive(folder)], shared, FP_A)
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


def v2_row(e: arc.ArchiveEntry, fingerprint: str) -> dict[str, object]:
    from farm_archives.writer import decision_values

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
                               "manifest.json: field 'schema_version' = 3: this farm reads archive schema version "
                               "2 only"),
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
    archives = [farm_archives.read_archive(folder)]
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
