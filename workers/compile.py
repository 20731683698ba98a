"""The fleet's compile stage, the worker's side: a ``compile`` Celery queue served by ``farm worker --compile`` on
any CPU machine.

A task (``farm.compile_kernels``) carries a batch of :class:`~farm_kernels.cuda.compile.CompileJob` JSON objects;
the worker compiles each with NVRTC (no GPU), judges its resources and stores the entry in the fleet's Redis
kernel cache (``farm_kernels.cuda.kcache.RedisCache`` on the decisions Redis). Entries travel through that cache,
never through Celery's result backend: the sender (``farm_coordinator.compilefleet``) sends the cache's misses and
polls the cache for their keys, so a redelivered task (late ack, a worker lost mid-batch) only rewrites the same
content. The task and queue names are the wire protocol's (``farm_fleet.protocol``).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from farm_fleet.celeryconf import celery_config
from farm_fleet.protocol import COMPILE_NODE, COMPILE_QUEUE, COMPILE_TASK
from farm_fleet.settings import Settings
from farm_kernels.cuda.compile import CompileJob, compile_job
from farm_kernels.cuda.kcache import KernelCache, RedisCache

log = logging.getLogger(__name__)


def create_compile_app(settings: Settings) -> Celery:
    """The Celery app of a compile worker."""
    app = Celery("farm-compile", set_as_current=False)
    app.conf.update(celery_config(settings))
    redis_url = settings.redis_url or ""

    def compile_kernels(jobs: list[dict[str, Any]]) -> int:
        return compile_batch(jobs, RedisCache(redis_url))

    app.task(name=COMPILE_TASK, shared=False, ignore_result=True)(compile_kernels)  # not a decorator: Celery is untyped
    return app


def compile_batch(jobs: list[dict[str, Any]], cache: KernelCache) -> int:
    """The compile task's body: compile and store each job the cache lacks (another worker, or an earlier
    delivery of this task, may have stored it already); the number of jobs compiled here."""
    done = 0
    for data in jobs:
        job = CompileJob.from_json(data)
        if cache.get(job.key) is None:
            cache.put(compile_job(job))
            done += 1
    return done


def run_compile_worker(settings: Settings, concurrency: int, loglevel: str = "INFO") -> int:
    """Serve the ``compile`` queue with ``concurrency`` prefork processes until stopped; the exit code."""
    if not settings.broker_url or not settings.redis_url:
        from farm.errors import ConfigError

        raise ConfigError("farm worker --compile", "--broker/--redis", None, "both the broker URL and the Redis URL are required")
    app = create_compile_app(settings)
    app.worker_main(argv=["worker", "-Q", COMPILE_QUEUE, f"--concurrency={concurrency}", "--pool=prefork",
                          f"--loglevel={loglevel}", "--without-mingle", "--without-gossip",
                          f"--hostname={COMPILE_NODE}%h"])
    return 0
