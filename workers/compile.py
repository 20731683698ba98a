"""The fleet's compile stage: a ``compile`` Celery queue served by ``farm worker --compile`` on any CPU machine.

A task (``farm.compile_kernels``) carries a batch of :class:`~farm_kernels.cuda.compile.CompileJob` JSON objects;
the worker compiles each with NVRTC (no GPU), judges its resources and stores the entry in the fleet's Redis
kernel cache (``farm_kernels.cuda.kcache.RedisCache`` on the decisions Redis). Entries travel through that cache,
never through Celery's result backend: :func:`compile_on_fleet` sends the cache's misses and polls the cache
for their keys, so a redelivered task (late ack, a worker lost mid-batch) only rewrites the same content.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from celery import Celery

from farm_fleet.celeryconf import celery_config
from farm_fleet.errors import CompileTimeout
from farm_fleet.settings import Settings
from farm_kernels.cuda.compile import CompileJob, CompileSummary, compile_job, tally
from farm_kernels.cuda.kcache import KernelCache, KernelEntry, RedisCache

COMPILE_TASK = "farm.compile_kernels"
COMPILE_QUEUE = "farm.compile"
COMPILE_NODE = "compile@"  # the node name prefix of a compile worker
BATCH = 4  # jobs per task: a few seconds of NVRTC, so idle compile workers share a space's misses

log = logging.getLogger(__name__)


def create_compile_app(settings: Settings) -> Celery:
    """The Celery app of a compile worker (and of a sender: :func:`compile_on_fleet` uses it to send)."""
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


def compile_workers(settings: Settings, timeout: float = 1.0) -> list[str]:
    """The node names of the ``farm worker --compile`` workers answering a Celery ping within ``timeout`` seconds
    (``compile@host``): whether the fleet's compile queue is served now."""
    app = create_compile_app(settings)
    try:
        replies = app.control.ping(timeout=timeout) or []
    finally:
        app.close()
    return sorted(name for reply in replies for name in reply if str(name).startswith(COMPILE_NODE))


def compile_on_fleet(jobs: Sequence[CompileJob], settings: Settings, timeout: float = 600.0,
                     cache: KernelCache | None = None) -> CompileSummary:
    """Compile ``jobs`` on the fleet's compile workers: the Redis cache's misses go to the ``compile`` queue in
    batches; this waits (polling the cache, deadline ``timeout``) until every entry is stored, then returns the
    summary as :func:`~farm_kernels.cuda.compile.compile_all` would. :class:`CompileTimeout` names what is missing."""
    redis_cache = cache or RedisCache(settings.redis_url or "")
    start = time.perf_counter()
    misses = list({job.key: job for job in jobs if redis_cache.get(job.key) is None}.values())
    if misses:
        app = create_compile_app(settings)
        for i in range(0, len(misses), BATCH):
            app.send_task(COMPILE_TASK, args=[[job.to_json() for job in misses[i:i + BATCH]]], queue=COMPILE_QUEUE)
        waiting = {job.key: job for job in misses}
        deadline = time.monotonic() + timeout
        while waiting:
            for key in [k for k in waiting if redis_cache.get(k) is not None]:
                waiting.pop(key)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(sorted(j.candidate for j in waiting.values())[:5])
                raise CompileTimeout(f"{len(waiting)} kernels not compiled after {timeout:.0f} s on queue "
                                     f"{COMPILE_QUEUE} (is a `farm worker --compile` running?): {names}")
            if waiting:
                time.sleep(0.2)  # polling the cache: the workers' entries are the only completion signal
    entries: dict[str, KernelEntry] = {}
    for job in jobs:
        found = entries.get(job.key) or redis_cache.get(job.key)
        if found is None:  # evicted between the poll and now: compile it here rather than report a hole
            found = compile_job(job)
            redis_cache.put(found)
        entries[job.key] = found
    summary = tally(jobs, entries, {job.key for job in misses})
    summary.seconds = time.perf_counter() - start
    return summary
