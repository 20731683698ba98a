"""The deployment files (compose.yaml, .env.example, docker/) checked as far as a machine without Docker allows.

The compose file is validated against the Compose Specification's JSON schema (vendored by check-jsonschema),
and its structure against what docs/deployment.md promises. The Redis configurations and the ACL users are proven
on real redis-server processes started by docker/redis-entrypoint.sh itself (the compose services' entrypoint),
and a real `farm worker` and coordinator run through those ACL users. Images are never built here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, fields
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from farm_helpers import WORKER_ENV, write_catalog
from redis.backoff import NoBackoff
from redis.retry import Retry
from servers import farm_env, free_port, start_worker, wait_for, wait_worker_ready

from farm.stores.base import DecisionRecord
from farm.stores.redis import RedisDecisions
from farm_fleet.settings import Settings

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


# ---------------------------------------------------------------------------------------- compose file tests


def test_the_compose_file_follows_the_compose_specification():
    from jsonschema.validators import validator_for

    schema = json.loads(files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text())
    validator = validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []
    # The schema is strict enough to catch a misspelt service key.
    assert not validator.is_valid({"services": {"x": {"image": "redis", "portz": ["5555:5555"]}}})


def test_every_variable_the_compose_file_uses_is_documented_in_env_example_and_no_other():
    used = variables_in(raw_compose()) | variables_in(raw_compose("compose.cpu.yaml"))
    documented = set(read_env_file(ROOT / ".env.example"))
    assert used - documented == set(), "used in compose.yaml but missing from .env.example"
    assert documented - used == set(), "documented in .env.example but unused by compose.yaml"


def test_the_unedited_env_example_holds_no_secret_and_cannot_start_the_stack():
    example = read_env_file(ROOT / ".env.example")
    assert {name: example[name] for name in REQUIRED} == dict.fromkeys(REQUIRED, "")
    assert {n for n in example if "PASSWORD" in n or "AUTH" in n} <= SECRETS | OPTIONAL_SECRETS
    assert {name: example[name] for name in OPTIONAL_SECRETS} == dict.fromkeys(OPTIONAL_SECRETS, "")
    missing = set()
    for name in REQUIRED:
        env = {**filled_env(), name: ""}
        with pytest.raises(MissingVariable) as refused:
            compose(env)
        missing.add(str(refused.value).split(":")[0])
    assert missing == REQUIRED


def test_every_farm_setting_reaches_the_farm_services_from_the_env_file():
    expected = {f"FARM_{f.name.upper()}" for f in fields(Settings)}
    for name in ("coordinator", *workers()):
        environment = services()[name]["environment"]
        assert expected <= set(environment), name
    env = filled_env()
    worker = services()["worker-gpu0"]["environment"]
    assert worker["FARM_BROKER_URL"] == (f"redis://{env['BROKER_REDIS_USER']}:{env['BROKER_REDIS_PASSWORD']}"
                                         "@redis-broker:6379/0")
    assert worker["FARM_REDIS_URL"] == (f"redis://{env['DECISIONS_WRITER_USER']}:{env['DECISIONS_WRITER_PASSWORD']}"
                                        "@redis-decisions:6379/0")
    # An empty value means the default (Settings.from_env skips empty variables).
    assert Settings.from_env({k: v for k, v in worker.items() if k.startswith("FARM_")}).visibility_timeout == (
        Settings().visibility_timeout)


def test_every_service_is_built_from_docker_or_runs_redis_with_its_files_from_docker():
    for name, service in services().items():
        if "build" in service:
            assert Path(ROOT / service["build"]["context"]).resolve() == ROOT, name
            dockerfile = (ROOT / service["build"]["dockerfile"]).resolve()
            assert dockerfile.parent == DOCKER and dockerfile.is_file(), name
            assert service["image"], name
        else:
            assert re.fullmatch(r"redis:7\.\d+(\.\d+)?-\w+", service["image"]), name
            sources = bind_sources(service)
            assert sources and all(s.is_file() and DOCKER in s.parents for s in sources), name
    builds = {name: s["build"]["dockerfile"] for name, s in services().items() if "build" in s}
    assert builds == {"worker-gpu0": "docker/worker.Dockerfile", "worker-gpu1": "docker/worker.Dockerfile",
                      "flower": "docker/coordinator.Dockerfile", "coordinator": "docker/coordinator.Dockerfile"}


def test_only_flower_publishes_a_port_and_only_on_loopback():
    published = {name: s["ports"] for name, s in services().items() if s.get("ports")}
    assert set(published) == {"flower"}
    assert [(p["host_ip"], p["target"]) for p in published["flower"]] == [("127.0.0.1", 5555)]
    assert all(s.get("network_mode") != "host" for s in services().values())


def test_each_worker_reserves_its_own_gpu_and_addresses_it_as_cuda0():
    found = {}
    for name, service in workers().items():
        (reservation,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert reservation["driver"] == "nvidia" and "gpu" in reservation["capabilities"], name
        (device,) = reservation["device_ids"]
        assert name == f"worker-gpu{device}"
        # The one reserved GPU is index 0 inside the container; farm worker sets CUDA_VISIBLE_DEVICES from it.
        assert service["command"] == ["farm", "worker", "--device", "cuda:0"], name
        found[device] = service["hostname"]
    assert sorted(found) == ["0", "1"]
    assert len(set(found.values())) == len(found), "worker host names (hence worker ids) must differ"
    assert all(s.get("depends_on", {}).get("redis-decisions", {}).get("condition") == "service_healthy"
               for s in workers().values())


def test_both_redis_servers_load_their_config_from_docker_redis_with_an_append_only_file_and_no_eviction():
    for service_name, conf in (("redis-broker", "broker.conf"), ("redis-decisions", "decisions.conf")):
        service = services()[service_name]
        assert service["entrypoint"] == ["/bin/sh", "/farm/redis-entrypoint.sh"]
        assert service["command"] == [f"/farm/redis/{conf}", "--dir", "/data"]
        assert f"{service_name.removeprefix('redis-')}-data:/data" in service["volumes"]
        mounted = {v.split(":")[1]: (ROOT / v.split(":")[0]).resolve() for v in service["volumes"] if v[0] == "."}
        assert mounted == {"/farm/redis-entrypoint.sh": ENTRYPOINT, f"/farm/redis/{conf}": DOCKER / "redis" / conf}
        assert service["environment"]["REDIS_WRITER_PASSWORD"], service_name
        values = redis_conf(conf)
        assert values["appendonly"] == "yes" and values["maxmemory-policy"] == "noeviction", conf
        assert not {"requirepass", "user", "aclfile"} & set(values), f"{conf}: users come from the env file only"
    assert set(services()["redis-decisions"]["environment"]) >= {"REDIS_READER_USER", "REDIS_READER_PASSWORD"}
    assert "REDIS_READER_USER" not in services()["redis-broker"]["environment"]


def test_flower_runs_farm_flower_with_basic_authentication_from_the_env_file():
    flower = raw_compose()["services"]["flower"]
    assert flower["command"][:2] == ["farm", "flower"]
    assert flower["environment"]["FARM_FLOWER_BASIC_AUTH"].startswith("${FARM_FLOWER_BASIC_AUTH:?")
    assert services()["flower"]["environment"]["FARM_BROKER_URL"].endswith("@redis-broker:6379/0")


def test_the_coordinator_runs_only_on_demand_with_the_catalog_folder_mounted_read_only():
    coordinator = services()["coordinator"]
    assert coordinator["profiles"] == ["tools"]
    assert coordinator["command"][:2] == ["farm", "tune"]
    assert any(v.endswith(":/catalog:ro") for v in coordinator["volumes"])


# ------------------------------------------------------------------------------------------------ Dockerfiles


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


@pytest.mark.parametrize("name", ["worker.Dockerfile", "coordinator.Dockerfile"])
def test_each_dockerfile_installs_locked_dependencies_below_the_source_runs_as_non_root_and_has_a_health_check(name):
    dockerfile = Dockerfile.read(DOCKER / name)
    user = dockerfile.all("USER")[-1]
    assert user not in ("root", "0") and not user.startswith("0:"), user
    (check,) = dockerfile.all("HEALTHCHECK")
    assert "CMD" in check and "--version" not in check, "a health check must test something real"
    assert re.search(r"docker/\S+-healthcheck\.sh", " ".join(dockerfile.all("COPY")))
    copied = " ".join(dockerfile.all("COPY"))
    for part in ("pyproject.toml", "farm", "kernels", "workers", "coordinator", "fleet", "cli"):
        assert re.search(rf"(^|\s){part}(\s|$)", copied), f"{name} does not copy {part} from the repository"
    order = [w for w, _ in dockerfile.instructions]
    runs = [(i, r) for i, (w, r) in enumerate(dockerfile.instructions) if w == "RUN"]
    # Dependencies: only from hashed lock files, in a layer below the first COPY of the source.
    deps = [i for i, r in runs if re.search(r"pip install --require-hashes --no-deps -r \S+\.lock", r)]
    project = [i for i, r in runs if re.search(r"pip install --no-deps --no-build-isolation /src(\s|$)", r)]
    assert deps and len(project) == 1, f"{name}: locked dependencies, then the project without resolution"
    first_source = next(i for i, (w, r) in enumerate(dockerfile.instructions) if w == "COPY" and "/src/farm" in r)
    assert max(deps) < first_source < project[0]
    # No download of Python itself (uv python install) and no unpinned resolution of dependencies.
    text = " ".join(r for _, r in runs)
    assert "uv python" not in text and not re.search(r"pip install [^&]*\[farm", text)
    # USER comes after the install: the installed files belong to root, the process does not.
    assert order.index("USER") > project[0]


@pytest.mark.parametrize(("name", "arg"), [("worker.Dockerfile", "CUDA_IMAGE"), ("coordinator.Dockerfile", "PYTHON_IMAGE")])
def test_each_dockerfile_takes_its_base_image_from_a_build_argument_that_compose_passes(name, arg):
    dockerfile = Dockerfile.read(DOCKER / name)
    assert dockerfile.all("FROM") == [f"${{{arg}}}"], "one stage, its base from the build argument"
    assert not any(line.startswith("# syntax=") for line in (DOCKER / name).read_text().splitlines()), (
        "a # syntax= line makes BuildKit pull the dockerfile frontend")
    args = {service: s["build"].get("args", {}) for service, s in services().items()
            if s.get("build", {}).get("dockerfile") == f"docker/{name}"}
    assert args and all(arg in a for a in args.values()), args


def lock_pins(name: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"^([a-z0-9][a-z0-9._-]*)==(\S+) \\$",
                                                 (ROOT / "requirements" / name).read_text(), re.M))


@pytest.mark.parametrize(("lock", "extras"), [("farm.lock", ("farm",)), ("cuda.lock", ("farm", "cuda")),
                                              ("cuda13.lock", ("farm", "cuda13"))])
def test_each_lock_pins_every_requirement_within_the_declared_range_with_hashes(lock, extras):
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = lock_pins(lock)
    text = (ROOT / "requirements" / lock).read_text()
    assert text.count("==") == len(pins) and text.count("--hash=sha256:") >= len(pins), "every pin has hashes"
    wanted = list(project["dependencies"]) + [r for e in extras for r in project["optional-dependencies"][e]]
    for requirement in map(Requirement, wanted):
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{lock} lacks {name}: regenerate it with python3 tools/dev.py lock"
        assert requirement.specifier.contains(pins[name]), f"{lock}: {name}=={pins[name]} outside {requirement}"
    assert "packaging" in pins and "async-timeout" in pins  # kombu's Redis transport; redis-py on Python < 3.11.3
    assert "setuptools" in lock_pins("build.lock")


def test_the_worker_image_pairs_a_cuda_12_runtime_base_with_the_cupy_cuda12x_lock():
    dockerfile = Dockerfile.read(DOCKER / "worker.Dockerfile")
    base = dockerfile.args["CUDA_IMAGE"]
    m = re.fullmatch(r"nvidia/cuda:(\d+)\.\d+(\.\d+)?-runtime-\S+", base)
    assert m, base
    assert dockerfile.args["LOCK"] == "requirements/cuda.lock"
    assert any(name == f"cupy-cuda{m[1]}x" for name in lock_pins("cuda.lock"))
    assert any(name == "cupy-cuda13x" for name in lock_pins("cuda13.lock"))
    assert not any(name.startswith("cupy") for name in lock_pins("farm.lock"))
    assert "worker-healthcheck.sh" in " ".join(dockerfile.all("COPY")) + dockerfile.all("HEALTHCHECK")[0]
    worker = raw_compose()["x-worker"]["build"]["args"]
    assert worker["CUDA_IMAGE"].endswith(f":-{base}}}") and worker["LOCK"].endswith(":-requirements/cuda.lock}")


def test_the_coordinator_image_has_no_cuda():
    dockerfile = Dockerfile.read(DOCKER / "coordinator.Dockerfile")
    text = " ".join(rest for _, rest in dockerfile.instructions) + " ".join(dockerfile.args.values())
    assert "nvidia" not in text and "cupy" not in text and "cuda]" not in text and ",cuda" not in text


def test_the_docker_build_context_excludes_the_env_file_and_local_environments():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".env", ".env.*", "!.env.example", ".venv", ".git"} <= ignored


# ------------------------------------------------------------------------------------- the Redis entrypoint


def entrypoint_env(**values: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **values}


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"REDIS_WRITER_USER": "farm"}, "REDIS_WRITER_PASSWORD is empty"),
        ({"REDIS_WRITER_USER": "farm", "REDIS_WRITER_PASSWORD": "short"}, "shorter than 16"),
        ({"REDIS_WRITER_USER": "farm", "REDIS_WRITER_PASSWORD": "has@and:in-a-url-1234"}, "REDIS_WRITER_PASSWORD may"),
        ({"REDIS_WRITER_USER": "default", "REDIS_WRITER_PASSWORD": "a" * 32}, "must not be 'default'"),
        ({"REDIS_WRITER_USER": "farm", "REDIS_WRITER_PASSWORD": "a" * 32, "REDIS_READER_USER": "reader"},
         "REDIS_READER_PASSWORD is empty"),
    ],
)
def test_the_redis_entrypoint_refuses_missing_weak_or_url_unsafe_credentials(tmp_path, values, named):
    acl = tmp_path / "acl" / "users.acl"
    done = subprocess.run(["sh", str(ENTRYPOINT), str(DOCKER / "redis" / "decisions.conf")], capture_output=True,
                          text=True, timeout=30, env=entrypoint_env(REDIS_ACL_FILE=str(acl), **values))
    assert done.returncode == 2
    assert named in done.stderr
    assert not acl.exists()


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
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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


@pytest.mark.servers
def test_the_decisions_redis_gives_the_writer_publication_and_the_reader_decisions_only(tmp_path):
    settings = Settings(prefix="farm")
    with acl_redis("decisions.conf", tmp_path, reader=True) as server:
        record = decision()
        with server.client() as writer:
            store = RedisDecisions(client=writer, settings=settings)
            assert store.publish(record, FINGERPRINT, "p1") == (True, "new")  # FUNCTION LOAD + FCALL farm_publish
            writer.set("farm:result:r1:p1:g0", "{}")
            # The writer is no administrator: it cannot reconfigure, wipe or enumerate the server.
            assert_refused(writer.config_set, "appendonly", "no")
            assert_refused(writer.flushall)
            assert_refused(writer.keys, "*")
            assert_refused(writer.acl_list)

        reader = RedisDecisions(server.url(server.reader), settings=settings)
        try:
            assert reader.get(record.cache_key) == record
            digest = reader._digest(record.cache_key)
            assert reader.fingerprints() == {digest: FINGERPRINT}
            assert list(reader.records(digest)) == [record]
            client = reader.client
            decisions_key = settings.decisions_key(digest)
            assert_refused(client.hset, decisions_key, "x", "y")
            assert_refused(client.hdel, decisions_key, "x")
            assert_refused(client.delete, decisions_key)
            assert_refused(client.fcall, "farm_publish", 0)
            assert_refused(client.get, "farm:result:r1:p1:g0")
            assert_refused(client.hget, settings.problems_key(digest), "p1")
            assert_refused(client.set, "farm:decisions:new", "x")
            assert_refused(client.publish, "farm:channel", "x")
            assert client.ping()
        finally:
            reader.client.close()

        # Nobody gets in as the default user, with or without a password.
        with server.client(None) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        with server.client(Credentials("default", "anything")) as default, pytest.raises(redis.AuthenticationError):
            default.ping()
        with server.client(Credentials(server.writer.user, "wrong" * 4)) as wrong, \
                pytest.raises(redis.AuthenticationError):
            wrong.ping()

        # The ACL file holds password hashes only, and the append-only file is on.
        acl = server.acl_file.read_text()
        assert server.writer.password not in acl and server.reader.password not in acl
        assert acl.count(" #") == 2
        assert list((tmp_path / "appendonlydir").glob("*.aof"))


@pytest.mark.servers
def test_the_broker_redis_knows_only_the_farm_user(tmp_path):
    with acl_redis("broker.conf", tmp_path, reader=False) as server:
        with server.client() as writer:
            writer.lpush("farm.default", "message")
            assert writer.brpop(["farm.default"], timeout=1) == ("farm.default", "message")
        with server.client(Credentials("reader", "x" * 32)) as reader, pytest.raises(redis.AuthenticationError):
            reader.ping()
        with server.client(None) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        assert list((tmp_path / "appendonlydir").glob("*.aof"))


@pytest.mark.servers
@pytest.mark.parametrize("conf", ["broker.conf", "decisions.conf"])
def test_a_full_redis_refuses_writes_instead_of_evicting(tmp_path, conf):
    # Only maxmemory is lowered so that the limit is reached in a moment; the policy is the file's.
    with acl_redis(conf, tmp_path, reader=False, extra=("--maxmemory", "4mb")) as server, server.client() as c:
        value = "x" * 65536
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(1000):
                c.set(f"farm:filler:{i}", value)
        assert c.exists("farm:filler:0") == 1


# ------------------------------------------------------------- the whole farm through the ACL users

SCALE = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 300, dtype = "float64" }]
"""


def healthcheck(env: dict[str, str], device: str = "cpu:0") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(HEALTHCHECK), device], capture_output=True, text=True, timeout=60,
                          env={**env, "PYTHON": sys.executable})


@pytest.mark.servers
def test_a_worker_and_the_coordinator_run_through_the_acl_users_and_an_inference_client_reads_with_the_reader(
        tmp_path):
    prefix = f"t{secrets.token_hex(4)}"
    with acl_redis("broker.conf", tmp_path / "broker", reader=False) as broker, \
            acl_redis("decisions.conf", tmp_path / "decisions", reader=True, prefix=prefix) as decisions:
        env = farm_env({**WORKER_ENV, "FARM_PREFIX": prefix})
        worker = start_worker("cpu:0", broker.url(), decisions.url(), tmp_path / "worker", env)
        check_env = {**env, "FARM_REDIS_URL": decisions.url()}
        try:
            with decisions.client() as writer:
                wait_worker_ready(worker, writer, prefix)
            ok = healthcheck(check_env)
            assert ok.returncode == 0, ok.stdout + ok.stderr
            assert "healthy" in ok.stdout

            # The coordinator's command in the compose file, with the URLs (writer users) from the environment.
            catalog = write_catalog(tmp_path / "c.toml", SCALE)
            run = subprocess.run(
                [sys.executable, "-m", "farm_cli", "tune", str(catalog), "--kernels", "farm_testops", "--json"],
                capture_output=True, text=True, timeout=120, cwd=tmp_path,
                env={**env, "FARM_BROKER_URL": broker.url(), "FARM_REDIS_URL": decisions.url()},
            )
            assert run.returncode == 0, run.stdout + run.stderr
            (published,) = json.loads(run.stdout)["decisions"]
            assert published["error"] is None and published["record"]["name"] == "vectorized"
        finally:
            worker.stop()
        # Stopped: its presence record is withdrawn, and the health check says so.
        down = healthcheck(check_env)
        assert down.returncode == 1 and "no presence record" in down.stderr

        # An inference machine, with the read-only user, hits the published decision.
        reader = RedisDecisions(decisions.url(decisions.reader), settings=Settings(prefix=prefix))
        try:
            found = reader.get(published["record"]["cache_key"])
            assert found is not None and found.to_dict() == published["record"]
        finally:
            reader.client.close()


# ------------------------------------------------------------------------------------------------ dependencies


def floors() -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import dev
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return dict(pin.split("==") for pin in dev.floor_pins())


def test_the_floors_cover_the_features_used_and_agree_with_kombus_own_requirements():
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.version import Version

    pins = floors()
    assert {"celery", "kombu", "redis", "pyarrow", "flower", "numpy", "click", "rich"} <= set(pins)
    if "unacked_restore_interval" in (ROOT / "fleet" / "celeryconf.py").read_text():
        assert Version(pins["kombu"]) >= Version("5.7"), "kombu 5.6 has no unacked_restore_interval option"
    extra = [Requirement(r) for r in importlib.metadata.requires("kombu") or [] if 'extra == "redis"' in r]
    redis_range = next(r.specifier for r in extra if r.name == "redis")
    assert redis_range.contains(pins["redis"]), f"redis floor {pins['redis']} outside kombu[redis]'s {redis_range}"
    assert {r.name for r in extra} >= {"redis", "packaging"}
    import tomllib

    farm_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["farm"]
    assert any(r.startswith("celery[redis]") for r in farm_extra), "kombu's Redis transport needs the redis extra"


def test_python_dash_m_farm_runs_the_cli_while_importing_the_core_loads_no_fleet_package(tmp_path):
    done = subprocess.run([sys.executable, "-m", "farm", "--version"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=60)
    assert done.returncode == 0 and "version 0.1.0" in done.stdout, done.stderr
    # farm/__main__.py is an entry point (run by `python -m farm`, never by `import farm`): the core's own modules
    # load no fleet package, celery, kombu or flower.
    code = ("import pkgutil, importlib, sys, farm\n"
            "for m in pkgutil.walk_packages(farm.__path__, 'farm.'):\n"
            "    if m.name != 'farm.__main__': importlib.import_module(m.name)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('farm_fleet', 'farm_workers', "
            "'farm_coordinator', 'farm_cli', 'celery', 'kombu', 'flower')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.servers
def test_published_decisions_survive_a_sigkill_of_the_decisions_redis_through_its_append_only_file(tmp_path):
    """FCALL farm_publish reaches the append-only file as a MULTI/EXEC block, replayed as the default user: the
    entrypoint must leave that (disabled) user the permissions to replay it."""
    import signal

    settings = Settings()
    # appendfsync always: each write is on disk when it returns (everysec would need a wait; the replay is the same).
    with acl_redis("decisions.conf", tmp_path, reader=False, extra=("--appendfsync", "always")) as server, \
            server.client() as writer:
        store = RedisDecisions(client=writer, settings=settings)
        records = [decision(f"key-{i}") for i in range(3)]
        for i, record in enumerate(records):
            assert store.publish(record, FINGERPRINT, f"p{i}") == (True, "new")
        os.kill(server.pid, signal.SIGKILL)  # no shutdown save: only the append-only file remains
    with acl_redis("decisions.conf", tmp_path, reader=False) as server, server.client() as writer:
        store = RedisDecisions(client=writer, settings=settings)
        assert [store.get(r.cache_key) for r in records] == records
        assert "NOPERM" not in (tmp_path / "redis.log").read_text()


def test_the_cpu_override_drops_every_gpu_reservation_and_runs_the_workers_on_cpu0_from_the_cuda_free_lock():
    override = raw_compose("compose.cpu.yaml")["services"]
    assert set(override) == set(workers())
    for name, service in override.items():
        assert "deploy" in service and service["deploy"] is None, f"{name}: deploy: !reset null"
        assert service["command"] == ["farm", "worker", "--device", "cpu:0"]
        assert service["build"]["args"]["LOCK"] == "requirements/farm.lock"
        assert service["build"]["dockerfile"] == "docker/worker.Dockerfile"
        assert service["healthcheck"]["test"][-1] == "cpu:0"
