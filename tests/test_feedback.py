"""Fleet feedback (docs/farm.md, "Fleet feedback"), with real processes: a private redis-server, a pinned `farm
worker`, application processes with the fleet as a decision source, and `farm tune --from-fleet`.

An application that misses reports it; the farm tunes what was reported and a fresh application is served the
decision. A regression an application reports makes the farm re-measure the problem and publish a new verdict.
An unreachable Redis costs the application nothing: its calls return, the failure and drop counters move.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import redis
from fakes import FakeRunner, candidates, problem
from farm_helpers import POLICY, WORKER_ENV, Fleet, write_catalog
from redis.backoff import NoBackoff
from redis.retry import Retry
from servers import ROOT, TESTS, farm_env, free_port, start_worker, wait_for, wait_worker_ready

import farm
from farm.feedback import FleetReporter, stream_key
from farm.stores.memory import MemoryStore
from farm_coordinator.feedback import plan, read_reports, waiting
from farm_coordinator.metrics import FarmCollector
from farm_fleet.settings import Settings
from farm_kernels import registry

KERNELS = ("farm_feedbackops",)
SPEC = {"n": 3000, "dtype": "float64"}


# ------------------------------------------------------------------------------ specs rebuilt from inputs


BUILTIN_SPECS = {
    "matmul": [dict(m=5, n=7, k=3, dtype="float32", layout=layout)
               for layout in ("contiguous", "a_transposed", "b_transposed", "transposed", "strided")],
    "softmax": [dict(rows=4, cols=9, dtype="float64", layout=layout) for layout in ("contiguous", "transposed", "strided")],
    "reduce_sum": [dict(rows=4, cols=9, axis=0, dtype="float32", layout=layout)
                   for layout in ("contiguous", "transposed", "strided")],
    "transpose": [dict(rows=4, cols=9, dtype="float32", layout=layout) for layout in ("contiguous", "strided")],
    "bias_gelu_fusion": [dict(rows=4, cols=9, dtype="float64", layout=layout)
                         for layout in ("contiguous", "transposed", "strided")],
}


@pytest.mark.parametrize("name", sorted(BUILTIN_SPECS))
def test_every_builtin_operation_rebuilds_the_spec_of_the_inputs_it_built(name):
    registry.ensure_loaded()
    op = registry.get(name)
    client = farm.HostClient(0)
    for spec in BUILTIN_SPECS[name]:
        expected = op.normalize(spec)
        del expected["seed"]
        assert op.spec_from_inputs(op.build(spec, client), "cpu") == expected
        assert op.host is not None and op.host.spec_from_inputs is not None
        assert op.host.spec_from_inputs(op.build({**spec, "seed": 7}, client)) == expected


def test_inputs_that_match_no_spec_give_none_never_an_error():
    registry.ensure_loaded()
    softmax = registry.get("softmax")
    odd = np.zeros((6, 12))[::2, ::3]  # a view with other strides: no layout of the schema
    assert softmax.spec_from_inputs((odd,), "cpu") is None
    assert softmax.spec_from_inputs((np.zeros((4, 4), dtype=np.int8),), "cpu") is None
    assert registry.get("matmul").spec_from_inputs((np.zeros((2, 3)), np.zeros((4, 2))), "cpu") is None


# ------------------------------------------------------------------------------ an unreachable Redis


def test_an_unreachable_redis_costs_the_application_nothing():
    reporter = FleetReporter(f"redis://127.0.0.1:{free_port()}/0", capacity=2, timeout=0.5)
    tuner = farm.StackTuner(farm.StackPolicy(warmups=1, samples=3), fleet=[MemoryStore(16)])
    tuner.feedback = reporter
    runner = FakeRunner({0: 1.0, 1: 0.5, 2: 2.0})
    for i in range(6):  # six workloads, each a fleet miss: every call returns its decision normally
        decision = tuner.select(problem(workload=f"f32[{i}]", persistent=True), candidates(), 0, runner)
        assert decision.source is farm.DecisionSource.TUNED and decision.name == "a"
        assert tuner.select(problem(workload=f"f32[{i}]", persistent=True), candidates(), 0, runner).source is farm.DecisionSource.MEMORY_CACHE
    wait_for(lambda: reporter.stats().failures >= 1, 30, "the reporter to count a failed send")
    stats = reporter.stats()
    # Six reports, room for two in the buffer and at most two in flight: the rest were dropped and counted.
    assert stats.sent == 0 and stats.dropped >= 2 and stats.pending <= 2
    assert stats.unsigned == 6  # no runtime adapter described these keys: signature only
    reporter.close()


def test_a_hit_and_a_tuner_without_a_fleet_never_report():
    calls: list[tuple] = []
    tuner = farm.StackTuner(farm.StackPolicy(warmups=1, samples=3))
    tuner.feedback = lambda *a: calls.append(a)
    tuner.select(problem(), candidates(), 0, FakeRunner({0: 1.0, 1: 0.5, 2: 2.0}))
    assert calls == []  # no fleet source: nothing the fleet could have served
    fleet_tuner = farm.StackTuner(farm.StackPolicy(warmups=1, samples=3), fleet=[MemoryStore(16)])
    fleet_tuner.feedback = lambda *a: calls.append(a)
    runner = FakeRunner({0: 1.0, 1: 0.5, 2: 2.0})
    first = fleet_tuner.select(problem(persistent=True), candidates(), 0, runner)
    fleet_tuner.select(problem(persistent=True), candidates(), 0, runner)  # a memory hit
    assert [c[0] for c in calls] == ["miss"] and calls[0][1] == first.cache_key and calls[0][3] == (first.ratio,)
    for _ in range(fleet_tuner.policy.regression_pairs):
        fleet_tuner.record_comparison(first, 1.0, 3.0, True)
    assert [c[0] for c in calls] == ["miss", "regression"] and calls[1][3] == (3.0, first.ratio)


# ------------------------------------------------------------------------------ the ACL's reporter user


def test_the_reporter_user_may_only_append_to_the_reports_stream(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed")
    writer, reporter = secrets.token_hex(16), secrets.token_hex(16)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "REDIS_WRITER_USER": "farm", "REDIS_WRITER_PASSWORD": writer,
           "REDIS_REPORTER_USER": "reporter", "REDIS_REPORTER_PASSWORD": reporter, "FARM_PREFIX": "fb",
           "REDIS_ACL_FILE": str(tmp_path / "acl" / "users.acl")}
    port = free_port()
    process = subprocess.Popen(
        ["sh", str(ROOT / "docker" / "redis-entrypoint.sh"), str(ROOT / "docker" / "redis" / "decisions.conf"),
         "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--daemonize", "no"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def client(user: str, password: str) -> redis.Redis:
            return redis.Redis(host="127.0.0.1", port=port, username=user, password=password, decode_responses=True,
                               socket_timeout=10, retry=Retry(NoBackoff(), 0))

        def up() -> bool:
            try:
                return bool(client("farm", writer).ping())
            except redis.ConnectionError:
                return False

        wait_for(up, 20, "redis-server with the ACL to answer")
        admin = client("farm", writer)
        admin.hset("fb:decisions:abc", "k", "secret")
        admin.set("fb:other", "x")
        app = client("reporter", reporter)
        assert app.xadd("fb:feedback", {"report": "{}"}, maxlen=100, approximate=True)
        for call, args in ((app.hget, ("fb:decisions:abc", "k")), (app.get, ("fb:other",)),
                           (app.xrange, ("fb:feedback",)), (app.xadd, ("fb:other-stream", {"a": "b"})),
                           (app.xdel, ("fb:feedback", "0-1")), (app.hgetall, ("fb:decisions:abc",))):
            with pytest.raises(redis.exceptions.NoPermissionError):
                call(*args)
        # The reporter of the core, with these credentials, delivers.
        sender = FleetReporter(f"redis://reporter:{reporter}@127.0.0.1:{port}/0", prefix="fb")
        sender("miss", "key", problem(), (0.5,))
        assert sender.flush(20)
        assert admin.xlen("fb:feedback") == 2 and sender.stats().sent == 1
        sender.close()
    finally:
        process.terminate()
        process.wait(10)


# ------------------------------------------------------------------------------ the loop, with real processes


@pytest.fixture
def feedback_fleet(redis_srv, tmp_path):
    prefix = f"fb{secrets.token_hex(4)}"
    redis_srv.client(0).flushall()
    env = farm_env({**WORKER_ENV, "FARM_PREFIX": prefix, "FARM_TEST_DEGRADED_FILE": str(tmp_path / "degraded")})
    settings = Settings.from_env(env, broker_url=redis_srv.url(0), redis_url=redis_srv.url(1))
    f = Fleet(redis_srv, settings, tmp_path, env)
    worker = start_worker("cpu:0", f.broker, f.results_url, tmp_path, env, kernels=KERNELS)
    f.workers.append(worker)
    try:
        wait_worker_ready(worker, f.client(), prefix)
        yield f
    finally:
        worker.stop()


def application(f: Fleet, catalog: Path, workloads: list, regress: bool = False) -> dict:
    arg = {"cpus": [0], "catalog": str(catalog), "redis": f.results_url, "report": f.results_url,
           "workloads": workloads, "regress": regress}
    done = subprocess.run([sys.executable, str(TESTS / "feedback_app.py"), json.dumps(arg)], capture_output=True,
                          text=True, env=f.env, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    answer: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def farm_cli(f: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", *args, "--broker", f.broker, "--redis", f.results_url],
                          capture_output=True, text=True, env={**f.env, "COLUMNS": "250"}, timeout=300)


def tune_from_fleet(f: Fleet, catalog: Path) -> subprocess.CompletedProcess[str]:
    return farm_cli(f, "tune", "--from-fleet", str(catalog), "--kernels", KERNELS[0])


@pytest.mark.servers
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins the application to CPU 0")
def test_a_reported_miss_is_tuned_by_the_farm_and_served_to_a_fresh_application(feedback_fleet, tmp_path):
    f = feedback_fleet
    catalog = write_catalog(tmp_path / "policy.toml", "")
    first = application(f, catalog, [["feedbacktest_scale", SPEC], ["feedbacktest_unsigned", SPEC]])
    assert [d["source"] for d in first["decisions"]] == ["TUNED", "TUNED"]  # nothing published yet: both missed
    assert first["flushed"] and first["stats"]["sent"] == 2 and first["stats"]["unsigned"] == 1

    reports, _ = read_reports(f.client(), f.settings)
    assert {(r.kind, r.operation, json.dumps(r.spec, sort_keys=True)) for r in reports} == {
        ("miss", "feedbacktest_scale", json.dumps(SPEC, sort_keys=True)), ("miss", "feedbacktest_unsigned", "null")}
    entries, untunable = plan(reports, KERNELS)
    assert [(e.operation, e.spec) for e in entries] == [("feedbacktest_scale", SPEC)]
    assert list(untunable) == ["feedbacktest_unsigned: no workload spec (signature only)"]
    status = farm_cli(f, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["feedback"]["total"] == 2
    table = farm_cli(f, "status")
    assert table.returncode == 0, table.stderr
    assert "fleet reports waiting (2" in table.stdout and "feedbacktest_unsigned" in table.stdout

    done = tune_from_fleet(f, catalog)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 of 1 reported problems decided; 1 reports acknowledged" in done.stdout
    assert "signature only" in done.stdout
    left, _ = read_reports(f.client(), f.settings)
    assert [r.operation for r in left] == ["feedbacktest_unsigned"]  # not tunable: it stays, visible

    fresh = application(f, catalog, [["feedbacktest_scale", SPEC]])
    (served,) = fresh["decisions"]
    assert served["source"] == "FLEET_CACHE" and served["name"] == "vectorized"
    assert served["cache_key"] == first["decisions"][0]["cache_key"]
    assert fresh["stats"]["queued"] == 0  # a hit reports nothing


@pytest.mark.servers
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins the application to CPU 0")
def test_a_reported_regression_makes_the_farm_re_measure_and_republish(feedback_fleet, tmp_path):
    f = feedback_fleet
    catalog = write_catalog(tmp_path / "policy.toml", "")
    application(f, catalog, [["feedbacktest_scale", SPEC]])
    assert tune_from_fleet(f, catalog).returncode == 0
    digest = read_fingerprint(f)
    (before,) = published(f, digest)

    regressed = application(f, catalog, [["feedbacktest_scale", SPEC]], regress=True)
    (row,) = regressed["decisions"]
    assert row["source"] == "FLEET_CACHE" and row["regressed"] is True
    (report,) = read_reports(f.client(), f.settings)[0]
    assert report.kind == "regression" and report.ratios[0] == 3.0 and report.fingerprint == digest
    assert waiting(f.client(), f.settings)["by"][0]["kind"] == "regression"

    done = tune_from_fleet(f, catalog)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "regression reported by 1 host(s)" in done.stdout
    (after,) = published(f, digest)
    assert after["cache_key"] == before["cache_key"] and after["created"] > before["created"]  # re-measured
    assert "-fleet-regression-" in after["meta"]["run"] and "-fleet-miss-" in before["meta"]["run"]
    assert f.client().xlen(stream_key(f.settings.prefix)) == 0

    # The HTML report of the fleet's decisions lists the problem as re-tuned, with the reason.
    exported = farm_cli_redis(f, "archive", "export", "--out", str(tmp_path / "archive"))
    assert exported.returncode == 0, exported.stderr
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "farm_cli", "report", "--archive", str(tmp_path / "archive"),
                           "--out", str(out)], capture_output=True, text=True, env=f.env, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', out.read_text(),
                                re.S).group(1))
    (fingerprint,) = data
    (retuned,) = fingerprint["retuned"]
    assert retuned["operation"] == "feedbacktest_scale" and "regression" in retuned["reason"]


# Bans are under test here, not noise: "degrading" takes microseconds, and on a loaded 2-core machine its pairs can
# spread past the usual relaxed noise limit, which would leave it undecided and publish "steady" for a reason
# that has nothing to do with bans.
BANS_POLICY = POLICY.replace("max_relative_mad = 1.0", "max_relative_mad = 100.0")


@pytest.mark.servers
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins the application to CPU 0")
def test_a_regression_the_farm_confirms_bans_the_old_winner_for_that_key(feedback_fleet, tmp_path):
    f = feedback_fleet
    spec = {"n": 3000, "dtype": "float64"}
    catalog = write_catalog(tmp_path / "policy.toml", "", BANS_POLICY)
    application(f, catalog, [["feedbacktest_degrading", spec]])
    assert tune_from_fleet(f, catalog).returncode == 0
    digest = read_fingerprint(f)
    (before,) = published(f, digest)
    assert before["name"] == "degrading"

    (tmp_path / "degraded").touch()  # the old winner now regresses on the farm's devices too
    application(f, catalog, [["feedbacktest_degrading", spec]], regress=True)
    done = tune_from_fleet(f, catalog)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "degrading banned for this key: regressed on the farm too" in done.stdout
    (after,) = published(f, digest)
    assert after["cache_key"] == before["cache_key"] and after["name"] == "steady"
    status = json.loads(farm_cli(f, "status", "--json").stdout)
    (ban,) = status["bans"]
    assert ban["candidate"] == "degrading" and ban["problem_id"] == after["meta"]["problem_id"]
    families = {m.name: m for m in FarmCollector(f.client(), f.settings).collect()}
    assert [(s.labels, s.value) for s in families["farm_fleet_bans"].samples] == [({"fingerprint": digest}, 1.0)]

    # The ban holds for the key even when the candidate is fast again: a forced run of the same workload from a
    # catalog plans it as skipped, and the fleet keeps serving the other winner.
    (tmp_path / "degraded").unlink()
    workload = write_catalog(tmp_path / "degrading.toml", '[[problems]]\noperation = "feedbacktest_degrading"\n'
                             'devices = ["cpu"]\nworkloads = [{ n = 3000, dtype = "float64" }]\n', BANS_POLICY)
    forced = farm_cli(f, "tune", str(workload), "--kernels", KERNELS[0], "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    (again,) = published(f, digest)
    assert again["meta"]["problem_id"] == after["meta"]["problem_id"] and again["created"] > after["created"]
    assert again["name"] == "steady"
    notes = {c["name"]: c["note"] for c in again["meta"]["candidates"]}
    assert "banned for this key" in notes["degrading"]

    # `farm unban` lifts it: the next forced run may choose it again.
    lifted = subprocess.run([sys.executable, "-m", "farm_cli", "unban", ban["problem_id"], "degrading", "--redis",
                             f.results_url], capture_output=True, text=True, env=f.env, timeout=60)
    assert lifted.returncode == 0 and "1 ban(s) lifted" in lifted.stdout, lifted.stdout + lifted.stderr
    assert json.loads(farm_cli(f, "status", "--json").stdout)["bans"] == []
    assert farm_cli(f, "tune", str(workload), "--kernels", KERNELS[0], "--force").returncode == 0
    (freed,) = published(f, digest)
    assert freed["name"] == "degrading"


def farm_cli_redis(f: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", *args, "--redis", f.results_url], capture_output=True,
                          text=True, env=f.env, timeout=300)


def read_fingerprint(f: Fleet) -> str:
    (digest,) = f.client().hkeys(f.settings.fingerprints_key)
    return str(digest)


def published(f: Fleet, digest: str) -> list[dict]:
    return [json.loads(raw) for raw in f.client().hvals(f.settings.decisions_key(digest))]
