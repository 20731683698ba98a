"""Tuning runs as `farm status` sees them: each coordinator records its run's progress in Redis."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from farm_fleet.settings import Settings

RUNNING = "running"
FINISHED = "finished"
FAILED = "failed"  # the run ended and every problem it decided failed (none published)
ENDED = (FINISHED, FAILED)


class RedisRunLog:
    """``prefix:run:<id>`` hash (catalog, host, pid, started, updated, groups, done, published, partial, state),
    indexed in the ``prefix:runs`` sorted set by start time. Ended runs expire after the result ttl."""

    def __init__(self, client: Any, settings: Settings) -> None:
        self.client = client
        self.settings = settings

    def start(self, run: str, catalog: str, groups: int) -> None:
        now = time.time()
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(self.settings.run_key(run), mapping={
                "run": run, "catalog": catalog, "host": socket.gethostname(), "pid": os.getpid(), "started": now,
                "updated": now, "groups": groups, "done": 0, "published": 0, "state": RUNNING,
            })
            pipe.zadd(self.settings.runs_key, {run: now})
            pipe.execute()

    def update(self, run: str, done: int, published: int, state: str = RUNNING, groups: int | None = None,
               partial: int | None = None) -> None:
        """Record the run's progress; ``groups``: the group tasks planned so far (a space strategy plans more as it
        goes), ``partial``: the published decisions the budget cut (both kept as they were when not given)."""
        key = self.settings.run_key(run)
        fields: dict[str, object] = {"updated": time.time(), "done": done, "published": published, "state": state}
        if groups is not None:
            fields["groups"] = groups
        if partial is not None:
            fields["partial"] = partial
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=fields)
            if state in ENDED:
                pipe.expire(key, int(self.settings.result_ttl))
            pipe.execute()

    def runs(self, limit: int = 20) -> list[dict[str, str]]:
        """The most recent runs, newest first (expired ones are dropped from the index)."""
        ids = self.client.zrevrange(self.settings.runs_key, 0, limit - 1)
        found = []
        for run in ids:
            data = self.client.hgetall(self.settings.run_key(run))
            if data:
                found.append(data)
            else:
                self.client.zrem(self.settings.runs_key, run)
        return found


class NoRunLog:
    def start(self, run: str, catalog: str, groups: int) -> None:
        return None

    def update(self, run: str, done: int, published: int, state: str = RUNNING, groups: int | None = None,
               partial: int | None = None) -> None:
        return None
