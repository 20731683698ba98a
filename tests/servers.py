"""Real servers for the farm's tests: a private redis-server and `farm worker` processes on loopback (the private
RabbitMQ node is tests/rabbitmq.py's).

Nothing here touches the machine's shared services: every server gets free ports and a temporary directory.
A missing redis-server FAILS the run (it never skips); a missing rabbitmq-server skips the RabbitMQ tests, or fails
them when CI=true. `python3 tools/dev.py test` installs both.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy; fail the test with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


@dataclass
class RedisServer:
    port: int
    directory: Path
    process: subprocess.Popen[bytes]

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, db=db, decode_responses=True)


@contextlib.contextmanager
def redis_server(directory: Path, extra: tuple[str, ...] = ()) -> Iterator[RedisServer]:
    """Start a private redis-server on a free loopback port; stop it afterwards."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: the farm's tests need it (python3 tools/dev.py test installs it)")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = open(directory / "redis.log", "wb")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
         "--appendonly", "no", "--protected-mode", "yes", *extra],
        stdout=log, stderr=subprocess.STDOUT,
    )
    server = RedisServer(port, directory, process)
    try:
        import redis

        def ready() -> bool:
            if process.poll() is not None:
                pytest.fail(f"redis-server exited: {(directory / 'redis.log').read_text()[-2000:]}")
            try:
                return bool(server.client().ping())
            except redis.ConnectionError:
                return False

        wait_for(ready, 20, "redis-server to answer PING")
        yield server
    finally:
        terminate(process)
        log.close()


def terminate(process: subprocess.Popen[bytes]) -> None:
    """Stop a server process: SIGTERM, then SIGKILL if it has not exited within 10 seconds."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class WorkerProcess:
    device: str
    process: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL the worker and its pool process (the whole process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def farm_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for farm subprocesses: the test operations importable, the same lock folder."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def start_worker(device: str, broker: str, redis_url: str, directory: Path, env: dict[str, str],
                 kernels: tuple[str, ...] = ("farm_testops",), extra: tuple[str, ...] = ()) -> WorkerProcess:
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / f"worker-{device.replace(':', '')}-{time.monotonic_ns()}.log"
    args = [sys.executable, "-m", "farm_cli", "worker", "--device", device, "--broker", broker, "--redis", redis_url]
    for module in kernels:
        args += ["--kernels", module]
    args += list(extra)
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=directory,
                                   start_new_session=True)
    return WorkerProcess(device, process, log)


def wait_worker_ready(worker: WorkerProcess, client: Any, prefix: str, timeout: float = 90) -> None:
    """Poll until the worker announced itself in Redis AND its Celery consumer answers a ping."""

    def announced() -> bool:
        if worker.process.poll() is not None:
            pytest.fail(f"worker {worker.device} exited early:\n{worker.output()[-4000:]}")
        for key in client.scan_iter(match=f"{prefix}:worker:*"):
            if client.hget(key, "device") == worker.device:
                return "ready" in worker.output()
        return False

    wait_for(announced, timeout, f"worker {worker.device} to be ready")


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")  # a missing server fails the run instead of skipping
