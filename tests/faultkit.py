"""Fault injection for the farm's real-process tests: a TCP proxy that can cut its connections, Redis servers that
can be frozen (SIGSTOP) or SIGKILLed and restarted on their data, and a fleet whose broker and decisions Redis are
separate servers (so one can fail without the other)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from servers import WorkerProcess, farm_env, free_port, start_worker, wait_for, wait_worker_ready

from farm_fleet.settings import Settings

# Short limits: a lost group is sent again within seconds, a frozen worker's record expires within seconds.
FAULT_ENV = {
    "FARM_SOFT_LIMIT_FLOOR": "3",
    "FARM_VISIBILITY_TIMEOUT": "15",
    "FARM_HEARTBEAT_SECONDS": "1",
    "FARM_HEARTBEAT_TTL": "3",
    "FARM_LOST_GRACE_SECONDS": "3",
    "FARM_STORE_RETRY_SECONDS": "15",
    "FARM_LEASE_TTL": "2",
}


class Proxy:
    """A TCP proxy on a free loopback port to ``127.0.0.1:target``. ``cut(seconds)`` drops every connection and
    refuses new ones for that long, as a network partition does."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self._down_until = 0.0
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if time.monotonic() < self._down_until:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._sockets -= {source, sink}

    def cut(self, seconds: float) -> None:
        """Drop every connection now and refuse new ones for ``seconds``."""
        self._down_until = time.monotonic() + seconds
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        self.cut(0)


@dataclass
class Server:
    """A private redis-server that can be frozen, killed and restarted on the same port and data."""

    port: int
    directory: Path
    aof: bool
    process: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, db=db, decode_responses=True, socket_timeout=30)

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: the farm's tests need it (python3 tools/dev.py test installs it)")
        self.directory.mkdir(parents=True, exist_ok=True)
        persistence = ("--appendonly", "yes", "--appendfsync", "always") if self.aof else ("--appendonly", "no")
        with open(self.directory / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory), "--save", "",
                 "--protected-mode", "yes", *persistence], stdout=log, stderr=subprocess.STDOUT)
        import redis

        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                pytest.fail(f"redis-server exited: {(self.directory / 'redis.log').read_text()[-2000:]}")
            try:
                return bool(self.client().ping())
            except (redis.ConnectionError, redis.BusyLoadingError):
                return False

        wait_for(ready, 20, "redis-server to answer PING")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def freeze(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class FaultFleet:
    """Workers reach the decisions Redis through ``proxy``; the coordinator reaches it directly."""

    broker: Server
    decisions: Server
    proxy: Proxy
    settings: Settings
    env: dict[str, str]
    directory: Path
    broker_url: str
    workers: list[WorkerProcess] = field(default_factory=list)

    def client(self) -> Any:
        return self.decisions.client()

    def start(self, device: str) -> WorkerProcess:
        worker = start_worker(device, self.broker_url, self.proxy.url(), self.directory, self.env)
        self.workers.append(worker)
        wait_worker_ready(worker, self.client(), self.settings.prefix)
        return worker

    def parts(self) -> Any:
        """The coordinator's parts on this farm (``farm_coordinator.ports.Parts``) for ``run.tune``."""
        from farm_cli import celery_parts

        return celery_parts(self.settings)

    def coordinator(self, catalog: Path, *extra: str) -> subprocess.Popen[str]:
        """``farm tune`` in its own process group (so it can be frozen, interrupted or killed)."""
        return subprocess.Popen(
            [sys.executable, "-m", "farm_cli", "tune", str(catalog), "--broker", self.broker_url, "--redis",
             self.decisions.url(), "--kernels", "farm_testops", "--json", *extra],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@contextlib.contextmanager
def fault_fleet(directory: Path, devices: tuple[str, ...], broker_url: str | None = None,
                env: dict[str, str] | None = None) -> Iterator[FaultFleet]:
    """Two private redis-servers (each with an append-only file, so it restarts on its data), a proxy in
    front of the decisions one, and ``farm worker`` processes. ``broker_url`` replaces the Redis broker; ``env``
    overrides FAULT_ENV."""
    broker = Server(free_port(), directory / "broker", aof=True)
    decisions = Server(free_port(), directory / "decisions", aof=True)
    proxy: Proxy | None = None
    fleet: FaultFleet | None = None
    try:
        broker.start()
        decisions.start()
        proxy = Proxy(decisions.port)
        environment = farm_env({**FAULT_ENV, **(env or {}), "FARM_PREFIX": f"f{uuid.uuid4().hex[:8]}"})
        url = broker_url or broker.url()
        settings = Settings.from_env(environment, broker_url=url, redis_url=decisions.url())
        fleet = FaultFleet(broker, decisions, proxy, settings, environment, directory, url)
        for device in devices:
            fleet.start(device)
        yield fleet
    finally:
        if fleet is not None:
            for worker in fleet.workers:
                worker.stop()
        if proxy is not None:
            proxy.close()
        decisions.stop()
        broker.stop()


def publications(f: FaultFleet) -> dict[str, int]:
    """Publication events per decision field (the stream holds one entry per successful publication)."""
    counts: dict[str, int] = {}
    for _, entry in f.client().xrange(f.settings.events_key):
        counts[entry["field"]] = counts.get(entry["field"], 0) + 1
    return counts


def decided_problems(f: FaultFleet) -> dict[str, str]:
    client = f.client()
    found: dict[str, str] = {}
    for digest in client.hkeys(f.settings.fingerprints_key):
        found.update(client.hgetall(f.settings.problems_key(digest)))
    return found


def assert_exactly_once(f: FaultFleet, problems: int) -> None:
    """Every problem decided, each decision published exactly once."""
    decided = decided_problems(f)
    assert len(decided) == problems, decided
    counts = publications(f)
    assert sorted(counts) == sorted(set(decided.values())), counts
    assert set(counts.values()) == {1}, counts


def wait_busy(f: FaultFleet, timeout: float = 60) -> None:
    from farm_fleet import presence

    def busy() -> bool:
        return any(w.state == presence.BUSY for w in presence.live_workers(f.client(), f.settings))

    wait_for(busy, timeout, "a worker to start a group")


@contextlib.contextmanager
def rabbitmq_vhost(node: Any) -> Iterator[str]:
    """A vhost of its own on the session's private RabbitMQ node (the ``rabbitmq_srv`` fixture), removed
    afterwards: its AMQP URL. The machine's RabbitMQ is never used."""
    with node.vhost() as url:
        yield url


def queue_types(node: Any, amqp_url: str) -> dict[str, str]:
    """Queue name -> type (classic, quorum) in the vhost of ``amqp_url`` on ``node``."""
    types: dict[str, str] = node.queue_types(amqp_url.rsplit("/", 1)[1])
    return types
