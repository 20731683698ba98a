"""Worker presence in Redis: who is online, on which device and fingerprint, in which state.

Each worker keeps a hash under ``settings.worker_key(id)`` that expires unless its heartbeat renews it; a
worker whose last beat is older than two intervals is reported stale. Every beat rewrites the whole record
(idempotent), so a record that expired while the worker or Redis was frozen comes back with the next beat.
Each worker process has an **incarnation** (a random id made at start): a worker restarted under the same id
is a new incarnation, so work given to the old one is known lost.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Any

from farm_fleet.settings import Settings

HEALTHY = "healthy"
BUSY = "busy"
QUARANTINED = "quarantined"
STALE = "stale"
SERVING = (HEALTHY, BUSY)

# This process's incarnation; pool processes forked from the worker inherit it.
INCARNATION = uuid.uuid4().hex[:16]
# What this process announced, per worker id: the heartbeat rewrites it whole.
_announced: dict[str, WorkerInfo] = {}


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker announces about itself. Its regime: ``cores`` (the CPU list it is pinned to, "" when
    unpinned) and the sizes of its BLAS and OpenMP pools (0 when the worker did not say)."""

    worker_id: str
    host: str
    device: str
    device_kind: str
    fingerprint: str
    model: str
    farm_version: str
    state: str
    pid: int
    updated: float
    queue: str
    hostname: str = ""
    incarnation: str = ""
    cores: str = ""
    blas_threads: int = 0
    openmp_threads: int = 0

    def regime(self) -> str:
        """``cores 0-1 (2); blas 2; openmp 2`` for people."""
        count = sum(b - a + 1 for a, _, b in (_span(p) for p in self.cores.split(",") if p))
        cores = f"cores {self.cores} ({count})" if self.cores else "unpinned"
        return f"{cores}; blas {self.blas_threads or '?'}; openmp {self.openmp_threads or '?'}"

    def to_fields(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}

    @classmethod
    def from_fields(cls, data: dict[str, str]) -> WorkerInfo:
        return cls(
            worker_id=data["worker_id"], host=data["host"], device=data["device"], device_kind=data["device_kind"],
            fingerprint=data["fingerprint"], model=data["model"], farm_version=data["farm_version"],
            state=data["state"], pid=int(data["pid"]), updated=float(data["updated"]), queue=data["queue"],
            hostname=data.get("hostname", ""), incarnation=data.get("incarnation", ""), cores=data.get("cores", ""),
            blas_threads=int(data.get("blas_threads", 0)), openmp_threads=int(data.get("openmp_threads", 0)),
        )

    def effective_state(self, settings: Settings, now: float | None = None) -> str:
        now = time.time() if now is None else now
        if self.state != QUARANTINED and now - self.updated > 2 * settings.heartbeat_seconds:
            return STALE
        return self.state


def _span(part: str) -> tuple[int, str, int]:
    low, dash, high = part.partition("-")
    return int(low), dash, int(high) if dash else int(low)


def announce(client: Any, settings: Settings, info: WorkerInfo) -> None:
    """Write the worker's whole record (this process's incarnation unless ``info`` names one)."""
    if not info.incarnation:
        info = replace(info, incarnation=INCARNATION)
    _announced[info.worker_id] = info
    key = settings.worker_key(info.worker_id)
    with client.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=info.to_fields())
        pipe.expire(key, int(settings.heartbeat_ttl))
        pipe.execute()


def beat(client: Any, settings: Settings, worker_id: str, state: str | None = None) -> None:
    """Renew the worker's record (and optionally set its state). In the process that announced the worker the
    whole record is rewritten, so it heals after expiring; the state is kept unless given (a record that had
    expired comes back in the announced state)."""
    key = settings.worker_key(worker_id)
    info = _announced.get(worker_id)
    mapping = {"updated": str(time.time())}
    if info is not None:
        mapping = {**{k: v for k, v in info.to_fields().items() if k != "state"}, **mapping}
    if state is not None:
        mapping["state"] = state
    with client.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=mapping)
        if state is None:
            pipe.hsetnx(key, "state", info.state if info is not None else HEALTHY)
        pipe.expire(key, int(settings.heartbeat_ttl))
        pipe.execute()


def state_of(client: Any, settings: Settings, worker_id: str) -> str | None:
    value = client.hget(settings.worker_key(worker_id), "state")
    return None if value is None else str(value)


def serving(client: Any, settings: Settings, worker_id: str, incarnation: str = "") -> bool:
    """Whether this incarnation of the worker still serves (healthy or busy, heartbeat fresh): one read of its
    record. A worker restarted under the same id is a new incarnation and does not count."""
    data = client.hgetall(settings.worker_key(worker_id))
    try:
        w = WorkerInfo.from_fields(data)
    except (KeyError, ValueError):
        return False
    if incarnation and w.incarnation != incarnation:
        return False
    return w.effective_state(settings) in SERVING


def withdraw(client: Any, settings: Settings, worker_id: str) -> None:
    client.delete(settings.worker_key(worker_id))


def live_workers(client: Any, settings: Settings) -> list[WorkerInfo]:
    """Every worker whose record has not expired (stale ones included: check ``effective_state``)."""
    workers = []
    for key in client.scan_iter(match=settings.worker_key("*"), count=500):
        data = client.hgetall(key)
        if data and "worker_id" in data:
            try:
                workers.append(WorkerInfo.from_fields(data))
            except (KeyError, ValueError):
                continue
    return sorted(workers, key=lambda w: w.worker_id)
