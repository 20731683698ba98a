"""The fleet's compile stage, the sender's side: whether ``farm worker --compile`` workers serve the ``compile``
queue, and a run's compile jobs sent to them.

Entries travel through the fleet's Redis kernel cache, never through Celery's result backend:
:func:`compile_on_fleet` sends the cache's misses (``farm_fleet.protocol.COMPILE_TASK`` on ``COMPILE_QUEUE``) and
polls the cache for their keys (the worker's side is ``farm_workers.compile``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from farm_fleet.celeryconf import celery_config
from farm_fleet.errors import CompileTimeout
from farm_fleet.protocol import COMPILE_NODE, COMPILE_QUEUE, COMPILE_TASK
from farm_fleet.settings import Settings
from farm_kernels.cuda.compile import CompileJob, CompileSummary, compile_job, tally
from farm_kernels.cuda.kcache import KernelCache, KernelEntry, RedisCache

if TYPE_CHECKING:
    from celery import Celery

BATCH = 4  # jobs per task: a few seconds of NVRTC, so idle compile workers share a space's misses


def _sender(settings: Settings) -> Celery:
    """A Celery app that sends to (and pings) the compile queue; it runs no task."""
    from celery import Celery

    app = Celery("farm-compile", set_as_current=False)
    app.conf.update(celery_config(settings))
    return app


def compile_workers(settings: Settings, timeout: float = 1.0) -> list[str]:
    """The node names of the ``farm worker --compile`` workers answering a Celery ping within ``timeout`` seconds
    (``compile@host``): whether the fleet's compile queue is served now."""
    app = _sender(settings)
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
        app = _sender(settings)
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
