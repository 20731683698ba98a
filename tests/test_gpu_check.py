"""tools/gpu_check.py (``python3 tools/dev.py gpu-check``) and bench/gpu.py, exercised without a GPU: the dry run's
plan, a part stopped at its limit keeping its output, the farm part end to end on a CPU worker (real redis-server
and ``farm worker``), the benchmark's code paths on the host client, and a GPU-less pytest part not passing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from servers import IN_CI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402
import gpu_farm  # noqa: E402


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_the_dry_run_prints_every_part_with_its_limit_within_eight_minutes_and_runs_nothing(tmp_path) -> None:
    out = tmp_path / "report"
    done = run("tools/dev.py", "gpu-check", "--dry-run", "--out", str(out))
    assert done.returncode == 0, done.stderr
    limits = {name: float(s) for name, s in re.findall(r"^\[(\w+)\] at most (\d+) s$", done.stdout, re.M)}
    assert list(limits) == ["setup", "pytest", "bench", "farm"]
    assert sum(limits.values()) <= 480 and "at most 480 s in all" in done.stdout
    for needle in ("-m pytest -m gpu", "tests/test_gpu_runtime.py", "bench/gpu.py --require-device --out", "farm worker --device cuda:0",
                   "farm archive export", "cupy-cuda12x", "redis-server"):
        assert needle in done.stdout, needle
    assert not out.exists()


def test_a_part_past_its_limit_is_stopped_with_its_process_group_and_keeps_its_output(tmp_path) -> None:
    log, pid_file = tmp_path / "part.log", tmp_path / "child.pid"
    script = f"echo measured-1; sleep 60 & echo $! > {pid_file}; wait"
    code, why = gpu_check.run_limited(["sh", "-c", script], log, time.monotonic() + 1.5)
    assert (code, why) == (None, "timed out")
    text = log.read_text()
    assert "measured-1" in text and "stopped at its time limit" in text
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the part's child {child} outlived the stop")


@pytest.mark.servers
def test_the_farm_part_publishes_and_exports_decisions_with_a_real_worker(tmp_path) -> None:
    if shutil.which("redis-server") is None:
        (pytest.fail if IN_CI else pytest.skip)("redis-server is not installed")
    out = tmp_path / "farm"
    done = run("tools/gpu_check.py", "--python", sys.executable, "--out", str(out), "--farm-part", "150", "--farm-device", "cpu:0")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:] + (out / "worker.log").read_text()[-3000:]
    decisions = json.loads((out / "decisions.json").read_text())["decisions"]
    assert len(decisions) == 5 and all(d["record"] and not d["error"] for d in decisions)
    exported = list((out / "archive").iterdir())
    assert len(exported) == 1 and any(exported[0].iterdir())
    assert json.loads((out / "status.json").read_text())
    table = "\n".join(gpu_farm.farm_summary(out))
    assert "5 decisions; archive exported" in table and "| matmul |" in table


def test_without_a_redis_server_the_farm_part_runs_the_embedded_farm_and_exports(tmp_path) -> None:
    if (gpu_check.WHEELS / "redis").exists():
        pytest.skip("a carried redis-server is in .gpu-wheels/")
    out = tmp_path / "farm"
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # no redis-server on it
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--python", sys.executable, "--out", str(out), "--farm-part",
                           "150", "--farm-device", "cpu:0"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "the embedded farm tunes the catalog" in done.stdout
    assert len(json.loads((out / "decisions.json").read_text())["decisions"]) == 5
    assert len(list((out / "archive").iterdir())) == 1 and not (out / "worker.log").exists()


def test_the_gpu_benchmark_runs_its_parts_on_the_host_client_and_stops_at_its_deadline(tmp_path) -> None:
    out = tmp_path / "bench"
    args = ("bench/gpu.py", "--device", "cpu", "--operation", "transpose", "--samples", "3", "--budget", "0.2")
    done = run(*args, "--out", str(out), "--deadline", "60")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "bench.jsonl").read_text().splitlines()]
    assert [r["part"] for r in rows[:2]] == ["device", "overhead"]
    assert rows[1]["end_to_end_s"] > 0 and rows[1]["device_s"] > 0 and rows[1]["kernel_s"] > 0
    winners = [r for r in rows if r["part"] == "winner"]
    assert len(winners) == 9 and all(r["ratio"] > 0 and not r.get("skipped") for r in winners)
    assert "| transpose |" in (out / "bench.md").read_text()
    stopped = tmp_path / "stopped"
    done = run(*args, "--out", str(stopped), "--deadline", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipped (deadline)" in (stopped / "bench.md").read_text()


def test_without_a_gpu_the_pytest_part_is_not_a_pass_and_the_report_is_written(tmp_path) -> None:
    out = tmp_path / "report"
    done = run("tools/gpu_check.py", "--python", sys.executable, "--only", "pytest", "--out", str(out))
    summary = json.loads((out / "summary.json").read_text())
    [part] = summary["parts"]
    if "cupy" in sys.modules or gpu_check.shutil.which("nvidia-smi"):
        pytest.skip("a GPU may be present here")
    assert done.returncode == 1 and part["status"] == "failed (skipped GPU tests)", part
    assert "skipped" in part["note"] and (out / "summary.md").read_text().startswith("# GPU check")
