"""The coordinator's parts (``farm_coordinator.ports.Parts``), wired here (the composition root): a Celery fleet,
or the embedded farm."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from farm.errors import FarmError
from farm_fleet.settings import Settings

if TYPE_CHECKING:  # types only: the parts are imported where they are built
    from farm_coordinator.ports import Parts
    from farm_coordinator.precompile import Precompiler

__all__ = ["celery_parts", "compile_stage", "embedded_parts", "reachable"]


def reachable(settings: Settings) -> None:
    """Fail fast, in one line, when the broker or the decisions Redis cannot be reached."""
    from celery import Celery

    from farm.stores.redis import connect
    from farm_fleet.celeryconf import celery_config

    if settings.redis_url:
        client = connect(settings.redis_url, timeout=5.0)
        try:
            client.ping()
        except Exception as e:
            raise FarmError(f"cannot reach the decisions Redis{_server(settings.redis_url)} (--redis / "
                            f"FARM_REDIS_URL): {e}") from e
        finally:
            client.close()
    app = Celery("farm-check", set_as_current=False)
    app.conf.update(celery_config(settings))
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as e:
        raise FarmError(f"cannot reach the broker{_server(settings.broker_url)} (--broker / FARM_BROKER_URL): {e}") from e
    finally:
        app.close()


def _server(url: str | None) -> str:
    """`` at host:port`` of a server URL (a TLS refusal's message may not name the server), or nothing."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url or "")
        return f" at {parts.hostname}:{parts.port}" if parts.hostname and parts.port else ""
    except ValueError:
        return ""


def celery_parts(settings: Settings) -> Parts:
    """The coordinator's parts for a Celery fleet (broker and Redis from ``settings``, checked reachable)."""
    from celery import Celery

    from farm.stores.redis import RedisDecisions, connect
    from farm_coordinator.bans import RedisBans
    from farm_coordinator.dispatch import CeleryDispatcher
    from farm_coordinator.fleet import RedisFleet
    from farm_coordinator.leases import RedisLeases
    from farm_coordinator.ports import Parts
    from farm_coordinator.runlog import RedisRunLog
    from farm_fleet.celeryconf import celery_config
    from farm_fleet.results import RedisResults

    if not settings.redis_url:
        raise FarmError("--redis (or FARM_REDIS_URL) is required with --broker")
    reachable(settings)
    from farm_coordinator.tasknames import OperationNamedAMQP

    app = Celery("farm-coordinator", set_as_current=False, amqp=OperationNamedAMQP)  # one task name in Flower
    app.conf.update(celery_config(settings))
    client = connect(settings.redis_url, timeout=10.0)
    results = RedisResults(client, settings)
    return Parts(
        fleet=RedisFleet(client, settings),
        dispatcher=CeleryDispatcher(app, results, settings),
        sink=RedisDecisions(client=client, settings=settings),
        leases=RedisLeases(client, settings),
        results=results,
        runlog=RedisRunLog(client, settings),
        bans=RedisBans(client, settings),
    )


def embedded_parts(settings: Settings, devices: tuple[str, ...], cache_dir: Path, kernels: tuple[str, ...]) -> Parts:
    """The embedded farm's parts: local devices, in-process dispatch of the workers' task code, a cache dir."""
    from farm.stores.local import FARM, LocalStore
    from farm_coordinator.dispatch import LocalDispatcher
    from farm_coordinator.fleet import LocalFleet
    from farm_coordinator.ports import Parts
    from farm_fleet.protocol import GroupResult, GroupTask
    from farm_fleet.results import MemoryResults
    from farm_kernels.recorded import client_for, worker_name
    from farm_workers.tasks import WorkerContext, run_group

    results = MemoryResults()
    contexts = {}
    for device in devices:
        client = client_for(device)
        ctx = WorkerContext(client=client, results=results, settings=settings,
                            worker_id=f"local-{worker_name(device, client)}", kernels=kernels)
        contexts[ctx.worker_id] = ctx
    fleet = LocalFleet(list(contexts.values()))

    def execute(task: GroupTask, queue: str) -> GroupResult:
        result = GroupResult.from_dict(run_group(task.to_dict(), fleet.context_for(task, queue)))
        # The coordinator has the result now and, in this process, never sends a group twice (nothing is lost
        # here, and no other coordinator shares these leases): the workers' store need not keep it, so a long run
        # holds no result it has handled.
        results.discard([task.key])
        return result

    # The cache StackTuner(cache_directory=...) reads, written as the farm: its capacity never prunes these records.
    return Parts(fleet=fleet, dispatcher=LocalDispatcher(execute), sink=LocalStore(cache_dir, owner=FARM))


def compile_stage(settings: Settings, fleet: bool, arch: str | None, kernel_cache_dir: Path | None = None,
                  devices: tuple[str, ...] = ()) -> Precompiler:
    """The run's compile stage (``farm_coordinator.precompile``) for ``arch`` (None: each CUDA fingerprint's). A
    fleet run stores into the fleet's kernel cache, the Redis of ``settings`` (on the ``compile`` queue when
    ``farm worker --compile`` serves it, else a process pool here); the embedded farm, or ``kernel_cache_dir``,
    into that directory ($FARM_KERNEL_CACHE, else ~/.cache/farm/kernels), which the embedded farm's CUDA
    ``devices`` then load their cubins from."""
    import os

    from farm_coordinator import precompile
    from farm_kernels.cuda.compile import use_kernel_cache
    from farm_kernels.cuda.kcache import open_cache

    processes = len(os.sched_getaffinity(0))
    if fleet and kernel_cache_dir is None and settings.redis_url:
        cache = open_cache(redis_url=settings.redis_url)
        compiler = precompile.fleet_compiler(settings, cache, processes)
    else:
        cache = open_cache(kernel_cache_dir)
        compiler = precompile.local_compiler(cache, processes)
        if not fleet and any(d.startswith("cuda") for d in devices):
            use_kernel_cache(cache)
    return precompile.stage(compiler, arch, cache.describe())
