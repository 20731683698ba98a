"""The deployment files (compose.yaml, .env.example, docker/) checked as far as a machine without Docker allows.

The compose file is validated against the Compose Specification's JSON schema (vendored by check-jsonschema),
and its structure against what docs/deployment.md promises; the Dockerfiles, their locks and the build context.
Images are never built here.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from importlib.resources import files
from pathlib import Path

import pytest
from deploy_helpers import (
    DOCKER,
    ENTRYPOINT,
    OPTIONAL_SECRETS,
    REQUIRED,
    ROOT,
    SECRETS,
    Dockerfile,
    MissingVariable,
    bind_sources,
    compose,
    filled_env,
    raw_compose,
    read_env_file,
    redis_conf,
    services,
    variables_in,
    workers,
)

from farm_fleet.settings import Settings

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
