"""Single-flight and resume: which coordinator tunes a problem now, and under which round its results live.

- A **lease** per problem id (``prefix:lease:<pid>``) names the coordinator tuning it; it expires unless its
  holder renews it, so a dead coordinator's problems are taken over after ``lease_ttl`` seconds.
- Each lease carries a **fencing token** (``holder#token``): ``prefix:fence:<pid>`` counts the leases ever taken
  on the problem, so tokens only grow. Publication (``farm_publish``) requires the lease key to still hold the
  exact value it was given, atomically, and consumes the lease: a coordinator whose lease expired (frozen, cut
  off) is refused and stops working on the problem.
- A **round** per problem id (``prefix:round:<pid>``) scopes its group results (``result``/``attempts`` keys): a
  coordinator that takes a problem over, or a re-run after a crash, reuses the round and so finds every group that
  already finished. ``--force`` starts a new round.
"""

from __future__ import annotations

from typing import Any

from farm_fleet.retry import retrying
from farm_fleet.settings import Settings

# Take a free lease with the next token of the problem's fence counter; return the lease value or false.
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
local value = ARGV[1] .. '#' .. token
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return value
"""
# Compare-and-act on a lease: only its holder (the exact value, token included) may renew or release it.
_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def token_of(lease: str) -> int:
    """The fencing token of a lease value (``holder#token``)."""
    return int(lease.rsplit("#", 1)[1])


class RedisLeases:
    def __init__(self, client: Any, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def _call(self, fn: Any) -> Any:
        return retrying(fn, self.settings.store_retry_seconds, "the decisions Redis")

    def acquire(self, pids: list[str], holder: str) -> dict[str, str]:
        """Take every free lease among ``pids``; return problem id -> lease value for the ones now held."""
        ttl = str(int(self.settings.lease_ttl * 1000))
        fence_ttl = str(int(self.settings.result_ttl))

        def run() -> list[Any]:
            with self.client.pipeline(transaction=False) as pipe:
                for pid in pids:
                    self._acquire(keys=[self.settings.lease_key(pid), self.settings.fence_key(pid)],
                                  args=[holder, ttl, fence_ttl], client=pipe)
                return list(pipe.execute())

        return {pid: str(value) for pid, value in zip(pids, self._call(run), strict=True) if value}

    def renew(self, leases: dict[str, str]) -> set[str]:
        """Extend our leases (problem id -> lease value); return the ones we lost (expired, maybe taken over)."""
        ttl = int(self.settings.lease_ttl * 1000)
        pids = list(leases)

        def run() -> list[Any]:
            with self.client.pipeline(transaction=False) as pipe:
                for pid in pids:
                    self._renew(keys=[self.settings.lease_key(pid)], args=[leases[pid], ttl], client=pipe)
                return list(pipe.execute())

        return {pid for pid, ok in zip(pids, self._call(run), strict=True) if not ok}

    def release(self, pid: str, lease: str) -> None:
        self._call(lambda: self._release(keys=[self.settings.lease_key(pid)], args=[lease]))

    def fence(self, pid: str, lease: str) -> tuple[str, str] | None:
        """What publication checks: (lease key, the exact lease value we must still hold)."""
        return self.settings.lease_key(pid), lease

    def rounds(self, pids: list[str], run: str, fresh: bool) -> dict[str, str]:
        """The round of each problem: the existing one (resume, takeover) or ``run`` (new, or ``fresh``)."""
        ttl = int(self.settings.result_ttl)

        def go() -> list[Any]:
            with self.client.pipeline(transaction=True) as pipe:
                for pid in pids:
                    if fresh:
                        pipe.set(self.settings.key("round", pid), run, ex=ttl)
                    else:
                        pipe.set(self.settings.key("round", pid), run, nx=True, ex=ttl)
                    pipe.get(self.settings.key("round", pid))
                return list(pipe.execute())

        replies = self._call(go)
        return {pid: str(replies[2 * i + 1]) for i, pid in enumerate(pids)}


class LocalLeases:
    """The embedded farm: one coordinator, nothing to share; every problem's round is this run."""

    def __init__(self) -> None:
        self._tokens = 0

    def acquire(self, pids: list[str], holder: str) -> dict[str, str]:
        self._tokens += 1
        return {pid: f"{holder}#{self._tokens}" for pid in pids}

    def renew(self, leases: dict[str, str]) -> set[str]:
        return set()

    def release(self, pid: str, lease: str) -> None:
        return None

    def fence(self, pid: str, lease: str) -> tuple[str, str] | None:
        return None

    def rounds(self, pids: list[str], run: str, fresh: bool) -> dict[str, str]:
        return dict.fromkeys(pids, run)
