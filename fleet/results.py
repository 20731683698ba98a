"""Group results, stored idempotently under (round, problem id, group): the first result stored wins.

The Redis implementation is what workers and coordinators share; the memory one serves the embedded farm and
tests. Both count attempts so a task that keeps killing its worker is bounded, and record when a group's latest
delivery started so the coordinator can tell a slow group from a lost one.

A store outage is retried with exponential back-off for ``settings.store_retry_seconds`` (:func:`retrying`);
past that :class:`StoreUnavailable` says so, and the caller decides (a worker leaves the task to be redelivered,
the coordinator waits and carries on).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from farm.errors import StoreUnavailable
from farm_fleet.protocol import STATUS_OK, GroupResult
from farm_fleet.settings import Settings

log = logging.getLogger(__name__)
Key = tuple[str, str, str]
T = TypeVar("T")


def transient(error: BaseException) -> bool:
    """Whether ``error`` is a connection-level failure worth retrying (redis-py, kombu or the socket layer)."""
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    name = type(error).__name__
    module = type(error).__module__
    if module.startswith("redis") and name in ("ConnectionError", "TimeoutError", "BusyLoadingError"):
        return True
    return module.startswith(("kombu", "amqp")) and name in ("OperationalError", "ConnectionError",
                                                             "RecoverableConnectionError")


def retrying(call: Callable[[], T], seconds: float, what: str = "Redis") -> T:
    """Run ``call``, retrying transient failures with exponential back-off (0.1 s doubling, at most 2 s) for up
    to ``seconds``; then raise StoreUnavailable from the last failure."""
    deadline = time.monotonic() + seconds
    pause = 0.1
    while True:
        try:
            return call()
        except Exception as e:
            if not transient(e):
                raise
            if time.monotonic() + pause > deadline:
                raise StoreUnavailable(f"{what} unreachable for {seconds:g}s: {e}") from e
            log.warning("%s unreachable (%s); retrying in %.1fs", what, e, pause)
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


class MemoryResults:
    """In-process results (the embedded farm)."""

    def __init__(self) -> None:
        self._results: dict[Key, GroupResult] = {}
        self._attempts: dict[Key, int] = {}
        self._lock = threading.Lock()

    def put_if_absent(self, result: GroupResult) -> GroupResult:
        """Store unless a result is already there; return the stored one."""
        key = (result.run, result.problem_id, result.group)
        with self._lock:
            return self._results.setdefault(key, result)

    def get(self, run: str, problem_id: str, group: str) -> GroupResult | None:
        with self._lock:
            return self._results.get((run, problem_id, group))

    def get_many(self, keys: list[Key]) -> list[GroupResult | None]:
        with self._lock:
            return [self._results.get(k) for k in keys]

    def attempt(self, run: str, problem_id: str, group: str) -> int:
        """Count one more attempt and return the count (1 for the first)."""
        with self._lock:
            key = (run, problem_id, group)
            self._attempts[key] = self._attempts.get(key, 0) + 1
            return self._attempts[key]

    def begin(self, run: str, problem_id: str, group: str) -> tuple[GroupResult | None, int]:
        """(the stored result, 0), or when there is none (None, one more attempt counted)."""
        with self._lock:
            found = self._results.get((run, problem_id, group))
        return (found, 0) if found is not None else (None, self.attempt(run, problem_id, group))

    def started(self, keys: list[Key], worker: str, incarnation: str = "") -> None:
        """In-process tasks start when the coordinator runs them: nothing to record."""

    def discard(self, keys: Iterable[Key]) -> None:
        """Forget these groups' results and attempts (a failed group runs again on a rerun)."""
        with self._lock:
            for key in keys:
                self._results.pop(key, None)
                self._attempts.pop(key, None)


# A group's stored result (a string), or else one more attempt counted (the count, an integer): one round trip.
_BEGIN = """
local found = redis.call('GET', KEYS[1])
if found then return found end
local count = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[1])
return count
"""


class RedisResults:
    """Results as JSON strings under ``settings.result_key``, written with SET NX (first one wins). Every call
    retries a store outage for ``settings.store_retry_seconds`` before raising StoreUnavailable."""

    def __init__(self, client: Any, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self._begin = client.register_script(_BEGIN)

    def _retry(self, call: Callable[[], T]) -> T:
        return retrying(call, self.settings.store_retry_seconds, "the results Redis")

    def put_if_absent(self, result: GroupResult) -> GroupResult:
        key = self.settings.result_key(result.run, result.problem_id, result.group)
        done = self.settings.done_key(result.run)
        payload = json.dumps(result.to_dict(), sort_keys=True)
        ttl = int(self.settings.result_ttl)

        def put() -> Any:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.set(key, payload, nx=True, ex=ttl)
                pipe.get(key)
                pipe.rpush(done, key)
                pipe.expire(done, ttl)
                return pipe.execute()

        stored, found = self._retry(put)[:2]
        return result if stored else GroupResult.from_dict(json.loads(found))

    def started(self, keys: list[Key], worker: str, incarnation: str = "") -> None:
        """Record that a delivery of these groups started now on ``worker`` (expires with the results)."""
        now = time.time()
        value = json.dumps({"at": now, "worker": worker, "incarnation": incarnation})

        def mark() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.set(self.settings.started_key(*key), value, ex=int(self.settings.result_ttl))
                pipe.execute()

        self._retry(mark)

    def started_at(self, keys: list[Key]) -> list[float | None]:
        """When each group's latest delivery started (epoch seconds), None if none did."""
        if not keys:
            return []
        raws = self._retry(lambda: self.client.mget([self.settings.started_key(*k) for k in keys]))
        return [float(json.loads(r)["at"]) if r else None for r in raws]

    def unrun(self, keys: list[Key]) -> None:
        """Tell the coordinator that a batch ended without running these groups (it sends them again at once)."""
        if not keys:
            return
        ttl = int(self.settings.result_ttl)

        def push() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    done = self.settings.done_key(key[0])
                    pipe.rpush(done, self.settings.unrun_key(*key))
                    pipe.expire(done, ttl)
                pipe.execute()

        self._retry(push)

    def notices(self, rounds: list[str], timeout: float) -> list[tuple[str, Key]]:
        """Block up to ``timeout`` seconds for notices of ``rounds``; return (kind, group) pairs, kind "result"
        (a result was stored) or "unrun" (its batch ended without running it)."""
        keys = [self.settings.done_key(r) for r in rounds]
        if not keys:
            return []
        first = self._retry(lambda: self.client.blpop(keys, timeout=timeout) if timeout > 0 else None)
        found = [first[1]] if first is not None else []

        def drain() -> list[Any]:
            with self.client.pipeline(transaction=True) as pipe:
                for key in keys:
                    pipe.lrange(key, 0, -1)
                    pipe.delete(key)
                return list(pipe.execute())

        for i, items in enumerate(self._retry(drain)):
            if i % 2 == 0:
                found.extend(items)
        return [notice for name in found if (notice := self.settings.notice_of(str(name))) is not None]

    def get(self, run: str, problem_id: str, group: str) -> GroupResult | None:
        raw = self._retry(lambda: self.client.get(self.settings.result_key(run, problem_id, group)))
        return GroupResult.from_dict(json.loads(raw)) if raw is not None else None

    def get_many(self, keys: list[Key]) -> list[GroupResult | None]:
        if not keys:
            return []
        raws = self._retry(lambda: self.client.mget([self.settings.result_key(*k) for k in keys]))
        return [GroupResult.from_dict(json.loads(r)) if r is not None else None for r in raws]

    def begin(self, run: str, problem_id: str, group: str) -> tuple[GroupResult | None, int]:
        """(the stored result, 0), or when there is none (None, one more attempt counted): what a worker asks
        before it runs a group, in one round trip."""
        keys = [self.settings.result_key(run, problem_id, group), self.settings.attempts_key(run, problem_id, group)]
        reply = self._retry(lambda: self._begin(keys=keys, args=[int(self.settings.result_ttl)]))
        if isinstance(reply, int):
            return None, reply
        return GroupResult.from_dict(json.loads(reply)), 0

    def discard(self, keys: Iterable[Key]) -> None:
        """Forget these groups' results, attempts and start marks (a failed group runs again on a rerun)."""
        names = [name for k in keys for name in (self.settings.result_key(*k), self.settings.attempts_key(*k),
                                                 self.settings.started_key(*k))]
        if names:
            self._retry(lambda: self.client.delete(*names))


def reusable(result: GroupResult | None) -> bool:
    """Only a successful group result is reused by a later run; a failure runs again."""
    return result is not None and result.status == STATUS_OK
