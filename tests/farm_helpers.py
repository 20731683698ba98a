"""Helpers for the farm's real-process tests: a fleet of `farm worker` processes on a private redis-server."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers import RedisServer, WorkerProcess, farm_env, start_worker, wait_worker_ready

from farm_fleet.settings import Settings

# Small limits so a hung candidate is interrupted in seconds and a lost task is redelivered in well under a minute.
WORKER_ENV = {
    "FARM_SOFT_LIMIT_FLOOR": "3",
    "FARM_VISIBILITY_TIMEOUT": "15",
    "FARM_HEARTBEAT_SECONDS": "1",
    "FARM_HEARTBEAT_TTL": "6",
}


@dataclass
class Fleet:
    redis: RedisServer
    settings: Settings
    directory: Path
    env: dict[str, str]
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def broker(self) -> str:
        return self.redis.url(0)

    @property
    def results_url(self) -> str:
        return self.redis.url(1)

    def client(self) -> Any:
        return self.redis.client(1)

    def start(self, device: str) -> WorkerProcess:
        worker = start_worker(device, self.broker, self.results_url, self.directory, self.env)
        self.workers.append(worker)
        wait_worker_ready(worker, self.client(), self.settings.prefix)
        return worker

    def coordinator(self) -> Any:
        """The coordinator's parts on this farm (``farm_coordinator.ports.Parts``) for ``run.tune``."""
        from farm_cli import celery_parts

        return celery_parts(self.settings)


@contextlib.contextmanager
def fleet(redis: RedisServer, directory: Path, devices: tuple[str, ...]) -> Iterator[Fleet]:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    redis.client(0).flushall()
    env = farm_env({**WORKER_ENV, "FARM_PREFIX": prefix})
    settings = Settings.from_env(env, broker_url=redis.url(0), redis_url=redis.url(1))
    f = Fleet(redis, settings, directory, env)
    try:
        for device in devices:
            f.start(device)
        yield f
    finally:
        for worker in f.workers:
            worker.stop()


# The farm's own behaviour is under test here, not noise on a loaded 2-core machine: the MAD limit is relaxed.
POLICY = "samples = 5\nwarmups = 1\nbudget = 2.0\nmax_relative_mad = 1.0\n"


def write_catalog(path: Path, problems: str, policy: str = POLICY) -> Path:
    path.write_text(f"[policy]\n{policy}\n{problems}")
    return path


def runtime_select(catalog: Path, kernels: str, operation: str, spec: dict[str, Any], cache: Path) -> Any:
    """What an application on this machine gets for ``operation`` on ``spec`` from the local cache ``cache`` the
    embedded farm wrote (under the catalog's policy): a SimpleNamespace of the decision, the tuner, the
    candidate functions and the inputs."""
    from types import SimpleNamespace

    import farm
    from farm.adapter import RuntimeTrials, prepare
    from farm_coordinator.catalog import load_catalog
    from farm_kernels import registry

    registry.ensure_loaded((kernels,))
    op = registry.get(operation)
    policy = load_catalog(catalog, (kernels,)).policy
    tuner = farm.StackTuner(policy, cache_directory=cache)
    client = farm.HostClient(0)
    inputs = op.build(spec, client)
    prepared = prepare(tuner, op.name, "cpu", client, op.host, inputs)
    decision = tuner.select_request(prepared.request, RuntimeTrials(client, op.host, inputs, prepared.indices,
                                                                    policy.timing))
    return SimpleNamespace(decision=decision, tuner=tuner, fns=prepared.fns, inputs=inputs)
