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


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")  # a missing server fails the run instead of skipping
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
        self.starts = 0
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
        """Start the node (again, on its data after ``kill()``) and wait until it has booted and accepts AMQP.

        The AMQP port accepting is not enough: ``rabbitmqctl await_startup`` answers 69 (node unreachable) until
        the node has registered with epmd, so it is retried until the deadline while the server lives."""
        deadline = time.monotonic() + timeout
        if self.epmd is None or self.epmd.poll() is not None:
            # Our own epmd on a private port: the machine's epmd (4369) never learns about this node.
            self.epmd = subprocess.Popen(["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.starts += 1
        with open(self.directory / "console.log", "ab") as out:
            self.process = subprocess.Popen([str(self.server)], stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                                            cwd=self.directory, start_new_session=True)
        process = self.process

        def alive() -> None:
            if process.poll() is not None:
                pytest.fail(f"the private rabbitmq-server exited ({process.returncode}):\n{self.log()}")

        def booted() -> bool:
            alive()
            if not (self._registered() and self._listening(self.port)):
                return False
            left = max(5, int(deadline - time.monotonic()))
            try:
                self.ctl_run("await_startup", "--timeout", str(left))
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                alive()
                return False  # 69: not reachable yet (distribution still coming up); try again
            return True

        wait_for(booted, timeout, f"the private RabbitMQ node {self.name} to boot and accept AMQP on port {self.port}",
                 interval=0.5)

    def quorum_registered(self) -> bool:
        """Whether every quorum queue member (Ra server) of this node is in its on-disk registry (names.dets).

        RabbitMQ 3.10 writes that registry a moment after a queue is declared; a node SIGKILLed in between comes
        back without it and starts the queue as a new, empty member that never elects a leader (the queue hangs:
        "leader not known", rabbitmq/rabbitmq-server#10070 and #15725), although its log is on disk."""
        for folder in self.directory.glob("mnesia/*/quorum/*"):
            names = folder / "names.dets"
            known = names.read_bytes() if names.exists() else b""
            if any(d.name.encode() not in known for d in folder.iterdir() if d.is_dir()):
                return False
        return True

    def _listening(self, port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(1.0)
            return s.connect_ex(("127.0.0.1", port)) == 0

    def _registered(self) -> bool:
        """Whether this node's name is registered with its private epmd."""
        done = subprocess.run(["epmd", "-port", str(self.epmd_port), "-names"], capture_output=True, text=True,
                              timeout=30)
        short = self.name.split("@")[0]
        return any(line.split()[1:2] == [short] for line in done.stdout.splitlines() if line.startswith("name "))

    def pids(self) -> list[int]:
        """Every process of this node: beam runs its helpers (erl_child_setup, inet_gethost, the disk monitor) in
        sessions of their own, out of reach of the server's process group, so they are found by the node name in
        their environment, which only this node's processes (and its rabbitmqctl calls) carry."""
        marker = b"RABBITMQ_NODENAME=" + self.name.encode() + b"\0"
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if marker in Path(f"/proc/{entry}/environ").read_bytes():
                        found.append(int(entry))
        return found

    def ctl_run(self, *args: str, timeout: float = 120) -> str:
        """``rabbitmqctl -n <this node> args``: its output (CalledProcessError with the output on failure)."""
        done = subprocess.run([str(self.ctl), "-q", "-n", self.name, *args], env=self.env(), capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
        return done.stdout

    def kill(self) -> None:
        """SIGKILL the node: its process group and every other process of its node name (see ``pids``); return
        once they are all gone, its ports are closed and epmd has dropped its name, so ``start()`` meets no trace
        of the old node (a new node would otherwise see the name taken, or the old AMQP listener would answer)."""
        if self.process is None:
            return
        # A crash, not a crash in the window RabbitMQ itself cannot survive (see quorum_registered).
        wait_for(self.quorum_registered, 30, f"the quorum queues of {self.name} to be registered on disk", 0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(30)
        self.process = None

        def gone() -> bool:
            for pid in self.pids():  # a helper forked while we were killing
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return not self.pids() and not self._listening(self.port) and not self._listening(self.dist_port) \
                and not self._registered()

        wait_for(gone, 60, f"the killed RabbitMQ node {self.name} to be gone (processes, ports, epmd name)", 0.1)

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
            self.delete_vhost(name)

    def delete_vhost(self, name: str) -> None:
        """Delete a vhost. A node that is down (killed by a test that failed before starting it again) or does not
        answer leaves it behind, said on stderr: a cleanup error would hide the test's own failure (and the suite
        turns warnings into errors)."""
        if self.process is None or self.process.poll() is not None:
            print(f"vhost {name} left on the private RabbitMQ node {self.name}: the node is down", file=sys.stderr)
            return
        try:
            self.ctl_run("delete_vhost", name)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            detail = (getattr(e, "stderr", "") or "").strip()
            print(f"vhost {name} left on the private RabbitMQ node {self.name}: {e} {detail}", file=sys.stderr)

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
