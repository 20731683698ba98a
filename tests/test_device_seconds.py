"""Device seconds are the cost (SEMANTICS, round 4): every farm search reports the seconds its runs took on the
devices and the seconds its compile stage charged: in each group result (``GroupResult.device_seconds``), in the
published decision's meta, in `farm tune`'s closing summary, in `farm report` and in `farm metrics`' counters."""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
from dataclasses import replace

import pytest
from rich.console import Console
from servers import farm_env
from test_replay_farm import POLICY, write_recording

from farm.errors import ProtocolError
from farm.replay import load
from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore
from farm_cli.parts import embedded_parts
from farm_coordinator.catalog import load_catalog
from farm_coordinator.precompile import stage
from farm_coordinator.run import RunOptions, tune
from farm_coordinator.runview import ConsoleObserver
from farm_fleet.protocol import STATUS_OK, GroupResult
from farm_fleet.settings import Settings

RESULT = GroupResult("run", "pid", "g0", STATUS_OK, cache_key="k", names=("ref", "fast"), reference_times=(1.0,),
                     trial_seconds=0.5, search_seconds=0.25, device_seconds=0.125)


def test_a_group_result_carries_its_device_seconds_across_the_wire():
    assert GroupResult.from_dict(json.loads(json.dumps(RESULT.to_dict()))) == RESULT
    old = RESULT.to_dict()
    del old["device_seconds"]  # a worker of the build before: no cost, never a refusal
    assert GroupResult.from_dict(old).device_seconds == 0.0
    assert GroupResult.from_dict({**RESULT.to_dict(), "device_seconds": 3}).device_seconds == 3.0


@pytest.mark.parametrize(("value", "why"), [
    (-0.5, "is not a finite number of seconds >= 0"),
    (math.nan, "is not a finite number of seconds >= 0"),
    (math.inf, "is not a finite number of seconds >= 0"),
    (10 ** 400, "is not a finite number of seconds >= 0"),
    ("1.5", "has the wrong type"),
    (True, "has the wrong type"),
    (None, "has the wrong type"),
    ([1.0], "has the wrong type"),
])
def test_a_group_result_with_device_seconds_that_are_no_seconds_is_refused_naming_the_field(value, why):
    with pytest.raises(ProtocolError) as e:
        GroupResult.from_dict({**RESULT.to_dict(), "device_seconds": value})
    assert str(e.value).startswith("message field 'device_seconds' = ") and why in str(e.value)


@pytest.fixture
def recording(tmp_path):
    folder = tmp_path / "recordings"
    folder.mkdir()
    path = write_recording(folder / "vector_add_A.json", "GPU A", (64, 4, 0), 1)
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(POLICY + '[[problems]]\nrecording = "recordings/vector_add_A.json"\n')
    return path, catalog


def recorded_compile_seconds(path) -> float:
    return sum(c.compile_seconds for c in load(path).configs.values())


def test_a_published_decision_records_its_groups_device_seconds_and_its_charged_compile_seconds(recording, tmp_path):
    path, catalog = recording
    settings = Settings.from_env({})
    devices = (f"replay:{path}#0", f"replay:{path}#1")  # two devices of one fingerprint: the winner is confirmed
    parts = replace(embedded_parts(settings, devices, tmp_path / "cache", ()),
                    precompile=stage(lambda jobs: pytest.fail("no CUDA target: nothing to compile")),
                    observer=ConsoleObserver(Console(file=io.StringIO())))
    summary = tune(load_catalog(catalog), parts, settings, RunOptions(run="r1"))

    (agg,) = summary.aggregates
    assert agg.record is not None and agg.confirmation is not None
    groups = [r.device_seconds for r in agg.results.values()]
    assert all(seconds > 0 for seconds in groups) and agg.confirmation.device_seconds > 0
    meta = agg.record.meta
    assert meta["device_seconds"] == pytest.approx(sum(groups) + agg.confirmation.device_seconds)
    assert meta["compile_seconds"] == pytest.approx(recorded_compile_seconds(path))  # the compile stage's charge
    assert (summary.device_seconds, summary.compile_seconds) == pytest.approx(
        (meta["device_seconds"], meta["compile_seconds"]))
    (stored,) = [DecisionRecord.from_json(t) for batch in LocalStore(tmp_path / "cache").scan() for t, _, _ in batch]
    assert (stored.meta["device_seconds"], stored.meta["compile_seconds"]) == (
        meta["device_seconds"], meta["compile_seconds"])


def farm(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", *args], capture_output=True, text=True,
                          env=farm_env({"COLUMNS": "400"}), cwd=cwd, timeout=300)


def test_farm_tune_states_the_runs_cost_and_farm_report_shows_each_decisions(recording, tmp_path):
    path, catalog = recording
    # A sampled search (a partial one) gets its effort line under the table, with its cost.
    catalog.write_text(catalog.read_text().replace("[policy]\n", '[policy]\nstrategy = "random"\nmax_configs = 12\n'))
    cache = tmp_path / "cache"
    done = farm("tune", str(catalog), "--device", f"replay:{path}", "--cache-dir", str(cache), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (record,) = [DecisionRecord.from_json(t) for batch in LocalStore(cache).scan() for t, _, _ in batch]
    device, compiled = record.meta["device_seconds"], record.meta["compile_seconds"]
    assert device > 0 and compiled == pytest.approx(recorded_compile_seconds(path))
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("cost: ")]
    assert line == f"cost: device {device:.1f} s, compile {compiled:.1f} s (recorded with each decision)"
    assert re.search(rf"evaluated \d+ of \d+ configs.*; device {device:.1f} s, compile {compiled:.1f} s",
                     " ".join(done.stdout.split())), done.stdout

    again = farm("tune", str(catalog), "--device", f"replay:{path}", "--cache-dir", str(cache), "--json",
                 cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)  # reused, not searched again: no device seconds, the stage charged again
    assert data["device_seconds"] == 0 and data["compile_seconds"] == pytest.approx(compiled)

    exported = farm("archive", "export", "--from-cache", str(cache), "--out", str(tmp_path / "archive"), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    out = tmp_path / "report.html"
    written = farm("report", "--archive", str(tmp_path / "archive"), "--out", str(out), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    page = out.read_text()
    assert f'"device_seconds":{json.dumps(device)}' in page and f'"compile_seconds":{json.dumps(compiled)}' in page
    assert "searches cost" in page and "device ${fmt(p.device_seconds,2)} s" in page
