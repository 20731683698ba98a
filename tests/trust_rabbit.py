"""A minimal private RabbitMQ node with a TLS listener only, for tests/test_tls.py (its own node name, ports, data
and log folders; the machine's shared RabbitMQ is never touched). rabbitmq-server runs as the rabbitmq user, so the
node's folder (and its copy of the server key) is readable by that user: test certificates only."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from servers import free_port, wait_for


@dataclass
class TlsRabbit:
    port: int
    directory: Path

    def url(self, ca: Path, user: str = "farm", password: str = "farm-test-secret") -> str:
        return f"amqps://{user}:{password}@127.0.0.1:{self.port}/farm?ssl_cert_reqs=required&ssl_ca_certs={ca}"


@contextlib.contextmanager
def tls_rabbit(certs: Path) -> Iterator[TlsRabbit]:
    """Start a RabbitMQ node listening with TLS only (server certificate from ``certs``); stop it afterwards."""
    if shutil.which("rabbitmq-server") is None:
        pytest.skip("rabbitmq-server is not installed")
    directory = Path(tempfile.mkdtemp(prefix="farm-tls-rabbit-"))
    os.chmod(directory, 0o777)
    node = directory / "certs"
    shutil.copytree(certs, node)
    for path in (node, *node.iterdir()):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    port = free_port()
    (directory / "rabbitmq.conf").write_text(
        f"listeners.tcp = none\nlisteners.ssl.default = 127.0.0.1:{port}\n"
        f"ssl_options.cacertfile = {node / 'ca.pem'}\nssl_options.certfile = {node / 'server.pem'}\n"
        f"ssl_options.keyfile = {node / 'server.key'}\nssl_options.verify = verify_none\n"
        "loopback_users = none\ndefault_user = farm\ndefault_pass = farm-test-secret\ndefault_vhost = farm\n")
    (directory / "plugins").write_text("[].\n")
    env = {**os.environ, "RABBITMQ_NODENAME": f"farmtls{uuid.uuid4().hex[:8]}@localhost",
           "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq"), "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
           "RABBITMQ_LOG_BASE": str(directory / "log"), "RABBITMQ_DIST_PORT": str(free_port()),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "plugins")}
    log = open(directory / "out.log", "wb")  # noqa: SIM115 - lives as long as the node
    process = subprocess.Popen(["rabbitmq-server"], stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    try:
        def started() -> bool:
            text = (directory / "out.log").read_text(errors="replace")
            if process.poll() is not None or "BOOT FAILED" in text:
                pytest.fail(f"rabbitmq-server did not start:\n{text[-3000:]}")
            return "completed with" in text

        wait_for(started, 120, "the private RabbitMQ node to start")
        yield TlsRabbit(port, directory)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
