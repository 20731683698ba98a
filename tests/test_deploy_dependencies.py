"""The deployment's dependencies: the floors, the core importing no fleet package, decisions surviving a SIGKILL
of the decisions Redis, and the CPU override of the compose stack.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from deploy_helpers import (
    FINGERPRINT,
    ROOT,
    acl_redis,
    decision,
    raw_compose,
    workers,
)

from farm.stores.redis import RedisDecisions
from farm_fleet.settings import Settings

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
