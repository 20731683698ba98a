"""Parquet archives as the runtime's fleet tier: hits after one validation, read-only, warnings not errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from archive_helpers import (
    FP_A,
    FP_B,
    NAMES,
    POLICY,
    entry,
    hand_archive,
    key_for,
    make_record,
    publish_runtime_decision,
    scale_operation,
    store_fixture,  # noqa: F401  (the store fixture)
)
from servers import farm_env

import farm
from farm.identity import Candidate, Problem, Scope, cache_key, fields
from farm.stores import archive as arc
from farm_archives import operations as ops

# -- the runtime's fleet tier -----------------------------------------------------------------------------------


class CountingRunner:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def validate(self, reference, candidate, tolerance):
        self.calls.append("validate")
        return self.inner.validate(reference, candidate, tolerance)

    def measure(self, candidate):
        self.calls.append("measure")
        return self.inner.measure(candidate)


def test_a_runtime_with_only_an_archive_hits_after_one_validation_and_no_tuning(store, tmp_path):
    from farm.adapter import RuntimeTrials, prepare

    published = publish_runtime_decision(store)
    ops.export_redis(store, tmp_path / "archives")
    op = scale_operation()
    client = farm.HostClient(0)
    inputs = op.build({"n": 64, "dtype": "float64"}, client)
    tuner = farm.StackTuner(POLICY, fleet=[arc.ArchiveStore(tmp_path / "archives")])
    prepared = prepare(tuner, op.name, "cpu", client, op.host, inputs)
    assert prepared.request.key == published.cache_key
    runner = CountingRunner(RuntimeTrials(client, op.host, inputs, prepared.indices, POLICY.timing))
    first = tuner.select_request(prepared.request, runner)
    second = tuner.select_request(prepared.request, runner)
    assert (first.source, first.name) == (farm.DecisionSource.FLEET_CACHE, "vectorized")
    assert second.source is farm.DecisionSource.MEMORY_CACHE
    stats = tuner.stats()
    assert (stats.fleet_hits, stats.memory_hits, stats.tunes, stats.misses) == (1, 1, 0, 0)
    assert runner.calls == ["validate"]


RUNTIME_SCRIPT = """
import json, sys
import farm
from farm.stores.archive import ArchiveStore
from farm_kernels import registry

calls = {"validate": 0, "measure": 0}
for name in calls:
    original = getattr(farm.RuntimeTrials, name)
    def counting(self, *args, _original=original, _name=name):
        calls[_name] += 1
        return _original(self, *args)
    setattr(farm.RuntimeTrials, name, counting)
registry.ensure_loaded(("farm_testops",))
op = registry.get("farmtest_scale")
tuner = farm.enable_stack_autotune(farm.StackPolicy(), fleet=[ArchiveStore(sys.argv[1])])
client = farm.HostClient(0)
x = op.build({"n": 64, "dtype": "float64"}, client)[0]
outputs = [farm.try_execute_stack(op.name, "cpu", client, op.host, (x,)) for _ in range(2)]
s = tuner.stats()
print(json.dumps({"calls": calls, "fleet_hits": s.fleet_hits, "memory_hits": s.memory_hits, "tunes": s.tunes,
                  "correct": all(bool((y == 2.0 * x).all()) for y in outputs)}))
"""


def test_a_runtime_process_started_with_only_an_archive_directory_hits_without_tuning(store, tmp_path):
    publish_runtime_decision(store)
    ops.export_redis(store, tmp_path / "archives")
    script = tmp_path / "runtime.py"
    script.write_text(RUNTIME_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "archives")], capture_output=True, text=True,
                          env=farm_env(), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {"calls": {"validate": 1, "measure": 0}, "fleet_hits": 1, "memory_hits": 1, "tunes": 0,
                      "correct": True}


def test_a_non_persistent_environment_never_consults_the_archive(tmp_path):
    from fakes import FakeRunner

    policy = farm.StackPolicy(mode=farm.Mode.CACHE_ONLY)
    cands = [Candidate(n) for n in NAMES]
    persistent = Problem(Scope.OPERATOR, "scale", FP_A, "n=1", persistent=True)
    session = Problem(Scope.OPERATOR, "scale", FP_A, "n=2", persistent=False)
    entries = [arc.ArchiveEntry(make_record(cache_key(p, cands, 0, policy), created=time.time() - 60))
               for p in (persistent, session)]
    hand_archive(tmp_path, FP_A, entries)
    archives = arc.ArchiveStore(tmp_path)
    tuner = farm.StackTuner(policy, fleet=[archives])
    assert tuner.select(persistent, cands, 0, FakeRunner()).source is farm.DecisionSource.FLEET_CACHE
    assert archives.lookups == 1
    assert tuner.select(session, cands, 0, FakeRunner()).source is farm.DecisionSource.CACHE_MISS
    assert archives.lookups == 1


def test_an_archive_directory_path_is_a_fleet_source_of_the_controller(tmp_path):
    from fakes import FakeRunner

    policy = farm.StackPolicy(mode=farm.Mode.CACHE_ONLY)
    cands = [Candidate(n) for n in NAMES]
    problem = Problem(Scope.OPERATOR, "scale", FP_A, "n=1", persistent=True)
    hand_archive(tmp_path, FP_A, [arc.ArchiveEntry(make_record(cache_key(problem, cands, 0, policy),
                                                               created=time.time() - 60))])
    tuner = farm.StackTuner(policy, fleet=[str(tmp_path)])
    decision = tuner.select(problem, cands, 0, FakeRunner())
    assert (decision.source, decision.name) == (farm.DecisionSource.FLEET_CACHE, "fast")


def test_the_archive_tier_is_read_only_and_picks_by_the_replacement_rule_across_directories(tmp_path):
    key = key_for(FP_A, "n=1")
    hand_archive(tmp_path / "one", FP_A, [entry(key, verified=True, created=10.0, winner=1)])
    hand_archive(tmp_path / "two", FP_A, [entry(key, verified=False, created=20.0, winner=2)])
    hand_archive(tmp_path / "two", FP_B, [entry(key_for(FP_B, "n=1"), winner=2)])
    archives = arc.ArchiveStore(tmp_path / "one", tmp_path / "two")
    assert archives.get(key).name == "fast"
    assert archives.get(key_for(FP_A, "n=404")) is None
    assert archives.get(key_for(fields(["unknown"]), "n=1")) is None
    assert archives.get(key_for(FP_B, "n=1")).name == "other"
    assert archives.load() == 3
    with pytest.raises(farm.TuneFailure, match="read-only"):
        archives.put(make_record(key))
    archives.delete(key)
    assert archives.get(key).name == "fast"
    with pytest.raises(arc.ArchiveError, match="no such archive directory"):
        arc.ArchiveStore(tmp_path / "missing")


def test_a_corrupt_archive_is_a_cache_warning_for_the_runtime_never_an_error(tmp_path):
    key = key_for(FP_A, "n=1")
    folder = hand_archive(tmp_path, FP_A, [entry(key, created=time.time() - 60)])
    with open(folder / arc.DECISIONS_FILE, "r+b") as f:
        f.truncate(100)
    tuner = farm.StackTuner(farm.StackPolicy(mode=farm.Mode.CACHE_ONLY), fleet=[arc.ArchiveStore(tmp_path)])
    from fakes import FakeRunner

    problem = Problem(Scope.OPERATOR, "scale", FP_A, "n=1", persistent=True)
    decision = tuner.select(problem, [Candidate(n) for n in NAMES], 0, FakeRunner())
    assert decision.source is farm.DecisionSource.CACHE_MISS
    assert tuner.stats().cache_warnings == 1
