"""One name per group task in Flower, from sending to its end.

The coordinator sends ``farm.run_groups`` (what the workers register) with a *shadow* name per operation,
``farm.run_groups:<operation>`` (``farm_coordinator.dispatch``), the name a worker's events, Flower's pages and its
metrics show. Celery names the coordinator's own ``task-sent`` event by the registered name, though, so a run's tasks
appeared under two names. :class:`OperationNamedAMQP` (the coordinator's Celery app's ``amqp``, ``farm_cli.parts``)
names the sent event by the shadow too; every batch carries one operation's groups (``farm_coordinator.run``), so a
task always has its operation's name.
"""

from __future__ import annotations

from typing import Any

from celery.app.amqp import AMQP


class OperationNamedAMQP(AMQP):  # type: ignore[misc]  # celery is untyped
    """Celery's AMQP, whose ``task-sent`` event names a task by its shadow name when it has one."""

    def as_task_v2(self, *args: Any, **kwargs: Any) -> Any:
        message = super().as_task_v2(*args, **kwargs)
        shadow = message.headers.get("shadow")
        if shadow and message.sent_event is not None:
            message.sent_event["name"] = shadow
        return message
