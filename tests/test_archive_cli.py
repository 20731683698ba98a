"""Parquet archives: merge and diff, and the `farm archive` commands."""

from __future__ import annotations

import json

import pytest
from archive_helpers import (
    FP_A,
    FP_B,
    POLICY,
    edit_manifest,
    entry,
    farm_cli,
    hand_archive,
    key_for,
    publish_fleet,
    publish_runtime_decision,
    redis_state,
    scale_operation,
    store_fixture,  # noqa: F401  (the store fixture)
)

import farm
import farm_archives
from farm.environment import fingerprint_digest
from farm.identity import split_fields
from farm.stores import archive as arc
from farm.stores.redis import field_for
from farm_archives import operations as ops

# -- merge and diff ---------------------------------------------------------------------------------------------


def test_merge_keeps_per_key_what_the_replacement_rule_keeps_with_its_trials(tmp_path):
    k1, k2, k3 = (key_for(FP_A, w) for w in ("n=1", "n=2", "n=3"))
    a = hand_archive(tmp_path / "a", FP_A, [entry(k1, verified=True, created=10.0, winner=1, run="a"),
                                            entry(k2, verified=False, created=30.0, winner=1, run="a")])
    b = hand_archive(tmp_path / "b", FP_A, [entry(k1, verified=False, created=99.0, winner=2, run="b"),
                                            entry(k2, verified=True, created=20.0, winner=2, run="b"),
                                            entry(k3, created=5.0, run="b")])
    c = hand_archive(tmp_path / "c", FP_A, [entry(k1, verified=True, created=50.0, winner=2, run="c")])
    result = ops.merge_archives([a, b, c], tmp_path / "m")
    assert result.written.decisions == 3 and result.replaced == 2
    merged = farm_archives.read_archive(result.written.path).entries
    runs = {e.record.cache_key: (e.record.meta["run"], e.record.name, e.record.verified) for e in merged.values()}
    assert runs == {k1: ("c", "other", True), k2: ("b", "other", True), k3: ("b", "fast", True)}
    assert all(t["run"] == e.record.meta["run"] for e in merged.values() for t in e.trials)
    assert all(len(e.trials) == 4 for e in merged.values())
    other = hand_archive(tmp_path / "x", FP_B, [entry(key_for(FP_B, "n=1"))])
    with pytest.raises(arc.ArchiveError, match="different fingerprints"):
        ops.merge_archives([a, other], tmp_path / "m")


def test_diff_reports_new_dropped_and_changed_winners_with_ratios(tmp_path):
    k1, k2, k3, k4 = (key_for(FP_A, w) for w in ("n=1", "n=2", "n=3", "n=4"))
    a = hand_archive(tmp_path / "a", FP_A, [entry(k1, winner=1), entry(k2), entry(k3, ratio=0.5)])
    b = hand_archive(tmp_path / "b", FP_A, [entry(k1, winner=2, ratio=0.4), entry(k3, ratio=0.6), entry(k4)])
    report = ops.diff_archives(a, b).to_json()
    assert report["matched_by"] == "cache key"
    assert [r["workload"] for r in report["new"]] == [split_fields(k4)[4]]
    assert [r["workload"] for r in report["dropped"]] == [split_fields(k2)[4]]
    assert [(c["winner_a"], c["winner_b"], c["ratio_a"], c["ratio_b"]) for c in report["changed"]] == [
        ("fast", "other", 0.5, 0.4)]
    assert [(u["ratio_a"], u["ratio_b"]) for u in report["updated"]] == [(0.5, 0.6)]
    assert report["unchanged"] == 0
    # Different fingerprints: decisions are matched by the key without its environment.
    c = hand_archive(tmp_path / "c", FP_B, [entry(key_for(FP_B, "n=1"), winner=1)])
    across = ops.diff_archives(a, c).to_json()
    assert across["matched_by"] == "cache key without the environment"
    assert across["unchanged"] == 1 and len(across["dropped"]) == 2


# -- the CLI ----------------------------------------------------------------------------------------------------


def test_the_cli_exports_inspects_and_imports_an_archive(store, redis_db, redis_srv, tmp_path):
    records = publish_fleet(store)
    before = redis_state(redis_db)
    url = redis_srv.url(1)
    done = farm_cli("export", "--redis", url, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"exported 3 decisions (8 trial rows) of fingerprint {fingerprint_digest(FP_A)}" in done.stdout

    shown = farm_cli("inspect", str(tmp_path / "out"), "--json", "--operation", "scale", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert sorted(r["key_sha256"] for r in rows) == sorted(field_for(r.cache_key) for r in records)
    unknown = farm_cli("inspect", str(tmp_path / "out"), "--json", "--operation", "nope", cwd=tmp_path)
    assert unknown.returncode == 2 and "operations: scale" in unknown.stderr  # an error naming the known ones
    table = farm_cli("inspect", str(tmp_path / "out" / fingerprint_digest(FP_B)), cwd=tmp_path)
    assert table.returncode == 0 and "scale" in table.stdout and "fast" in table.stdout

    redis_db.flushdb()
    loaded = farm_cli("import", str(tmp_path / "out"), "--redis", url, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    assert "3 decisions (3 new, 0 replaced, 0 kept" in loaded.stdout
    after = redis_state(redis_db)
    assert {k: v for k, v in after.items() if k != "t:events"} == {
        k: v for k, v in before.items() if k != "t:events"}


def test_the_cli_refuses_a_corrupt_archive_with_exit_2_naming_the_file_and_field(redis_srv, redis_db, tmp_path):
    folder = hand_archive(tmp_path / "in", FP_A, [entry(key_for(FP_A, "n=1"))])
    edit_manifest(folder, lambda m: m.update(schema_version=7))
    done = farm_cli("import", str(tmp_path / "in"), "--redis", redis_srv.url(1), cwd=tmp_path)
    assert done.returncode == 2
    assert "manifest.json" in done.stderr and "'schema_version' = 7" in done.stderr
    assert "Traceback" not in done.stderr
    assert redis_db.dbsize() == 0
    bad = farm_cli("import", str(tmp_path / "in"), cwd=tmp_path)
    assert bad.returncode == 2 and "give exactly one of --redis or --into-cache" in bad.stderr


def test_the_cli_imports_into_a_cache_directory_only_with_force_when_the_fingerprint_differs(store, tmp_path):
    # A decision tuned on another machine class (its key names another fingerprint) for farmtest_scale.
    published = publish_runtime_decision(store, fingerprint=FP_A)
    folder = hand_archive(tmp_path / "in", FP_A, [arc.ArchiveEntry(published, "p-runtime")])
    cache = tmp_path / "cache"
    refused = farm_cli("import", str(folder), "--into-cache", str(cache), "--device", "cpu:0", cwd=tmp_path)
    assert refused.returncode == 2
    assert "fingerprint mismatch" in refused.stderr and "nothing imported" in refused.stderr
    assert not cache.exists()
    forced = farm_cli("import", str(folder), "--into-cache", str(cache), "--device", "cpu:0", "--force",
                      cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "fingerprint check overridden by --force" in forced.stderr

    from farm.adapter import RuntimeTrials, prepare

    op = scale_operation()
    client = farm.HostClient(0)
    inputs = op.build({"n": 64, "dtype": "float64"}, client)
    tuner = farm.StackTuner(POLICY, cache_directory=cache)
    prepared = prepare(tuner, op.name, "cpu", client, op.host, inputs)
    decision = tuner.select_request(prepared.request, RuntimeTrials(client, op.host, inputs, prepared.indices,
                                                                    POLICY.timing))
    assert (decision.source, decision.name) == (farm.DecisionSource.DISK_CACHE, "vectorized")
    assert tuner.stats().tunes == 0


def test_the_cli_merges_and_diffs_archives(tmp_path):
    k1, k2 = key_for(FP_A, "n=1"), key_for(FP_A, "n=2")
    a = hand_archive(tmp_path / "a", FP_A, [entry(k1, winner=1, created=1.0)])
    b = hand_archive(tmp_path / "b", FP_A, [entry(k1, winner=2, created=2.0), entry(k2)])
    merged = farm_cli("merge", str(tmp_path / "m"), str(a), str(b), cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    assert "2 decisions, 1 replaced" in merged.stdout
    diff = farm_cli("diff", str(a), str(tmp_path / "m"), "--json", cwd=tmp_path)
    assert diff.returncode == 0, diff.stderr
    report = json.loads(diff.stdout)
    assert len(report["new"]) == 1 and [c["winner_b"] for c in report["changed"]] == ["other"]


def test_inspect_and_diff_print_a_config_name_with_its_brackets(tmp_path):
    names = ("reference", "row_blocks[height=64]", "[bold]x[/bold]")
    a = hand_archive(tmp_path / "a", FP_A, [entry(key_for(FP_A, "n=1", names=names), winner=1, names=names)])
    b = hand_archive(tmp_path / "b", FP_A, [entry(key_for(FP_A, "n=1", names=names), winner=2, names=names)])
    shown = farm_cli("inspect", str(a), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "row_blocks[height=64]" in shown.stdout, shown.stdout
    diff = farm_cli("diff", str(a), str(b), cwd=tmp_path)
    assert diff.returncode == 0, diff.stderr
    assert "row_blocks[height=64] -> [bold]x[/bold]" in " ".join(diff.stdout.split()), diff.stdout
