"""The tests' private RabbitMQ node, the one class that starts RabbitMQ for the suite: its own node name, ports,
data, log folders, Erlang cookie and epmd, so the machine's RabbitMQ (5672, rabbit@localhost) is never touched;
SIGKILLed and started again on its data at will; a plain AMQP listener, or with ``certs`` a TLS listener only.

The node runs the package's own rabbitmq-server script as the user running the tests (not Debian's wrapper, which
switches to the rabbitmq user), so its folder and its copy of the certificates need no permissions for others.
A missing rabbitmq-server skips the tests that need a node, or fails them when CI=true (``require_rabbitmq``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import IN_CI, free_port, wait_for

RABBITMQ_HINT = "install it with `python3 tools/dev.py test` (apt-get install rabbitmq-server)"


def require_rabbitmq(why: str = "the RabbitMQ tests cannot start their own node") -> None:
    """Skip the test when rabbitmq-server is not installed, or fail it when CI=true."""
    if rabbitmq_binaries() is None:
        message = f"rabbitmq-server is not installed, so {why}: {RABBITMQ_HINT}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


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
    and their messages survive, as after a broker crash. Guest/guest from loopback, as a fresh RabbitMQ; tests
    take a vhost of their own (``vhost()``). With ``certs`` (a folder with ca.pem, server.pem and server.key, as
    tools/certs.py writes) the node has a TLS listener only, on ``port``, and its URLs are ``amqps://``."""

    def __init__(self, directory: Path, certs: Path | None = None) -> None:
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
        self.tls = certs is not None
        if certs is not None:
            copy = directory / "certs"  # the node's own copy: the test's folder may go before the node does
            shutil.copytree(certs, copy, dirs_exist_ok=True)
            (directory / "rabbitmq.conf").write_text(
                f"listeners.tcp = none\nlisteners.ssl.default = 127.0.0.1:{self.port}\n"
                f"ssl_options.cacertfile = {copy / 'ca.pem'}\nssl_options.certfile = {copy / 'server.pem'}\n"
                f"ssl_options.keyfile = {copy / 'server.key'}\nssl_options.verify = verify_none\n")

    def env(self) -> dict[str, str]:
        """The environment both the server and rabbitmqctl need to find this node (and only this one)."""
        d = self.directory
        # The plain listener from the environment; the TLS one from rabbitmq.conf (the variables would add a TCP one).
        listener = {} if self.tls else {"RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(self.port)}
        return dict(
            os.environ, **listener, HOME=str(d), RABBITMQ_NODENAME=self.name, RABBITMQ_DIST_PORT=str(self.dist_port), ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq"), RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"), RABBITMQ_LOG_BASE=str(d / "log"), RABBITMQ_LOGS=str(d / "log" / "node.log"),
            RABBITMQ_PID_FILE=str(d / "node.pid"), RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-start_epmd false",
            ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}",
        )

    def url(self, vhost: str = "", ca: Path | None = None) -> str:
        """The AMQP URL of ``vhost``; a TLS node's is ``amqps://``, verifying the node's certificate against ``ca``
        (the farm's query, as for ``rediss://``: farm_fleet.celeryconf.amqp_tls)."""
        if not self.tls:
            return f"amqp://guest:guest@127.0.0.1:{self.port}/{vhost}"
        if ca is None:
            raise ValueError(f"the TLS node {self.name} needs the CA to verify it with (url(ca=...))")
        return f"amqps://guest:guest@127.0.0.1:{self.port}/{vhost}?ssl_cert_reqs=required&ssl_ca_certs={ca}"

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
    def vhost(self, ca: Path | None = None) -> Iterator[str]:
        """A fresh vhost of this node (guest may use it), deleted afterwards: its AMQP URL (see ``url``)."""
        name = f"farm-test-{uuid.uuid4().hex[:8]}"
        self.ctl_run("add_vhost", name)
        try:
            self.ctl_run("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
            yield self.url(name, ca)
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
def rabbitmq_node(directory: Path, certs: Path | None = None) -> Iterator[RabbitMQNode]:
    """Start a private RabbitMQ node (see RabbitMQNode; a TLS one with ``certs``); stop it afterwards. Without
    rabbitmq-server the test skips, or fails when CI=true."""
    require_rabbitmq()
    node = RabbitMQNode(directory, certs)
    try:
        node.start()
        yield node
    finally:
        node.stop()
