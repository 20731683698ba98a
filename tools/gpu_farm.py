"""The farm part of tools/gpu_check.py: a private redis-server, one ``farm worker`` on the device, ``farm tune`` of
the example catalog's problems for that device kind, ``farm archive export`` and ``farm status``; the embedded farm
when no redis-server can be had. Run by gpu_check.py as its own process group, so a stop at the part's limit takes
the worker and the server with it. Standard library only."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from gpu_check import ROOT, WHEELS, run_limited

FARM_POLICY = {"samples": 3, "warmups": 1, "budget": 2.0}


def farm_catalog(path: Path, kind: str) -> None:
    """examples/catalog.toml's problems for device ``kind`` with a short policy, written as TOML (all CUDA
    workloads; for ``cpu``, a smoke run of this part without a GPU, the first workload of each problem)."""
    catalog = tomllib.loads((ROOT / "examples" / "catalog.toml").read_text(encoding="utf-8"))
    lines = ["[policy]", *(f"{k} = {json.dumps(v)}" for k, v in FARM_POLICY.items()), ""]
    for problem in catalog["problems"]:
        if kind not in problem.get("devices", ()):
            continue
        workloads = problem["workloads"] if kind == "cuda" else problem["workloads"][:1]
        lines += ["[[problems]]", f"operation = {json.dumps(problem['operation'])}", f"devices = [{json.dumps(kind)}]", "workloads = ["]
        lines += ["  { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in w.items()) + " }," for w in workloads]
        lines += ["]", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")


def redis_binary() -> tuple[str, dict[str, str]] | None:
    """redis-server from the PATH, or one carried in .gpu-wheels/redis/ (with its libraries), or None."""
    found = shutil.which("redis-server")
    if found:
        return found, {}
    carried = WHEELS / "redis" / "redis-server"
    if carried.exists():
        libs = os.pathsep.join(filter(None, [str(carried.parent), os.environ.get("LD_LIBRARY_PATH", "")]))
        return str(carried), {"LD_LIBRARY_PATH": libs}
    return None


def farm_run(out: Path, limit: float, farm: str, device: str = "cuda:0") -> int:
    """The farm part with the ``farm`` script of the environment under test, for ``limit`` seconds."""
    deadline = time.monotonic() + limit
    kind = device.partition(":")[0]
    catalog = out / f"{kind}-catalog.toml"
    farm_catalog(catalog, kind)
    env = dict(os.environ, PYTHONUNBUFFERED="1", FARM_LOCK_DIR=str(out / "locks"))
    redis = redis_binary()
    port = _free_port()
    server = None
    if redis is not None:
        (out / "redis").mkdir(parents=True, exist_ok=True)
        with (out / "redis.log").open("wb") as rlog:
            server = subprocess.Popen([redis[0], "--port", str(port), "--bind", "127.0.0.1", "--dir", str(out / "redis"),
                                       "--save", "", "--appendonly", "no"], stdout=rlog, stderr=subprocess.STDOUT,
                                      env=dict(os.environ, **redis[1]))
        if not wait(lambda: _ping(port), min(deadline, time.monotonic() + 15)):
            print("gpu-check: redis-server did not answer (see redis.log)", flush=True)
            stop(server)
            server = None
    try:
        if server is None:
            print("gpu-check: no redis-server: the embedded farm tunes the catalog (no separate worker)", flush=True)
            tune = [farm, "tune", str(catalog), "--device", device, "--cache-dir", str(out / "cache")]
            export = [farm, "archive", "export", "--from-cache", str(out / "cache"), "--out", str(out / "archive")]
            return tune_and_export(tune, export, [], out, deadline, env)
        broker, store = f"redis://127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/1"
        with (out / "worker.log").open("wb") as wlog:
            worker = subprocess.Popen([farm, "worker", "--device", device, "--broker", broker, "--redis", store],
                                      stdout=wlog, stderr=subprocess.STDOUT, env=env, cwd=out)
        try:
            def ready() -> bool:
                return worker.poll() is not None or "ready" in (out / "worker.log").read_text(errors="replace")

            if not wait(ready, deadline - 30) or worker.poll() is not None:
                print(f"gpu-check: the worker was not ready (exit {worker.poll()}): see worker.log", flush=True)
                return 3
            tune = [farm, "tune", str(catalog), "--broker", broker, "--redis", store]
            export = [farm, "archive", "export", "--redis", store, "--out", str(out / "archive")]
            status = [farm, "status", "--redis", store, "--broker", broker, "--json"]
            return tune_and_export(tune, export, status, out, deadline, env)
        finally:
            stop(worker)
    finally:
        if server is not None:
            stop(server)


def tune_and_export(tune: list[str], export: list[str], status: list[str], out: Path, deadline: float,
                    env: dict[str, str]) -> int:
    """``farm tune`` (giving up on groups 45 s before the deadline), then the archive export and the status."""
    log = out / "farm.log"
    left = deadline - time.monotonic()
    code, _ = run_limited([*tune, "--timeout", f"{max(10.0, left - 45):.0f}", "--json"], log, deadline - 20, env,
                          stdout=out / "decisions.json")
    run_limited(export, log, deadline - 8, env)
    if status:
        run_limited(status, log, deadline, env, stdout=out / "status.json")
    return code if code is not None else 124


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(8)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def wait(condition: Callable[[], bool], deadline: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``deadline`` (monotonic) passes (False)."""
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def farm_summary(folder: Path) -> list[str]:
    """The farm run's decisions as a table (from ``farm tune --json``) and what was exported."""
    path = folder / "decisions.json"
    if not path.exists():
        return []
    lines = ["", "## Farm run", ""]
    try:
        decisions = json.loads(path.read_text(encoding="utf-8"))["decisions"]
    except (ValueError, KeyError, TypeError) as e:
        return lines + [f"decisions.json unreadable ({e}): see farm/farm.log"]
    lines += ["| operation | workload | winner | ratio | verified | error |", "|---|---|---|---:|---|---|"]
    for d in decisions:
        record = d.get("record") or {}
        spec = " ".join(f"{k}={v}" for k, v in (d.get("spec") or {}).items())
        ratio = f"{record['ratio']:.3f}" if isinstance(record.get("ratio"), (int, float)) else "-"
        lines.append(f"| {d.get('operation')} | {spec} | {record.get('name', '-')} | {ratio} | {record.get('verified', '-')} | "
                     f"{d.get('error') or '-'} |")
    exported = [p.name for p in sorted((folder / "archive").glob("*"))]
    lines += ["", f"{len(decisions)} decisions; archive exported: {', '.join(exported) or 'none'} (farm/archive/)"]
    return lines
