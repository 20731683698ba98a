"""Fleets: which fingerprints have live devices, the queue of each, and a second device for confirmations."""

from __future__ import annotations

import itertools
from typing import Any, Generic, Protocol, TypeVar

from farm.runtimes.base import ComputeClient
from farm_coordinator.plan import Target
from farm_fleet import presence
from farm_fleet.protocol import GroupTask
from farm_fleet.settings import Settings


class RedisFleet:
    """The fleet as workers announce it in Redis (healthy or busy, heartbeat fresh)."""

    def __init__(self, client: Any, settings: Settings) -> None:
        self.client = client
        self.settings = settings

    def workers(self) -> list[presence.WorkerInfo]:
        return [w for w in presence.live_workers(self.client, self.settings)
                if w.effective_state(self.settings) in presence.SERVING]

    def targets(self) -> list[Target]:
        texts = self.client.hgetall(self.settings.fingerprints_key)
        groups: dict[tuple[str, str], list[str]] = {}
        for w in self.workers():
            groups.setdefault((w.fingerprint, w.device_kind), []).append(w.worker_id)
        return [Target(digest, texts.get(digest, digest), kind, tuple(ids)) for (digest, kind), ids in sorted(groups.items())]

    def queue(self, target: Target) -> str:
        queue: str = self.settings.fingerprint_queue(target.digest)
        return queue

    def confirmer(self, target: Target, exclude: str | None) -> tuple[str, str, str] | None:
        """(worker id, its own queue, its incarnation) of another serving worker of the fingerprint."""
        for w in self.workers():
            if w.fingerprint == target.digest and w.worker_id != exclude:
                return w.worker_id, w.queue, w.incarnation
        return None

    def alive(self, worker_id: str, incarnation: str = "") -> bool:
        """Whether this incarnation of the worker still serves: one read of its record. A worker restarted under
        the same id is a new incarnation and does not count (what was sent to the old one is lost)."""
        return presence.serving(self.client, self.settings, worker_id, incarnation)


class LocalDevice(Protocol):
    """What the embedded farm's fleet reads of a worker context in this process."""

    @property
    def client(self) -> ComputeClient: ...

    @property
    def worker_id(self) -> str: ...

    @property
    def digest(self) -> str: ...


Device = TypeVar("Device", bound=LocalDevice)


class LocalFleet(Generic[Device]):
    """The embedded farm's devices: worker contexts in this process."""

    def __init__(self, contexts: list[Device]) -> None:
        self.contexts = {c.worker_id: c for c in contexts}
        self._turns = itertools.cycle(list(self.contexts))

    def targets(self) -> list[Target]:
        groups: dict[tuple[str, str], list[Device]] = {}
        for c in self.contexts.values():
            groups.setdefault((c.digest, c.client.device_kind), []).append(c)
        return [Target(digest, _fingerprint(cs[0]), kind, tuple(c.worker_id for c in cs))
                for (digest, kind), cs in sorted(groups.items())]

    def queue(self, target: Target) -> str:
        return f"local.fp.{target.digest}"

    def confirmer(self, target: Target, exclude: str | None) -> tuple[str, str, str] | None:
        for worker_id, c in self.contexts.items():
            if c.digest == target.digest and worker_id != exclude:
                return worker_id, f"local.worker.{worker_id}", ""
        return None

    def alive(self, worker_id: str, incarnation: str = "") -> bool:
        return worker_id in self.contexts

    def context_for(self, task: GroupTask, queue: str) -> Device:
        if queue.startswith("local.worker."):
            return self.contexts[queue.removeprefix("local.worker.")]
        for _ in range(len(self.contexts)):
            c = self.contexts[next(self._turns)]
            if c.digest == task.fingerprint:
                return c
        raise LookupError(f"no local device of fingerprint {task.fingerprint}")


def _fingerprint(context: LocalDevice) -> str:
    from farm.environment import runtime_environment

    return runtime_environment(context.client).fingerprint
