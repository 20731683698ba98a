"""What the deployment tests share: the compose file read as Compose reads it, the Dockerfiles, the Redis
servers started by docker/redis-entrypoint.sh with their ACL users, and the worker's health check."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from redis.backoff import NoBackoff
from redis.retry import Retry
from servers import free_port, terminate, wait_for

from farm.stores.base import DecisionRecord

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
ENTRYPOINT = DOCKER / "redis-entrypoint.sh"
HEALTHCHECK = DOCKER / "worker-healthcheck.sh"
SECRETS = {"BROKER_REDIS_PASSWORD", "DECISIONS_WRITER_PASSWORD", "DECISIONS_READER_PASSWORD", "FARM_FLOWER_BASIC_AUTH"}
REQUIRED = SECRETS | {"FARM_HOST_NAME"}
# Optional (both or neither): the write-only reporter user of fleet feedback.
OPTIONAL_SECRETS = {"DECISIONS_REPORTER_PASSWORD"}

# ------------------------------------------------------------------------------------------ compose helpers

VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(Exception):
    pass


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation: $$, $NAME, ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error},
    ${NAME:+alternative}, ${NAME+alternative}."""

    def replace(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        name = m["braced"] or m["named"]
        op, arg = m["op"], m["arg"] or ""
        value = env.get(name)
        empty = value is None or (value == "" and op is not None and op.startswith(":"))
        if op in (":-", "-"):
            return arg if empty else value
        if op in (":?", "?"):
            if empty:
                raise MissingVariable(f"{name}: {arg}")
            return value
        if op in (":+", "+"):
            return "" if empty else arg
        return value or ""

    return VARIABLE.sub(replace, text)


def walk(node: Any, leaf: Any) -> Any:
    if isinstance(node, dict):
        return {walk(k, leaf): walk(v, leaf) for k, v in node.items()}
    if isinstance(node, list):
        return [walk(v, leaf) for v in node]
    return leaf(node) if isinstance(node, str) else node


def variables_in(node: Any) -> set[str]:
    found: set[str] = set()

    def collect(text: str) -> str:
        for m in VARIABLE.finditer(text):
            if not m["escaped"]:
                found.add(m["braced"] or m["named"])
        return text

    walk(node, collect)
    return found


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, eq, value = line.partition("=")
            assert eq, f"{path.name}: not NAME=value: {line!r}"
            env[name.strip()] = value.strip()
    return env


FILLED = {**{name: secrets.token_hex(16) for name in SECRETS}, "FARM_HOST_NAME": "gpuhost1",
          "FARM_FLOWER_BASIC_AUTH": f"admin:{secrets.token_hex(12)}"}


def filled_env() -> dict[str, str]:
    """.env.example as an operator fills it in."""
    return {**read_env_file(ROOT / ".env.example"), **FILLED}


class ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's merge tags (compose.cpu.yaml uses `!reset`)."""


ComposeLoader.add_constructor("!reset", lambda loader, node: None)
ComposeLoader.add_constructor("!override", lambda loader, node: loader.construct_object(node))


def raw_compose(name: str = "compose.yaml") -> dict[str, Any]:
    return yaml.load((ROOT / name).read_text(), Loader=ComposeLoader)


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """compose.yaml parsed (YAML anchors and merge keys resolved) and interpolated with ``env``."""
    env = filled_env() if env is None else env
    return walk(raw_compose(), lambda s: interpolate(s, env))


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def workers() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services().items() if name.startswith("worker-")}


def bind_sources(service: dict[str, Any]) -> list[Path]:
    sources = []
    for volume in service.get("volumes", []):
        source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
        if source.startswith("."):
            sources.append((ROOT / source).resolve())
    return sources


def redis_conf(name: str) -> dict[str, str]:
    values = {}
    for line in (DOCKER / "redis" / name).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            values[key.lower()] = value.strip()
    return values


@dataclass
class Dockerfile:
    instructions: list[tuple[str, str]]
    args: dict[str, str]

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
        text = re.sub(r"\\\n", " ", path.read_text())
        instructions = []
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                word, _, rest = line.partition(" ")
                instructions.append((word.upper(), rest.strip()))
        args = {}
        for word, rest in instructions:
            if word == "ARG" and "=" in rest:
                name, _, value = rest.partition("=")
                args[name] = value
        return cls(instructions, args)

    def all(self, word: str) -> list[str]:
        return [rest for w, rest in self.instructions if w == word]

    def resolve(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: self.args.get(m[1], m[0]), text)


def entrypoint_env(**values: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **values}

@dataclass
class Credentials:
    user: str
    password: str


@dataclass
class AclRedis:
    port: int
    directory: Path
    acl_file: Path
    writer: Credentials
    reader: Credentials | None
    pid: int = 0

    def url(self, who: Credentials | None = None, db: int = 0) -> str:
        who = who or self.writer
        return f"redis://{who.user}:{who.password}@127.0.0.1:{self.port}/{db}"

    def client(self, who: Credentials | None | str = "writer") -> Any:
        """A client authenticated as ``who`` (the writer by default; None: no credentials at all)."""
        if who == "writer":
            who = self.writer
        auth = {} if not isinstance(who, Credentials) else {"username": who.user, "password": who.password}
        # No retries: a refused login fails at once instead of after redis-py's default back-off.
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=10,
                           retry=Retry(NoBackoff(), 0), **auth)


@contextlib.contextmanager
def acl_redis(conf: str, directory: Path, reader: bool, prefix: str = "farm",
              extra: tuple[str, ...] = ()) -> Iterator[AclRedis]:
    """redis-server started exactly as the compose service starts it: docker/redis-entrypoint.sh with the config
    from docker/redis, users from environment variables; only port, bind address and folder are overridden."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: the farm's tests need it (python3 tools/dev.py test installs it)")
    directory.mkdir(parents=True, exist_ok=True)
    writer = Credentials("farm", secrets.token_hex(16))
    readonly = Credentials("reader", secrets.token_hex(16)) if reader else None
    env = entrypoint_env(REDIS_WRITER_USER=writer.user, REDIS_WRITER_PASSWORD=writer.password, FARM_PREFIX=prefix,
                         REDIS_ACL_FILE=str(directory / "acl" / "users.acl"))
    if readonly:
        env.update(REDIS_READER_USER=readonly.user, REDIS_READER_PASSWORD=readonly.password)
    port = free_port()
    log_path = directory / "redis.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            ["sh", str(ENTRYPOINT), str(DOCKER / "redis" / conf), "--port", str(port), "--bind", "127.0.0.1",
             "--dir", str(directory), "--daemonize", "no", *extra],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    server = AclRedis(port, directory, directory / "acl" / "users.acl", writer, readonly, process.pid)
    try:
        def ready() -> bool:
            if process.poll() is not None:
                pytest.fail(f"redis-server exited: {log_path.read_text()[-2000:]}")
            with server.client() as c:
                try:
                    return bool(c.ping())
                except redis.ConnectionError:
                    return False

        wait_for(ready, 20, f"redis-server with {conf} to answer PING")
        yield server
    finally:
        terminate(process)


FINGERPRINT = "8:backend16:device-class-text"


def decision(key: str = "key-1") -> DecisionRecord:
    from farm.identity import CacheKey, Candidate
    from farm.policy import AccuracyKey, StackPolicy

    full = CacheKey("operator", "op", FINGERPRINT, key, "ctx", 0, (Candidate("ref"), Candidate("fast")),
                    AccuracyKey.of(StackPolicy())).encode()
    return DecisionRecord(full, 1, 0, "fast", True, 0.5, 100.0, {"run": "r1"})


def assert_refused(call: Any, *args: Any) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        call(*args)

def healthcheck(env: dict[str, str], device: str = "cpu:0") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(HEALTHCHECK), device], capture_output=True, text=True, timeout=60,
                          env={**env, "PYTHON": sys.executable})
