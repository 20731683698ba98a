"""The farm's Celery app (``celery -A farm_workers.app ...``; ``farm flower`` points Flower at it).

Configuration comes from ``farm_fleet.celeryconf`` (JSON only, late ack, prefetch 1, events on). The task
``farm.run_groups`` runs :func:`farm_workers.tasks.run_groups` (a batch of group tasks) in the worker's pool process, whose context (device
client, Redis results) is built on first use in that process, after pinning, so CUDA initializes there only.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals
from celery.exceptions import Reject, SoftTimeLimitExceeded

from farm.runtimes import client_for
from farm_fleet import presence
from farm_fleet.celeryconf import celery_config
from farm_fleet.protocol import GROUP_TASK, PING_TASK
from farm_fleet.settings import Settings
from farm_workers.tasks import DeviceQuarantined, WorkerContext, run_groups

DEVICE_VARIABLE = "FARM_WORKER_DEVICE"
WORKER_ID_VARIABLE = "FARM_WORKER_ID"
KERNELS_VARIABLE = "FARM_KERNELS"

_context: WorkerContext | None = None


def worker_context(settings: Settings) -> WorkerContext:
    """This process's context, created once: the pinned device's client and the shared results store."""
    global _context
    if _context is None:
        from farm.stores.redis import connect
        from farm_fleet.results import RedisResults

        if not settings.redis_url:
            raise RuntimeError("the worker needs FARM_REDIS_URL (decisions and results Redis)")
        redis_client = connect(settings.redis_url, timeout=10.0)
        worker_id = os.environ.get(WORKER_ID_VARIABLE, f"pid{os.getpid()}")

        def quarantine(reason: str) -> None:
            presence.beat(redis_client, settings, worker_id, presence.QUARANTINED)

        kernels = tuple(k for k in os.environ.get(KERNELS_VARIABLE, "").split(",") if k)
        _context = WorkerContext(
            client=client_for(os.environ.get(DEVICE_VARIABLE, "cpu:0")),
            results=RedisResults(redis_client, settings),
            settings=settings,
            worker_id=worker_id,
            kernels=kernels,
            interrupts=(SoftTimeLimitExceeded,),
            on_quarantine=quarantine,
        )
    return _context


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or Settings.from_env()
    app = Celery("farm", set_as_current=False)
    app.conf.update(celery_config(settings))
    app.conf.farm_settings = settings

    # shared=False: each app keeps its own tasks (a second create_app() must not reuse the first one's settings).
    @app.task(name=GROUP_TASK, bind=True, shared=False)
    def run_groups_task(self: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            return run_groups(messages, worker_context(settings))
        except DeviceQuarantined as e:
            # Back to the queue for another worker of the same fingerprint; this one stops consuming.
            raise Reject(f"device quarantined: {e}", requeue=True) from e

    @app.task(name=PING_TASK, shared=False)
    def ping() -> dict[str, Any]:
        """A no-op round trip through the broker and the worker (health checks, the overhead benchmark)."""
        return {"pong": os.environ.get(WORKER_ID_VARIABLE, ""), "pid": os.getpid()}

    return app


def _set_state(state: str) -> None:
    if _context is None or WORKER_ID_VARIABLE not in os.environ:
        return
    if _context.quarantined is not None:
        state = presence.QUARANTINED
    results: Any = _context.results
    presence.beat(results.client, _context.settings, _context.worker_id, state)


@signals.task_prerun.connect
def _busy(**_: Any) -> None:
    _set_state(presence.BUSY)


@signals.task_postrun.connect
def _idle(**_: Any) -> None:
    _set_state(presence.HEALTHY)


app = create_app()
