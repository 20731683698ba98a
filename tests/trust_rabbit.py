"""A minimal private RabbitMQ node for tests/test_tls.py and tests/test_rabbit_faults.py: its own node name,
ports, data and log folders (the machine's shared RabbitMQ is never touched), started and killed (SIGKILL) at will,
restarted on its data; a plain AMQP listener, or with ``certs`` a TLS listener only. rabbitmq-server runs as the
rabbitmq user, so the node's folder (and its copy of the server key) is readable by that user: test certificates
only. A stand-in until tests/servers.py has its own node fixture."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import free_port, wait_for

PASSWORD = "farm-test-secret"


class RabbitNode:
    """One node; ``start()`` (again after ``kill()``: on the same data) waits until it accepts clients."""

    def __init__(self, certs: Path | None = None) -> None:
        if shutil.which("rabbitmq-server") is None:
            pytest.skip("rabbitmq-server is not installed")
        self.directory = Path(tempfile.mkdtemp(prefix="farm-rabbit-"))
        os.chmod(self.directory, 0o777)
        self.port = free_port()
        self.tls = certs is not None
        listener = f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
        if certs is not None:
            node = self.directory / "certs"
            shutil.copytree(certs, node)
            for path in (node, *node.iterdir()):
                os.chmod(path, 0o755 if path.is_dir() else 0o644)
            listener = (f"listeners.tcp = none\nlisteners.ssl.default = 127.0.0.1:{self.port}\n"
                        f"ssl_options.cacertfile = {node / 'ca.pem'}\nssl_options.certfile = {node / 'server.pem'}\n"
                        f"ssl_options.keyfile = {node / 'server.key'}\nssl_options.verify = verify_none\n")
        (self.directory / "rabbitmq.conf").write_text(
            f"{listener}loopback_users = none\ndefault_user = farm\ndefault_pass = {PASSWORD}\ndefault_vhost = farm\n")
        (self.directory / "plugins").write_text("[].\n")
        self.env = {**os.environ, "RABBITMQ_NODENAME": f"farmtest{uuid.uuid4().hex[:8]}@localhost",
                    "RABBITMQ_CONFIG_FILE": str(self.directory / "rabbitmq"),
                    "RABBITMQ_MNESIA_BASE": str(self.directory / "mnesia"),
                    "RABBITMQ_LOG_BASE": str(self.directory / "log"), "RABBITMQ_DIST_PORT": str(free_port()),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.directory / "plugins")}
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def url(self, ca: Path | None = None) -> str:
        if self.tls:
            return (f"amqps://farm:{PASSWORD}@127.0.0.1:{self.port}/farm?ssl_cert_reqs=required"
                    f"&ssl_ca_certs={ca}")
        return f"amqp://farm:{PASSWORD}@127.0.0.1:{self.port}/farm"

    def start(self) -> None:
        self.starts += 1
        out = self.directory / f"out-{self.starts}.log"
        with open(out, "wb") as log:
            self.process = subprocess.Popen(["rabbitmq-server"], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        process = self.process

        def started() -> bool:
            text = out.read_text(errors="replace")
            if process.poll() is not None or "BOOT FAILED" in text:
                pytest.fail(f"rabbitmq-server did not start:\n{text[-3000:]}")
            return "completed with" in text

        wait_for(started, 180, "the private RabbitMQ node to start")

    def _pids(self) -> list[int]:
        """This node's processes: the Erlang VM runs as the rabbitmq user in a process group of its own, so they
        are found by the node name in their environment (which only this node's processes carry)."""
        name = b"RABBITMQ_NODENAME=" + self.env["RABBITMQ_NODENAME"].encode() + b"\0"
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if name in Path(f"/proc/{entry}/environ").read_bytes():
                        found.append(int(entry))
        return found

    def _signal(self, sig: int) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _registered(self) -> bool:
        out = subprocess.run(["epmd", "-names"], capture_output=True, text=True, timeout=30).stdout
        short = self.env["RABBITMQ_NODENAME"].split("@")[0]
        return any(line.split()[1:2] == [short] for line in out.splitlines() if line.startswith("name "))

    def kill(self) -> None:
        """SIGKILL the node: its process group and every process of its node name (the Erlang VM with them)."""
        self._signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(60)
            self.process = None
        wait_for(lambda: not self._pids() and not self._registered(), 60, "the killed node to be gone")

    def stop(self) -> None:
        """Stop the node (SIGTERM to its processes; SIGKILL for any left after a minute)."""
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while self._pids() and time.monotonic() < deadline:
            time.sleep(0.1)  # polling with a deadline: a node that does not stop is killed below
        self.kill()


@contextlib.contextmanager
def rabbit_node(certs: Path | None = None) -> Iterator[RabbitNode]:
    node = RabbitNode(certs)
    try:
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(node.directory, ignore_errors=True)
