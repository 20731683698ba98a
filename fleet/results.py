"""Group results, stored idempotently under (run, problem id, group): the first result stored wins.

The Redis implementation is what workers and coordinators share; the memory one serves the embedded farm and
tests. Both count attempts so a task that keeps killing its worker is bounded.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from farm_fleet.protocol import GroupResult
from farm_fleet.settings import Settings


class MemoryResults:
    """In-process results (the embedded farm)."""

    def __init__(self) -> None:
        self._results: dict[tuple[str, str, str], GroupResult] = {}
        self._attempts: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()

    def put_if_absent(self, result: GroupResult) -> GroupResult:
        """Store unless a result is already there; return the stored one."""
        key = (result.run, result.problem_id, result.group)
        with self._lock:
            return self._results.setdefault(key, result)

    def get(self, run: str, problem_id: str, group: str) -> GroupResult | None:
        with self._lock:
            return self._results.get((run, problem_id, group))

    def get_many(self, keys: list[tuple[str, str, str]]) -> list[GroupResult | None]:
        with self._lock:
            return [self._results.get(k) for k in keys]

    def attempt(self, run: str, problem_id: str, group: str) -> int:
        """Count one more attempt and return the count (1 for the first)."""
        with self._lock:
            key = (run, problem_id, group)
            self._attempts[key] = self._attempts.get(key, 0) + 1
            return self._attempts[key]


class RedisResults:
    """Results as JSON strings under ``settings.result_key``, written with SET NX (first one wins)."""

    def __init__(self, client: Any, settings: Settings) -> None:
        self.client = client
        self.settings = settings

    def put_if_absent(self, result: GroupResult) -> GroupResult:
        key = self.settings.result_key(result.run, result.problem_id, result.group)
        done = self.settings.done_key(result.run)
        payload = json.dumps(result.to_dict(), sort_keys=True)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.set(key, payload, nx=True, ex=int(self.settings.result_ttl))
            pipe.get(key)
            pipe.rpush(done, key)
            pipe.expire(done, int(self.settings.result_ttl))
            _, stored, _, _ = pipe.execute()
        return GroupResult.from_dict(json.loads(stored))

    def wait(self, runs: list[str], timeout: float) -> bool:
        """Block until some result of ``runs`` completes (or ``timeout`` seconds pass); drain the notices."""
        keys = [self.settings.done_key(r) for r in runs]
        if not keys or self.client.blpop(keys, timeout=timeout) is None:
            return False
        for key in keys:
            self.client.delete(key)
        return True

    def get(self, run: str, problem_id: str, group: str) -> GroupResult | None:
        raw = self.client.get(self.settings.result_key(run, problem_id, group))
        return GroupResult.from_dict(json.loads(raw)) if raw is not None else None

    def get_many(self, keys: list[tuple[str, str, str]]) -> list[GroupResult | None]:
        if not keys:
            return []
        raws = self.client.mget([self.settings.result_key(*k) for k in keys])
        return [GroupResult.from_dict(json.loads(r)) if r is not None else None for r in raws]

    def attempt(self, run: str, problem_id: str, group: str) -> int:
        key = self.settings.attempts_key(run, problem_id, group)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, int(self.settings.result_ttl))
            count, _ = pipe.execute()
        return int(count)
