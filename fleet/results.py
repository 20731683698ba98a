"""Group results, stored idempotently under their :class:`~farm_fleet.protocol.GroupKey` (run, problem id, group):
the first result stored wins.

The Redis implementation is what workers and coordinators share; the memory one serves the embedded farm and
tests. Both count attempts so a task that keeps killing its worker is bounded, and record when a group's latest
delivery started so the coordinator can tell a slow group from a lost one.

A group runs on one device at a time. Two deliveries of one group can be in flight at once: a coordinator that
took a problem over (or resumed it) sends again what its predecessor had sent, and a dispatcher sends again a
message its queue seemed to hold too long. So a delivery that begins a group takes its **run claim**
(:class:`Runner`: worker, incarnation, process) in the same script that counts the attempt. A second delivery
that finds the claim held by a live runner waits for that runner's result and answers with it
(:meth:`RedisResults.begin`). A claim ends with the group's result; when its run ends without one (released:
quarantine, an outage, a shutdown); when the worker's pool replaces the process that held it (the successor
releases it: the process was killed mid-group); or at the task's hard time limit (it expires: past it the runner
was killed). A waiting delivery takes over at once a claim whose runner is gone: a process of this machine that
no longer exists, a worker that no longer serves (stale heartbeat, another incarnation), or a worker that has
taken a later claim (it runs one group at a time: its release of this one was lost, as in an outage). This
rests on one pool process per worker id, as ``farm worker`` starts it.

A store outage is retried for ``settings.store_retry_seconds`` (``farm_fleet.retry``); past that the caller
decides (a worker leaves the task to be redelivered, the coordinator waits and carries on).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from farm_fleet import presence
from farm_fleet.protocol import STATUS_OK, GroupKey, GroupResult
from farm_fleet.retry import retrying
from farm_fleet.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Runner:
    """Who runs a group now: a worker, its incarnation (``farm_fleet.presence``), the process, and the process
    space it lives in (the machine's boot and its pid namespace: a pid means something only there). What a run
    claim holds, as JSON."""

    worker: str
    incarnation: str
    pid: int
    space: str = ""

    @classmethod
    def here(cls, worker: str) -> Runner:
        return cls(worker, presence.INCARNATION, os.getpid(), _SPACE)

    def encode(self) -> str:
        return json.dumps({"worker": self.worker, "incarnation": self.incarnation, "pid": self.pid,
                           "space": self.space}, sort_keys=True)

    @classmethod
    def decode(cls, raw: str) -> Runner:
        """The runner a claim names; an unreadable claim names nobody alive (it is taken over)."""
        try:
            data = json.loads(raw)
            return cls(str(data["worker"]), str(data["incarnation"]), int(data["pid"]), str(data.get("space", "")))
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls("", "", 0)

    def __str__(self) -> str:
        return f"worker {self.worker or '?'} (pid {self.pid})"


def _process_space() -> str:
    """This machine's boot id and this process's pid namespace ("" where Linux's /proc does not say)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


_SPACE = _process_space()


def _process_exists(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Begun:
    """What a delivery found when it began a group: the stored result (answer with it), or else the attempt this
    delivery makes (1 for the first), its run claim taken."""

    result: GroupResult | None = None
    attempt: int = 0


@runtime_checkable
class ResultsStore(Protocol):
    """The worker's results store: what a group task asks before, while and after it runs a group.
    :class:`MemoryResults` (the embedded farm) and :class:`RedisResults` (a fleet) implement it."""

    def begin(self, key: GroupKey, runner: Runner, seconds: float) -> Begun:
        """The stored result of the group, or else one more attempt counted and ``runner``'s run claim taken for
        ``seconds``."""
        ...

    def put_if_absent(self, result: GroupResult) -> GroupResult:
        """Store ``result`` unless one is there (ending the group's run claim); return the stored one."""
        ...

    def release(self, key: GroupKey, runner: Runner) -> None:
        """Give up ``runner``'s run claim on a group whose run ended without a result."""
        ...

    def running_elsewhere(self, key: GroupKey, runner: Runner) -> Runner | None:
        """The live runner of another worker that holds the group's run claim now, or None."""
        ...

    def started(self, keys: list[GroupKey], worker: str, incarnation: str = "") -> None:
        """Record that a delivery of these groups started now on ``worker``."""
        ...

    def unrun(self, keys: list[GroupKey]) -> None:
        """Tell the coordinator that a batch ended without running these groups."""
        ...


class MemoryResults:
    """In-process results (the embedded farm)."""

    def __init__(self) -> None:
        self._results: dict[GroupKey, GroupResult] = {}
        self._attempts: dict[GroupKey, int] = {}
        self._lock = threading.Lock()

    def put_if_absent(self, result: GroupResult) -> GroupResult:
        """Store unless a result is already there; return the stored one."""
        with self._lock:
            return self._results.setdefault(result.key, result)

    def get(self, key: GroupKey) -> GroupResult | None:
        with self._lock:
            return self._results.get(key)

    def get_many(self, keys: list[GroupKey]) -> list[GroupResult | None]:
        with self._lock:
            return [self._results.get(k) for k in keys]

    def attempt(self, key: GroupKey) -> int:
        """Count one more attempt and return the count (1 for the first)."""
        with self._lock:
            self._attempts[key] = self._attempts.get(key, 0) + 1
            return self._attempts[key]

    def begin(self, key: GroupKey, runner: Runner, seconds: float) -> Begun:
        """The stored result, or when there is none one more attempt counted. One process runs its groups one at a
        time: there is no other runner to wait for."""
        with self._lock:
            found = self._results.get(key)
        return Begun(result=found) if found is not None else Begun(attempt=self.attempt(key))

    def release(self, key: GroupKey, runner: Runner) -> None:
        """Nothing to release in one process."""

    def running_elsewhere(self, key: GroupKey, runner: Runner) -> Runner | None:
        return None

    def started(self, keys: list[GroupKey], worker: str, incarnation: str = "") -> None:
        """In-process tasks start when the coordinator runs them: nothing to record."""

    def unrun(self, keys: list[GroupKey]) -> None:
        """In one process the coordinator runs each group itself and sees what it did not run: nothing to tell."""

    def discard(self, keys: Iterable[GroupKey]) -> None:
        """Forget these groups' results and attempts (a failed group runs again on a rerun)."""
        with self._lock:
            for key in keys:
                self._results.pop(key, None)
                self._attempts.pop(key, None)


# KEYS: result, attempts, run claim, the worker's latest claim (its name). ARGV: attempts TTL (s), our claim, the
# claim we may replace ("" for none, or a gone runner's), claim TTL (ms). {"result", stored result} /
# {"held", the live claim} / {"run", attempt number}, the claim taken and the attempt counted: one round trip.
_BEGIN = """
local found = redis.call('GET', KEYS[1])
if found then return {'result', found} end
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= ARGV[3] then return {'held', holder} end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[4])
redis.call('SET', KEYS[4], KEYS[3], 'PX', ARGV[4])
local count = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[1])
return {'run', count}
"""
# Compare-and-delete: only the claim's own runner (or its successor) releases it.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
WAIT_POLL_SECONDS = 0.25  # how often a delivery waiting on another one's run looks again


class RedisResults:
    """Results as JSON strings under ``settings.result_key``, written with SET NX (first one wins). Every call
    retries a store outage for ``settings.store_retry_seconds`` before raising StoreUnavailable."""

    def __init__(self, client: Any, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self._begin = client.register_script(_BEGIN)
        self._release = client.register_script(_RELEASE)

    def _retry(self, call: Callable[[], T]) -> T:
        return retrying(call, self.settings.store_retry_seconds, "the results Redis")

    def put_if_absent(self, result: GroupResult) -> GroupResult:
        key = self.settings.result_key(result.key)
        done = self.settings.done_key(result.run)
        payload = json.dumps(result.to_dict(), sort_keys=True)
        ttl = int(self.settings.result_ttl)

        def put() -> Any:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.set(key, payload, nx=True, ex=ttl)
                pipe.get(key)
                pipe.rpush(done, key)
                pipe.expire(done, ttl)
                pipe.delete(self.settings.running_key(result.key))
                return pipe.execute()

        stored, found = self._retry(put)[:2]
        return result if stored else GroupResult.from_dict(json.loads(found))

    def started(self, keys: list[GroupKey], worker: str, incarnation: str = "") -> None:
        """Record that a delivery of these groups started now on ``worker`` (expires with the results)."""
        now = time.time()
        value = json.dumps({"at": now, "worker": worker, "incarnation": incarnation})

        def mark() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.set(self.settings.started_key(key), value, ex=int(self.settings.result_ttl))
                pipe.execute()

        self._retry(mark)

    def started_at(self, keys: list[GroupKey]) -> list[float | None]:
        """When each group's latest delivery started (epoch seconds), None if none did."""
        if not keys:
            return []
        raws = self._retry(lambda: self.client.mget([self.settings.started_key(k) for k in keys]))
        return [float(json.loads(r)["at"]) if r else None for r in raws]

    def unrun(self, keys: list[GroupKey]) -> None:
        """Tell the coordinator that a batch ended without running these groups (it sends them again at once)."""
        if not keys:
            return
        ttl = int(self.settings.result_ttl)

        def push() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    done = self.settings.done_key(key.run)
                    pipe.rpush(done, self.settings.unrun_key(key))
                    pipe.expire(done, ttl)
                pipe.execute()

        self._retry(push)

    def notices(self, rounds: list[str], timeout: float) -> list[tuple[str, GroupKey]]:
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

    def get(self, key: GroupKey) -> GroupResult | None:
        raw = self._retry(lambda: self.client.get(self.settings.result_key(key)))
        return GroupResult.from_dict(json.loads(raw)) if raw is not None else None

    def get_many(self, keys: list[GroupKey]) -> list[GroupResult | None]:
        if not keys:
            return []
        raws = self._retry(lambda: self.client.mget([self.settings.result_key(k) for k in keys]))
        return [GroupResult.from_dict(json.loads(r)) if r is not None else None for r in raws]

    def begin(self, key: GroupKey, runner: Runner, seconds: float) -> Begun:
        """What a worker asks before it runs a group: the stored result; or else ``runner``'s run claim is taken
        for ``seconds`` (until the task's hard time limit) and one more attempt counted. One round trip, unless
        another delivery runs the group now: then this one waits, looking again every ``WAIT_POLL_SECONDS``, for
        that run's result, or takes the claim over once its runner is gone (``runs``)."""
        keys = [self.settings.result_key(key), self.settings.attempts_key(key), self.settings.running_key(key),
                self.settings.claims_key(runner.worker)]
        deadline = time.monotonic() + seconds
        mine = runner.encode()

        def step(replaces: str) -> tuple[str, Any]:
            args = [int(self.settings.result_ttl), mine, replaces, max(1, int((deadline - time.monotonic()) * 1000))]
            kind, value = self._retry(lambda: self._begin(keys=keys, args=args))
            return str(kind), value

        waited = False
        while True:
            kind, value = step("")
            if kind == "held" and not self.runs(Runner.decode(value), runner, keys[2]):
                kind, value = step(value)  # its runner is gone: take the claim over, unless another delivery just did
            if kind == "result":
                return Begun(result=GroupResult.from_dict(json.loads(value)))
            if kind == "run":
                return Begun(attempt=int(value))
            if not waited:
                log.info("group %s of %s runs on %s now: waiting for its result", key.group, key.problem_id,
                         Runner.decode(value))
                waited = True
            time.sleep(WAIT_POLL_SECONDS)

    def runs(self, holder: Runner, me: Runner, claim: str) -> bool:
        """Whether the runner named by the run claim ``claim`` may still be running its group. Its worker runs one
        group at a time, so ``claim`` must be the last one that worker took (a runner that moved on to another
        group ran this one to an end whose release was lost, e.g. in an outage). Then, in this process space, its
        process must exist (and not be ``me``); elsewhere its worker must still serve."""
        if not holder.worker:
            return False
        latest = self._retry(lambda: self.client.get(self.settings.claims_key(holder.worker)))
        if latest != claim:
            return False
        if holder.space and holder.space == me.space:
            return holder.pid != me.pid and _process_exists(holder.pid)
        return self._retry(lambda: presence.serving(self.client, self.settings, holder.worker, holder.incarnation))

    def release(self, key: GroupKey, runner: Runner) -> None:
        """Give up ``runner``'s claim on a group whose run ended without a result (quarantine, an outage, the
        process stopping): a waiting or later delivery runs it at once."""
        claim = self.settings.running_key(key)
        self._retry(lambda: self._release(keys=[claim], args=[runner.encode()]))

    def release_orphan(self, runner: Runner) -> None:
        """Release the claim that ``runner``'s worker took last if the process that took it is gone: a pool
        process calls this when it starts, so a predecessor killed mid-group holds its group no longer. One try,
        no back-off (a process start must stay quick): a claim left behind expires at its task's hard limit."""
        name = self.client.get(self.settings.claims_key(runner.worker))
        raw = self.client.get(name) if name else None
        if raw is None:
            return
        holder = Runner.decode(raw)
        same_worker = (holder.worker, holder.incarnation) == (runner.worker, runner.incarnation)
        if same_worker and holder.space == runner.space and not _process_exists(holder.pid):
            log.warning("released the run claim %s of %s, gone", name, holder)
            self._release(keys=[name], args=[raw])

    def running_elsewhere(self, key: GroupKey, runner: Runner) -> Runner | None:
        """The live runner that holds the group's claim now, unless it is ``runner``'s own worker (whose task
        ended: what it held is over)."""
        claim = self.settings.running_key(key)
        raw = self._retry(lambda: self.client.get(claim))
        if raw is None:
            return None
        holder = Runner.decode(raw)
        if (holder.worker, holder.incarnation) == (runner.worker, runner.incarnation):
            return None
        return holder if self.runs(holder, runner, claim) else None

    def discard(self, keys: Iterable[GroupKey]) -> None:
        """Forget these groups' results, attempts, start marks and run claims (a failed group runs again on a
        rerun)."""
        names = [name for k in keys for name in (self.settings.result_key(k), self.settings.attempts_key(k),
                                                 self.settings.started_key(k), self.settings.running_key(k))]
        if names:
            self._retry(lambda: self.client.delete(*names))


def reusable(result: GroupResult | None) -> bool:
    """Only a successful group result is reused by a later run; a failure runs again."""
    return result is not None and result.status == STATUS_OK
