"""The farm's Celery app (``celery -A farm_workers.app ...``; ``farm flower`` points Flower at it).

Configuration comes from ``farm_fleet.celeryconf`` (JSON only, late ack, prefetch 1, events on). The task
``farm.run_groups`` runs :func:`farm_workers.tasks.run_groups` (a batch of group tasks) in the worker's pool process.
Each app owns its worker side (:class:`FarmWorker`, :func:`farm_worker`): its settings, and the context its tasks run
in (device client, Redis results), built on first use in the pool process, after pinning, so CUDA initializes there
only.

Results travel one way: through the farm's results store (``farm_fleet.results``), never Celery's result backend
(the group task ignores results). Faults:

- a results-store outage inside a task is retried with back-off (``FARM_STORE_RETRY_SECONDS``); past that the
  task is sent again by Celery's retry with a growing countdown, at most ``FARM_MAX_ATTEMPTS`` times, and never
  acknowledged as done;
- a task that ends in an error (the hard time limit among them: Celery calls ``on_failure`` in the worker's main
  process) records a failed result for each of its groups that has none, so the coordinator learns it at once.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery import Celery, Task, current_app, signals
from celery.exceptions import MaxRetriesExceededError, Reject, SoftTimeLimitExceeded

from farm_fleet import presence
from farm_fleet.celeryconf import celery_config
from farm_fleet.errors import DeviceQuarantined, GroupsFailed, StoreUnavailable
from farm_fleet.protocol import (
    GROUP_TASK,
    PING_TASK,
    STATUS_OK,
    GroupKey,
    GroupResult,
    GroupTask,
    ProtocolError,
)
from farm_fleet.results import RedisResults, ResultsStore, Runner
from farm_fleet.settings import Settings
from farm_kernels import recorded
from farm_workers.tasks import WorkerContext, run_groups

DEVICE_VARIABLE = "FARM_WORKER_DEVICE"
WORKER_ID_VARIABLE = "FARM_WORKER_ID"
KERNELS_VARIABLE = "FARM_KERNELS"

log = logging.getLogger(__name__)

__all__ = ["DEVICE_VARIABLE", "KERNELS_VARIABLE", "WORKER_ID_VARIABLE", "FarmWorker", "app", "create_app",
           "farm_worker"]


def _worker_id() -> str:
    return os.environ.get(WORKER_ID_VARIABLE, f"pid{os.getpid()}")


class FarmWorker:
    """The worker side of one Celery app: its settings and, in the process its tasks run in, their context (the
    pinned device's client and the shared results store), built once on first use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._context: WorkerContext | None = None
        self._client: Any = None  # the Redis client of the context (presence beats go through it)
        self._failure_store: ResultsStore | None = None

    @property
    def built(self) -> WorkerContext | None:
        """The context, if a task of this process built it."""
        return self._context

    def context(self) -> WorkerContext:
        """This process's context for this app, created once from the app's settings."""
        if self._context is None:
            from farm.stores.redis import connect

            settings = self.settings
            if not settings.redis_url:
                raise RuntimeError("the worker needs FARM_REDIS_URL (decisions and results Redis)")
            client = connect(settings.redis_url, timeout=10.0)
            worker_id = _worker_id()

            def quarantine(reason: str) -> None:
                presence.beat(client, settings, worker_id, presence.QUARANTINED)

            kernels = tuple(k for k in os.environ.get(KERNELS_VARIABLE, "").split(",") if k)
            self._client = client
            self._context = WorkerContext(
                client=recorded.client_for(os.environ.get(DEVICE_VARIABLE, "cpu:0")),
                results=RedisResults(client, settings),
                settings=settings,
                worker_id=worker_id,
                kernels=kernels,
                interrupts=(SoftTimeLimitExceeded,),
                on_quarantine=quarantine,
            )
        return self._context

    def failure_store(self) -> ResultsStore:
        """Where a failed task's results go: the context's store, or in the worker's main process (a hard time
        limit, where no device context exists) a results-only client made once."""
        if self._context is not None:
            return self._context.results
        if self._failure_store is None:
            from farm.stores.redis import connect

            self._failure_store = RedisResults(connect(str(self.settings.redis_url), timeout=5.0), self.settings)
        return self._failure_store

    def record_failure(self, args: Any, exc: BaseException) -> None:
        """Store a failed result for every group of a failed task that has none."""
        if isinstance(exc, (StoreUnavailable, MaxRetriesExceededError, GroupsFailed)):
            return  # an outage is no verdict on the group (sent again); failed groups have their results stored
        try:
            store = self.failure_store()
            here = Runner.here(_worker_id())
            for message in (args[0] if args else []):
                task = GroupTask.from_dict(message)
                holder = store.running_elsewhere(task.key, here)
                if holder is None:  # a group another delivery runs now is not this task's to fail
                    store.put_if_absent(GroupResult.failed(task, f"task failed: {exc!r}"))
        except (StoreUnavailable, ProtocolError, KeyError, TypeError) as e:
            # The coordinator's deadline sends the group again: nothing is lost.
            log.warning("could not record the failure of a task (%s): %s", exc, e)

    def set_state(self, state: str) -> None:
        """Record this worker's presence state (busy, healthy), quarantined once its device failed."""
        ctx = self._context
        if ctx is None or WORKER_ID_VARIABLE not in os.environ:
            return
        if ctx.quarantined is not None:
            state = presence.QUARANTINED
        try:
            presence.beat(self._client, ctx.settings, ctx.worker_id, state)
        except Exception as e:  # an unreachable Redis must not fail the task; the next beat heals the record
            log.warning("could not record state %s: %s", state, e)

    def release_orphan(self) -> None:
        """A new pool process: if the one it replaces was killed mid-group, that group's run claim goes now, so a
        delivery of it waiting on another worker runs it at once (``farm_fleet.results``)."""
        worker_id = os.environ.get(WORKER_ID_VARIABLE)
        if worker_id is None or not self.settings.redis_url:
            return
        from farm.stores.redis import connect

        client = connect(self.settings.redis_url, timeout=1.0, retries=False)
        try:
            RedisResults(client, self.settings).release_orphan(Runner.here(worker_id))
        except Exception as e:  # the claim expires at its task's hard limit anyway
            log.warning("could not look for an orphaned run claim: %s", e)
        finally:
            client.close()


def farm_worker(app: Any) -> FarmWorker | None:
    """The worker side of a Celery app made by :func:`create_app` (None for any other app)."""
    found = app.conf.get("farm_worker")
    return found if isinstance(found, FarmWorker) else None


def create_app(settings: Settings | None = None) -> Celery:
    """A Celery app for the farm with ``settings`` (default: from the environment), owning its worker side."""
    settings = settings or Settings.from_env()
    app_settings: Settings = settings  # for the task class below (mypy keeps no narrowing into a class body)
    worker = FarmWorker(settings)
    app = Celery("farm", set_as_current=False)
    app.conf.update(celery_config(settings))
    app.conf.farm_settings = settings
    app.conf.farm_worker = worker

    class GroupsTask(Task):
        throws = (GroupsFailed,)  # an expected outcome: logged as one line, not as an error with a traceback

        def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
            worker.record_failure(args, exc)

    # shared=False: each app keeps its own tasks (a second create_app() must not reuse the first one's settings).
    @app.task(name=GROUP_TASK, bind=True, shared=False, base=GroupsTask, ignore_result=True)
    def run_groups_task(self: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            ctx = worker.context()
            hard = (self.request.timelimit or (None,))[0]
            ctx.deadline = time.monotonic() + float(hard) if hard else None  # run claims end with the task
            ctx.results.started([GroupKey.of(m) for m in messages], ctx.worker_id, presence.INCARNATION)
            batch = run_groups(messages, ctx)
            if batch.unreached:
                ctx.results.unrun(batch.unreached)
            failed = [r for r in batch.results if r.get("status") != STATUS_OK]
            if failed:  # stored for the coordinator already; the task's state says so too (Flower: FAILURE)
                raise GroupsFailed.of(failed, len(batch.results))
            return batch.results
        except DeviceQuarantined as e:
            # Back to the queue for another worker of the same fingerprint; this one stops consuming.
            raise Reject(f"device quarantined: {e}", requeue=True) from e
        except StoreUnavailable as e:
            # Never acknowledged as done: a copy goes back to the broker after a growing countdown (bounded).
            countdown = min(60.0, app_settings.store_retry_seconds * 2 ** self.request.retries)
            raise self.retry(exc=e, countdown=countdown, max_retries=app_settings.max_attempts) from e

    @app.task(name=PING_TASK, shared=False)
    def ping() -> dict[str, Any]:
        """A no-op round trip through the broker and the worker (health checks, the overhead benchmark)."""
        return {"pong": os.environ.get(WORKER_ID_VARIABLE, ""), "pid": os.getpid()}

    return app


def _sender_worker(sender: Any) -> FarmWorker | None:
    """The worker side of the app whose task a task signal is about."""
    return farm_worker(sender.app) if sender is not None else None


@signals.worker_process_init.connect
def _release_orphan(**_: Any) -> None:
    # The pool process serves the app its worker runs: Celery makes it the current app before this signal.
    worker = farm_worker(current_app)
    if worker is not None:
        worker.release_orphan()


@signals.task_prerun.connect
def _busy(sender: Any = None, **_: Any) -> None:
    worker = _sender_worker(sender)
    if worker is not None:
        worker.set_state(presence.BUSY)


@signals.task_postrun.connect
def _idle(sender: Any = None, **_: Any) -> None:
    worker = _sender_worker(sender)
    if worker is not None:
        worker.set_state(presence.HEALTHY)


app = create_app()
