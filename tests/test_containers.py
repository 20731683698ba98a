"""The container tier: the real images and the compose stack, on a real Docker Engine (CPU override, no GPU).

Builds docker/*.Dockerfile from the engine's local base images, brings compose.yaml + compose.cpu.yaml up (two
Redis servers with ACL users from an env file, two CPU workers, Flower), tunes the example catalog's host problems
with `farm tune` in the coordinator container, kills a worker mid-run, checks Flower's authentication, restarts
the decisions Redis with SIGKILL and finds every decision in its append-only file, then `compose down -v`.

The engine and the base images come from the environment, as `../shared/containers/engine.sh up` (or `env`)
prints them: DOCKER_HOST (and DOCKER_CONFIG, DOCKER_BUILDKIT), FARM_TEST_PYTHON_IMAGE (Python 3.11, a venv at
/opt/venv on PATH), FARM_TEST_REDIS_IMAGE (redis-server 7). Without them the tier is skipped, except when
CI=true: then it fails. `.ci/run` starts the engine before the suite.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import subprocess
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from servers import IN_CI, free_port, wait_for

from farm_fleet import presence
from farm_fleet.settings import Settings

pytestmark = [pytest.mark.containers, pytest.mark.timeout(900)]  # a first build downloads every wheel

ROOT = Path(__file__).resolve().parent.parent
HOST = "ci"  # FARM_HOST_NAME: workers ci-gpu0 and ci-gpu1 (container host names), each on its cpu:0
# Small limits: a task lost with a killed worker is restored to the queue after the visibility timeout (it must
# outlast the example policy's hard limit: budget 10 s -> 28.75 s), and presence expires in seconds.
FAST = {"FARM_VISIBILITY_TIMEOUT": "40", "FARM_HEARTBEAT_SECONDS": "1", "FARM_HEARTBEAT_TTL": "6",
        "FARM_SOFT_LIMIT_FLOOR": "3"}


def unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"container tier: {reason} (CI=true: run ../shared/containers/engine.sh up first, as .ci/run "
                    f"does, and export the environment it prints)")
    pytest.skip(f"container tier: {reason}")


@dataclass
class Stack:
    project: str
    env_file: Path
    env: dict[str, str]
    values: dict[str, str]

    def compose(self, *args: str, timeout: float = 300, check: bool = True,
                capture: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["docker", "compose", "-p", self.project, "--env-file", str(self.env_file),
               "-f", str(ROOT / "compose.yaml"), "-f", str(ROOT / "compose.cpu.yaml"), *args]
        done = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=capture, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[7:])} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def popen(self, *args: str) -> subprocess.Popen[str]:
        cmd = ["docker", "compose", "-p", self.project, "--env-file", str(self.env_file),
               "-f", str(ROOT / "compose.yaml"), "-f", str(ROOT / "compose.cpu.yaml"), *args]
        return subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def docker(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
        return done.stdout

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def redis(self, *command: str) -> str:
        """redis-cli in the decisions Redis container, as the writer (the default user is disabled)."""
        done = self.compose("exec", "-T", "-e", f"REDISCLI_AUTH={self.values['DECISIONS_WRITER_PASSWORD']}",
                            "redis-decisions", "redis-cli", "--no-auth-warning", "--user",
                            self.values["DECISIONS_WRITER_USER"], *command, timeout=60)
        return done.stdout.strip()

    def decisions(self) -> dict[str, dict[str, str]]:
        keys = sorted(k for k in self.redis("--scan", "--pattern", "farm:decisions:*").splitlines() if k)
        out = {}
        for key in keys:
            raw = self.compose("exec", "-T", "-e", f"REDISCLI_AUTH={self.values['DECISIONS_WRITER_PASSWORD']}",
                               "redis-decisions", "redis-cli", "--no-auth-warning", "--json", "--user",
                               self.values["DECISIONS_WRITER_USER"], "HGETALL", key, timeout=60).stdout
            out[key] = json.loads(raw)
        return out


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("DOCKER_HOST", "FARM_TEST_PYTHON_IMAGE", "FARM_TEST_REDIS_IMAGE"):
        if not env.get(name):
            unavailable(f"{name} is not set")
    if shutil.which("docker") is None:
        unavailable("the docker CLI is not installed")
    for check in (["docker", "info"], ["docker", "compose", "version"],
                  ["docker", "image", "inspect", env["FARM_TEST_PYTHON_IMAGE"], env["FARM_TEST_REDIS_IMAGE"]]):
        done = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            unavailable(f"{' '.join(check)} failed: {done.stderr.strip()[-500:]}")
    return env


def filled_env_file(path: Path, env: dict[str, str], export_dir: Path) -> dict[str, str]:
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    values.update(
        FARM_HOST_NAME=HOST,
        BROKER_REDIS_PASSWORD=secrets.token_hex(16),
        DECISIONS_WRITER_PASSWORD=secrets.token_hex(16),
        DECISIONS_READER_PASSWORD=secrets.token_hex(16),
        DECISIONS_REPORTER_USER="reporter",
        DECISIONS_REPORTER_PASSWORD=secrets.token_hex(16),
        FARM_FLOWER_BASIC_AUTH=f"admin:{secrets.token_hex(12)}",
        FARM_FLOWER_PORT=str(free_port()),
        FARM_PYTHON_IMAGE=env["FARM_TEST_PYTHON_IMAGE"],
        FARM_REDIS_IMAGE=env["FARM_TEST_REDIS_IMAGE"],
        FARM_COORDINATOR_IMAGE="tuning-farm/coordinator:ci",
        FARM_WORKER_CPU_IMAGE="tuning-farm/worker:ci-cpu",
        FARM_CATALOG_DIR=str(ROOT / "examples"),
        FARM_EXPORT_DIR=str(export_dir),
        **FAST,
    )
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return values


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = engine_env()
    directory = tmp_path_factory.mktemp("stack")
    export = directory / "export"
    export.mkdir(mode=0o777)
    export.chmod(0o777)  # the coordinator runs as uid 10001
    values = filled_env_file(directory / ".env", env, export)
    s = Stack(project=f"farmci{secrets.token_hex(3)}", env_file=directory / ".env", env=env, values=values)
    try:
        # Image layers are cached by the engine: after the first run only changed sources rebuild.
        s.compose("build", timeout=600)
        s.compose("up", "-d", "--wait", "--wait-timeout", "240", timeout=300)
        yield s
    except BaseException:
        logs = s.compose("logs", "--no-color", "--tail", "40", check=False, timeout=60)
        print(logs.stdout[-8000:], logs.stderr[-2000:])
        raise
    finally:
        s.compose("down", "-v", "--remove-orphans", "--timeout", "5", check=False, timeout=180)
        remaining = s.docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={s.project}")
        volumes = s.docker("volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={s.project}")
        assert remaining.strip() == "" and volumes.strip() == "", "compose down -v left containers or volumes"


def flower_status(stack: Stack, auth: str | None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{stack.values['FARM_FLOWER_PORT']}/api/workers")
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def host_workloads() -> int:
    catalog = tomllib.loads((ROOT / "examples" / "catalog.toml").read_text())
    return sum(len(p["workloads"]) for p in catalog["problems"] if "cpu" in p.get("devices", ["cpu", "cuda"]))


def test_the_stack_starts_healthy_and_flower_requires_its_credentials(stack):
    states = {}
    for line in stack.compose("ps", "--format", "json").stdout.splitlines():
        row: dict[str, Any] = json.loads(line)
        states[row["Service"]] = row.get("Health") or row["State"]
    assert states == dict.fromkeys(["redis-broker", "redis-decisions", "worker-gpu0", "worker-gpu1", "flower"],
                                   "healthy")
    assert flower_status(stack, None) == 401
    assert flower_status(stack, "admin:wrong-password") == 401
    assert flower_status(stack, stack.values["FARM_FLOWER_BASIC_AUTH"]) == 200
    # The coordinator image's own health check: both Redis servers answer through its credentials.
    checked = stack.compose("run", "--rm", "--no-deps", "-T", "coordinator", "/bin/sh",
                            "/usr/local/lib/farm/coordinator-healthcheck.sh", timeout=120)
    assert "healthy: FARM_BROKER_URL, FARM_REDIS_URL answer PING" in checked.stdout
    # The write-only reporter user of fleet feedback: it may append a report to the stream and read nothing.
    reporter = ("exec", "-T", "redis-decisions", "redis-cli", "--no-auth-warning", "--user", "reporter", "--pass",
                stack.values["DECISIONS_REPORTER_PASSWORD"])
    added = stack.compose(*reporter, "XADD", "farm:feedback", "*", "report", "{}", timeout=60)
    assert re.fullmatch(r"\d+-\d+", added.stdout.strip()), added.stdout + added.stderr
    for refused in (("XRANGE", "farm:feedback", "-", "+"), ("HGETALL", "farm:fingerprints"), ("SET", "x", "1")):
        done = stack.compose(*reporter, *refused, check=False, timeout=60)
        assert "NOPERM" in done.stdout + done.stderr, (refused, done.stdout, done.stderr)
    # Every process runs as the image's non-root user.
    for service in ("worker-gpu0", "flower"):
        assert stack.compose("exec", "-T", service, "id", "-u").stdout.strip() == "10001"


def test_the_catalog_completes_in_containers_despite_a_killed_worker_and_survives_a_redis_kill(stack):
    settings = Settings()
    victim_key = settings.worker_key(f"{HOST}-gpu0-cpu0")
    tune = stack.popen("run", "--rm", "-T", "coordinator", "farm", "tune", "/catalog/catalog.toml", "--json")
    try:
        wait_for(lambda: stack.redis("HGET", victim_key, "state") == presence.BUSY, 180, "worker-gpu0 to start a task")
        stack.docker("kill", stack.container("worker-gpu0"))
        out, err = tune.communicate(timeout=420)
    finally:
        if tune.poll() is None:
            tune.kill()
    assert tune.returncode == 0, err[-4000:]
    report = json.loads(out[out.index("{"):])
    rows = report["decisions"]
    assert len(rows) == host_workloads()
    assert [r for r in rows if r["error"] is not None or r["record"] is None] == []

    before = stack.decisions()
    assert sum(len(fields) for fields in before.values()) == host_workloads()
    # The writer may not run INFO or CONFIG (ACL): the append-only files in the data volume show the persistence.
    aof = stack.compose("exec", "-T", "redis-decisions", "ls", "/data/appendonlydir").stdout.split()
    assert any(name.endswith(".incr.aof") for name in aof), aof
    # SIGKILL: no shutdown save, so what comes back was read from the append-only file (fsynced every second).
    stack.docker("kill", stack.container("redis-decisions"))
    stack.compose("up", "-d", "--wait", "--wait-timeout", "120", "redis-decisions", timeout=180)
    # Polled: the restart policy may already have restarted it, and a loading server answers LOADING for a moment.
    seen: dict[str, Any] = {}

    def restored() -> bool:
        seen["after"] = stack.decisions()
        return bool(seen["after"] == before)

    try:
        wait_for(restored, 60, "every decision back after the restart")
    except BaseException:
        after = seen.get("after", {})
        logs = stack.compose("logs", "--no-color", "--tail", "30", "redis-decisions", check=False).stdout
        print({k: len(v) for k, v in before.items()}, {k: len(v) for k, v in after.items()}, logs, sep="\n")
        raise
