"""Real servers for the farm's tests: a private redis-server, a private RabbitMQ node and `farm worker` processes
on loopback.

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


RABBITMQ_HINT = "install it with `python3 tools/dev.py test` (apt-get install rabbitmq-server)"


def rabbitmq_binaries() -> tuple[Path, Path] | None:
    """rabbitmq-server and rabbitmqctl, the package's own scripts (not Debian's wrappers, which switch to the
    rabbitmq user and the machine's node), or None when rabbitmq-server is not installed."""
    for folder in (Path("/usr/lib/rabbitmq/bin"), Path("/usr/local/lib/rabbitmq/bin")):
        if (folder / "rabbitmq-server").exists() and (folder / "rabbitmqctl").exists():
            return folder / "rabbitmq-server", folder / "rabbitmqctl"
    server, ctl = shutil.which("rabbitmq-server"), shutil.which("rabbitmqctl")
    return (Path(server), Path(ctl)) if server and ctl else None


class RabbitMQNode:
    """A private RabbitMQ node for the tests: its own node name, AMQP port, distribution port, epmd port, data
    and log folders and Erlang cookie, so it never meets the machine's RabbitMQ (5672, rabbit@localhost).

    ``kill()`` SIGKILLs it (no clean shutdown) and ``start()`` starts it again on the same data: durable queues
    and their messages survive, as after a broker crash. Guest/guest from loopback, as a fresh RabbitMQ."""

    def __init__(self, directory: Path) -> None:
        binaries = rabbitmq_binaries()
        if binaries is None or shutil.which("epmd") is None:
            raise RuntimeError(f"rabbitmq-server is not installed: {RABBITMQ_HINT}")
        self.server, self.ctl = binaries
        self.directory = directory
        self.port, self.dist_port, self.epmd_port = free_port(), free_port(), free_port()
        self.name = f"farmtest-{os.getpid()}-{self.port}@localhost"
        self.process: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        cookie = directory / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(os.urandom(16).hex().upper())
            cookie.chmod(0o400)
        (directory / "rabbitmq-env.conf").write_text("")
        (directory / "enabled_plugins").write_text("[].\n")

    def env(self) -> dict[str, str]:
        """The environment both the server and rabbitmqctl need to find this node (and only this one)."""
        d = self.directory
        return dict(
            os.environ, HOME=str(d), RABBITMQ_NODENAME=self.name, RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port), RABBITMQ_DIST_PORT=str(self.dist_port), ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq"), RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"), RABBITMQ_LOG_BASE=str(d / "log"), RABBITMQ_LOGS=str(d / "log" / "node.log"),
            RABBITMQ_PID_FILE=str(d / "node.pid"), RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-start_epmd false",
            ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}",
        )

    def url(self, vhost: str = "") -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{vhost}"

    def log(self) -> str:
        logs = sorted((self.directory / "log").glob("*.log"))
        console = self.directory / "console.log"
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in [*logs, console] if p.exists())

    def start(self, timeout: float = 120) -> None:
        """Start the node (again, on its data after ``kill()``) and wait until it accepts AMQP connections."""
        if self.epmd is None or self.epmd.poll() is not None:
            # Our own epmd on a private port: the machine's epmd (4369) never learns about this node.
            self.epmd = subprocess.Popen(["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        with open(self.directory / "console.log", "ab") as out:
            self.process = subprocess.Popen([str(self.server)], stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                                            cwd=self.directory, start_new_session=True)
        process = self.process

        def accepting() -> bool:
            if process.poll() is not None:
                pytest.fail(f"the private rabbitmq-server exited ({process.returncode}):\n{self.log()}")
            with socket.socket() as s:
                s.settimeout(1.0)
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(accepting, timeout, f"the private RabbitMQ node {self.name} to accept AMQP on port {self.port}",
                 interval=0.25)
        self.ctl_run("await_startup", "--timeout", str(int(timeout)))

    def ctl_run(self, *args: str) -> str:
        """``rabbitmqctl -n <this node> args``: its output (CalledProcessError with the output on failure)."""
        done = subprocess.run([str(self.ctl), "-q", "-n", self.name, *args], env=self.env(), capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
        return done.stdout

    def kill(self) -> None:
        """SIGKILL the node (its whole process group: beam and its helpers); its data stays for ``start()``."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self.process = None

    def stop(self) -> None:
        """Stop the node and its epmd for good."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(30)
        self.kill()
        if self.epmd is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.epmd.pid, signal.SIGKILL)
            self.epmd.wait(10)
            self.epmd = None

    @contextlib.contextmanager
    def vhost(self) -> Iterator[str]:
        """A fresh vhost of this node (guest may use it), deleted afterwards: its AMQP URL."""
        import uuid

        name = f"farm-test-{uuid.uuid4().hex[:8]}"
        self.ctl_run("add_vhost", name)
        try:
            self.ctl_run("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
            yield self.url(name)
        finally:
            if self.process is not None and self.process.poll() is None:
                self.ctl_run("delete_vhost", name)

    def queue_types(self, vhost: str) -> dict[str, str]:
        """Queue name -> type (classic, quorum) in ``vhost``."""
        out = self.ctl_run("list_queues", "-p", vhost, "name", "type", "--no-table-headers")
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)


@contextlib.contextmanager
def rabbitmq_node(directory: Path) -> Iterator[RabbitMQNode]:
    """Start a private RabbitMQ node (see RabbitMQNode); stop it afterwards."""
    node = RabbitMQNode(directory)
    try:
        node.start()
        yield node
    finally:
        node.stop()
