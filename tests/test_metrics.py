"""`farm metrics` (issue 15): a real exporter process against a private redis-server serves the farm's counters and
the fleet's live state in the Prometheus text format; a real fleet run through `farm tune` feeds the counters."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from farm_helpers import fleet, write_catalog
from prometheus_client.parser import text_string_to_metric_families
from servers import farm_env, free_port, wait_for

from farm.stores.base import DecisionRecord
from farm_coordinator.metrics import RunMetrics
from farm_fleet import presence
from farm_fleet.settings import Settings

pytestmark = pytest.mark.servers


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        assert response.status == 200
        text = response.read().decode()
    finally:
        connection.close()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@contextlib.contextmanager
def exporter(redis_url: str, broker_url: str, prefix: str, directory: Path) -> Iterator[int]:
    port = free_port()
    log = directory / f"metrics-{port}.log"
    args = [sys.executable, "-m", "farm_cli", "metrics", "--redis", redis_url, "--broker", broker_url,
            "--port", str(port)]
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=farm_env({"FARM_PREFIX": prefix}),
                                   start_new_session=True)

    def answers() -> bool:
        if process.poll() is not None:
            pytest.fail(f"farm metrics exited with {process.returncode}: {log.read_text()}")
        try:
            scrape(port)
            return True
        except OSError:
            return False

    try:
        wait_for(answers, 60, "farm metrics to answer")
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)


def test_the_exporter_serves_counters_workers_and_queue_depths(redis_srv, tmp_path):
    prefix = f"t{uuid.uuid4().hex[:8]}"
    settings = Settings.from_env({"FARM_PREFIX": prefix}, broker_url=redis_srv.url(0), redis_url=redis_srv.url(1))
    client, broker = redis_srv.client(1), redis_srv.client(0)
    now = time.time()
    for i, state in enumerate((presence.HEALTHY, presence.HEALTHY, presence.QUARANTINED)):
        presence.announce(client, settings, presence.WorkerInfo(
            f"w{i}", "host", f"cpu:{i}", "cpu", "fp1", "CPU", "0.1.0", state, 100 + i, now, f"farm.worker.w{i}"))
    broker.rpush(settings.fingerprint_queue("fp1"), "task-a", "task-b")
    counted = RunMetrics(client, settings)
    record = DecisionRecord("k", 1, 0, "fast", True, 0.5, now, {"confirmation": "confirmation failed: noisy"})
    counted.started("run1", 4, 1, 10)
    counted.compiled(4.5)
    counted.problem_done("published", SimpleNamespace(record=record, trial_seconds=2.5, device_seconds=1.25))
    counted.problem_done("failed", SimpleNamespace(record=None, trial_seconds=0.5, device_seconds=0.25))
    with exporter(settings.redis_url, settings.broker_url, prefix, tmp_path) as port:
        seen = scrape(port)
    assert seen[("farm_up", ())] == 1
    assert seen[("farm_decisions_published_total", ())] == 1
    assert seen[("farm_decisions_failed_total", ())] == 1
    assert seen[("farm_decisions_reused_total", ())] == 1
    assert seen[("farm_trial_seconds_total", ())] == 3.0
    assert seen[("farm_device_seconds_total", ())] == 1.5  # a failed problem's searches cost too
    assert seen[("farm_compile_seconds_total", ())] == 4.5
    assert seen[("farm_confirmations_total", (("result", "failed"),))] == 1
    assert seen[("farm_workers", (("fingerprint", "fp1"), ("state", presence.HEALTHY)))] == 2
    assert seen[("farm_workers", (("fingerprint", "fp1"), ("state", presence.QUARANTINED)))] == 1
    assert seen[("farm_queue_depth", (("fingerprint", "fp1"),))] == 2


def test_a_redis_that_goes_away_while_serving_is_farm_up_0_not_a_failed_scrape(tmp_path):
    from servers import redis_server

    with redis_server(tmp_path / "redis") as server, exporter(server.url(1), server.url(0), "tgone", tmp_path) as port:
        assert scrape(port)[("farm_up", ())] == 1
        server.process.terminate()
        server.process.wait(20)
        assert scrape(port)[("farm_up", ())] == 0


def test_farm_metrics_with_redis_down_at_start_exits_2_with_one_line_naming_the_server(tmp_path):
    dead = f"redis://127.0.0.1:{free_port()}"
    done = subprocess.run([sys.executable, "-m", "farm_cli", "metrics", "--redis", f"{dead}/1", "--port",
                           str(free_port())], capture_output=True, text=True, env=farm_env(), timeout=60)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("farm: error: cannot reach Redis at 127.0.0.1:") and "--redis" in line


def test_farm_metrics_on_a_port_in_use_names_the_address(redis_srv, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "farm_cli", "metrics", "--redis", redis_srv.url(1), "--port",
                               str(port)], capture_output=True, text=True, env=farm_env(), timeout=60)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"farm: error: cannot serve metrics on 127.0.0.1:{port}: ") and "--port" in line


def test_a_fleet_run_through_farm_tune_is_counted(redis_srv, tmp_path):
    with fleet(redis_srv, tmp_path / "fleet", ("cpu:0",)) as f:
        catalog = write_catalog(tmp_path / "c.toml", """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 500, dtype = "float64" }, { n = 9, dtype = "float64" }]
""")
        args = [sys.executable, "-m", "farm_cli", "tune", str(catalog), "--broker", f.broker, "--redis",
                f.results_url, "--kernels", "farm_testops", "--json"]
        done = subprocess.run(args, capture_output=True, text=True, env=f.env, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr
        ran = json.loads(done.stdout)
        again = subprocess.run(args, capture_output=True, text=True, env=f.env, cwd=tmp_path, timeout=300)
        assert again.returncode == 0, again.stderr
        with exporter(f.results_url, f.broker, f.settings.prefix, tmp_path) as port:
            seen = wait_for(lambda: (s := scrape(port)) and s.get(("farm_decisions", (("fingerprint", _digest(f)),)))
                            and s, 30, "the exporter to see the decisions")
    assert seen[("farm_decisions_published_total", ())] == 2
    assert seen[("farm_decisions_reused_total", ())] == 2
    assert seen[("farm_trial_seconds_total", ())] > 0
    assert seen[("farm_confirmations_total", (("result", "unconfirmed"),))] >= 1
    # Device seconds are the cost: each published decision records its groups' (host CPU time on a cpu worker),
    # the run's summary and the counter add them up; a CPU run has no compile stage to charge.
    spent = [d["record"]["meta"]["device_seconds"] for d in ran["decisions"]]
    assert len(spent) == 2 and all(s > 0 for s in spent)
    assert ran["device_seconds"] == pytest.approx(sum(spent))
    assert seen[("farm_device_seconds_total", ())] == pytest.approx(sum(spent))
    assert seen[("farm_compile_seconds_total", ())] == 0


def _digest(f) -> str:
    return presence.live_workers(f.client(), f.settings)[0].fingerprint


def test_the_scrape_config_and_the_dashboard_use_only_metrics_that_exist():
    import json
    import re

    import yaml

    root = Path(__file__).resolve().parent.parent
    config = yaml.safe_load((root / "docker" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["farm-metrics"]["static_configs"][0]["targets"] == ["127.0.0.1:9808"]  # `farm metrics`' default
    dashboard = json.loads((root / "docker" / "grafana" / "farm-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in re.findall(r"\b((?:farm|flower)_[a-z_]+)\b", e)}
    exported = {"farm_up", "farm_decisions_published_total", "farm_decisions_failed_total",
                "farm_decisions_reused_total", "farm_trial_seconds_total", "farm_confirmations_total", "farm_workers",
                "farm_queue_depth", "farm_decisions", "farm_runs", "flower_events_total"}
    assert used and used <= exported, used - exported
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
