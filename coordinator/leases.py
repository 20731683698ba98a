"""Single-flight and resume: which coordinator tunes a problem now, and under which round its results live.

- A **lease** per problem id (``prefix:lease:<pid>``) names the coordinator tuning it; it expires unless its
  holder renews it, so a dead coordinator's problems are taken over after ``lease_ttl`` seconds.
- A **round** per problem id (``prefix:round:<pid>``) scopes its group results (``result``/``attempts`` keys): a
  coordinator that takes a problem over, or a re-run after a crash, reuses the round and so finds every group that
  already finished. ``--force`` starts a new round.
"""

from __future__ import annotations

from typing import Any

from farm_fleet.settings import Settings

# Compare-and-act on a lease: only its holder may renew or release it.
_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class RedisLeases:
    def __init__(self, client: Any, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def _lease(self, pid: str) -> str:
        return self.settings.key("lease", pid)

    def _round(self, pid: str) -> str:
        return self.settings.key("round", pid)

    def acquire(self, pids: list[str], holder: str) -> set[str]:
        """Take every free lease among ``pids``; return the ones now held by ``holder``."""
        ttl = int(self.settings.lease_ttl * 1000)
        with self.client.pipeline(transaction=False) as pipe:
            for pid in pids:
                pipe.set(self._lease(pid), holder, nx=True, px=ttl)
            taken = pipe.execute()
        return {pid for pid, ok in zip(pids, taken, strict=True) if ok}

    def renew(self, pids: list[str], holder: str) -> set[str]:
        """Extend our leases; return the ones we lost (expired and taken by another coordinator)."""
        ttl = int(self.settings.lease_ttl * 1000)
        with self.client.pipeline(transaction=False) as pipe:
            for pid in pids:
                self._renew(keys=[self._lease(pid)], args=[holder, ttl], client=pipe)
            renewed = pipe.execute()
        return {pid for pid, ok in zip(pids, renewed, strict=True) if not ok}

    def release(self, pid: str, holder: str) -> None:
        self._release(keys=[self._lease(pid)], args=[holder])

    def rounds(self, pids: list[str], run: str, fresh: bool) -> dict[str, str]:
        """The round of each problem: the existing one (resume, takeover) or ``run`` (new, or ``fresh``)."""
        ttl = int(self.settings.result_ttl)
        with self.client.pipeline(transaction=True) as pipe:
            for pid in pids:
                if fresh:
                    pipe.set(self._round(pid), run, ex=ttl)
                else:
                    pipe.set(self._round(pid), run, nx=True, ex=ttl)
                pipe.get(self._round(pid))
            replies = pipe.execute()
        return {pid: str(replies[2 * i + 1]) for i, pid in enumerate(pids)}


class LocalLeases:
    """The embedded farm: one coordinator, nothing to share; every problem's round is this run."""

    def acquire(self, pids: list[str], holder: str) -> set[str]:
        return set(pids)

    def renew(self, pids: list[str], holder: str) -> set[str]:
        return set()

    def release(self, pid: str, holder: str) -> None:
        return None

    def rounds(self, pids: list[str], run: str, fresh: bool) -> dict[str, str]:
        return dict.fromkeys(pids, run)
