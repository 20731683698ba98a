"""The Redis tier: one hash of decision records per fingerprint, published by one server-side function.

Keys: docs/farm.md ("Redis keys"). As a runtime's fleet tier (one HGET a lookup) an outage is a miss, never an
exception: a logged warning, then a back-off."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.environment import fingerprint_digest
from farm.errors import CorruptRecord
from farm.identity import key_environment
from farm.nearest import NearestHit, NearestQuery
from farm.stores import redis_nearest, redis_priors
from farm.stores.base import DecisionRecord, Publication, PublicationBatch, key_sha256
from farm.stores.regimes import RegimeCheck

log = logging.getLogger(__name__)
FUNCTION_SOURCE = "\n".join((Path(__file__).with_name(name)).read_text()
                             for name in ("publish.lua", "nearest.lua", "priors.lua"))


@dataclass(frozen=True)
class KeyLayout:
    """The names of the decision keys (docs/farm.md, "Redis keys"), each starting with ``prefix``."""

    prefix: str = "farm"
    events_maxlen: int = 10000

    @classmethod
    def from_env(cls) -> KeyLayout:
        return cls(prefix=os.environ.get("FARM_PREFIX") or "farm")

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def decisions_key(self, fingerprint_digest: str) -> str:
        return self.key("decisions", fingerprint_digest)

    @property
    def fingerprints_key(self) -> str:
        return self.key("fingerprints")

    @property
    def events_key(self) -> str:
        return self.key("events")

    def trials_key(self, fingerprint_digest: str) -> str:
        return self.key("trials", fingerprint_digest)

    def problems_key(self, fingerprint_digest: str) -> str:
        return self.key("problems", fingerprint_digest)


field_for = key_sha256  # the hash field of a cache key (farm.stores.base.key_sha256, its one definition)


def connection(pool: Any, command: str) -> Any:
    """A connection of redis-py's ``pool`` for packed commands, to release to it (``command``: unused)."""
    return pool.get_connection()


def _resp(args: Sequence[bytes]) -> bytes:
    """One command in the Redis protocol (RESP), the project's one encoder: an array of bulk strings."""
    return b"".join([b"*%d\r\n" % len(args), *[b"$%d\r\n%b\r\n" % (len(arg), arg) for arg in args]])


def _reply(conn: Any, queued: int) -> Any:
    """The reply (an error reply returned) of one command, or of a transaction of ``queued`` commands, whose
    EXECABORT (a command refused while queueing) raises."""
    import redis

    if not queued:
        try:
            return conn.read_response()
        except redis.ResponseError as e:
            return e
    for _ in range(queued + 1):  # MULTI's +OK, then +QUEUED or why a command was refused (EXEC then aborts)
        with contextlib.suppress(redis.ResponseError):
            conn.read_response()
    return conn.read_response()[0]


def connect(url: str, timeout: float = 2.0, retries: bool = True) -> Any:
    """A redis-py client for ``url``, timeouts bounded; ``retries=False``: one try (the store backs off)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    options: dict[str, Any] = {} if retries else {"retry": Retry(NoBackoff(), 0), "retry_on_error": []}
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout, socket_connect_timeout=timeout,
                                **options)


class RedisDecisions:
    """Decision records in Redis under ``settings``' key layout. A fleet tier (from ``url`` or a client) backs
    off lookups for ``backoff`` seconds (doubling up to 60) after a connection failure."""

    def __init__(self, url: str | None = None, *, client: Any = None, settings: KeyLayout | None = None,
                 timeout: float = 0.5, backoff: float = 1.0) -> None:
        if client is None:
            if url is None:
                raise ValueError("RedisDecisions needs a url or a client")
            client = connect(url, timeout, retries=False)
        self.client = client
        self.settings = settings or KeyLayout.from_env()
        self._backoff_initial = self._backoff = backoff
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._function_loaded = False
        self._rank_on_server = self._priors_on_server = True  # the server functions answer (till refused)
        self.failures = 0
        self._regimes = RegimeCheck(
            "the fleet Redis", self.fingerprints,
            lambda digest, key: bool(self.client.hexists(self.settings.decisions_key(digest), field_for(key))),
            lambda digest: (raw for _, raw in self.client.hscan_iter(self.settings.decisions_key(digest), count=100)))

    def _digest(self, cache_key: str) -> str:
        return fingerprint_digest(key_environment(cache_key))

    def get(self, cache_key: str) -> DecisionRecord | None:
        """The record for a cache key (its environment read from the key), as :meth:`get_in`."""
        return self.get_in(key_environment(cache_key), cache_key)

    def get_in(self, environment: str, cache_key: str) -> DecisionRecord | None:
        """The record for a cache key whose environment (fingerprint) is ``environment``: None on a miss or while
        backing off; CorruptRecord for a bad record. A miss says once if another regime has decisions."""
        raw, digest = None, fingerprint_digest(environment)
        if time.monotonic() >= self._down_until:
            with self._fleet_read():
                raw = self.client.hget(self.settings.decisions_key(digest), field_for(cache_key))
                if raw is None:
                    self._regimes.missed(cache_key, digest)
        return None if raw is None else DecisionRecord.from_json(raw, expected_key=cache_key)

    @contextlib.contextmanager
    def _fleet_read(self) -> Iterator[None]:
        """Around a fleet read: a connection failure is counted, logged and suppressed; lookups back off."""
        import redis

        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            with self._lock:
                self.failures += 1
                self._down_until = time.monotonic() + self._backoff
                wait, self._backoff = self._backoff, min(self._backoff * 2, 60.0)
            log.warning("fleet Redis unreachable (%s); treating lookups as misses for %.1fs", e, wait)
        else:
            self._backoff = self._backoff_initial

    def nearest(self, query: NearestQuery, max_distance: float) -> list[NearestHit]:
        """The family's stored decisions within ``max_distance``, nearest first; [] while backing off."""
        found: list[NearestHit] = []
        if time.monotonic() >= self._down_until:
            with self._fleet_read():
                found, self._rank_on_server = redis_nearest.lookup(
                    self.client, self.settings, query, max_distance, self._rank_on_server)
        return found

    def priors(self, family: str, exclude: str, limit: int) -> list[tuple[str, DecisionRecord]]:
        """(fingerprint digest, record) of up to ``limit`` fingerprints but ``exclude`` with a decision of
        ``family`` (farm.stores.redis_priors). Raises redis-py's errors (an outage is the run's, no miss)."""
        import redis

        if not self._function_loaded and self._priors_on_server:
            try:
                self.load_function()  # as a publication would (the coordinator publishes next)
            except redis.ResponseError:
                self._priors_on_server = False  # a reader: answered here
        found, self._priors_on_server = redis_priors.lookup(self.client, self.settings, family, exclude, limit,
                                                            self._priors_on_server)
        return found

    def index_nearest(self) -> int:
        """Add every stored decision to the nearest-decision index (idempotent); return how many were read."""
        count = 0
        for digest in self.fingerprints():
            keys = [(r.cache_key, digest) for r in self.records(digest)]
            count += len(keys)
            for at in range(0, len(keys), 1000):
                for command in redis_nearest.index_commands(self.settings.key, keys[at : at + 1000]):
                    self.client.execute_command(*command)
        return count

    def put(self, record: DecisionRecord, environment: str | None = None) -> None:
        """Publish ``record`` (:meth:`publish`); ``environment``: its key's fingerprint, read from the key if None."""
        self.publish(record, key_environment(record.cache_key) if environment is None else environment)

    def delete(self, cache_key: str, environment: str | None = None) -> None:
        """Delete the record of ``cache_key``; ``environment``: its fingerprint, read from the key if None."""
        digest = self._digest(cache_key) if environment is None else fingerprint_digest(environment)
        self.client.hdel(self.settings.decisions_key(digest), field_for(cache_key))

    def load_function(self) -> None:
        self.client.function_load(FUNCTION_SOURCE, replace=True)
        self._function_loaded = True

    def publish(self, record: DecisionRecord, fingerprint: str, problem_id: str = "",
                trials: list[dict[str, Any]] | None = None,
                fence: tuple[str, str] | None = None) -> tuple[bool, str]:
        """Publish atomically under the replacement rule, with its trial rows; return (replaced, reason). With
        ``fence`` (key, value): refused ("refused: stale lease ...") unless the key holds it; consumed."""
        return self.publish_many([Publication(record, fingerprint, problem_id, tuple(trials or ()), fence=fence)])[0]

    def publish_many(self, publications: Iterable[Publication], batch: int = 2000) -> list[tuple[bool, str]]:
        """:meth:`publish_batch` per fingerprint's run, ``batch`` at a time: (replaced, reason) each."""
        results: list[tuple[bool, str]] = []
        pending = iter(publications)
        while chunk := list(itertools.islice(pending, batch)):
            for _, run in itertools.groupby(chunk, key=lambda pub: pub.fingerprint):
                pubs = list(run)
                results += self.publish_batch(PublicationBatch.of(pubs[0].fingerprint, pubs), size=len(pubs))
        return results

    def publish_batch(self, batch: PublicationBatch, size: int = 1000) -> list[tuple[bool, str]]:
        """The store's one publication: ``batch`` by ``farm_publish``, ``size`` decisions (and index entries)
        a MULTI/EXEC: (replaced, reason) each. A refused command raises ``redis.ResponseError`` after its
        transaction; earlier ones stay applied (each publication is idempotent under the replacement rule)."""
        import redis

        if not self._function_loaded:
            self.load_function()
        parts = (self._transaction(batch, at, min(at + size, len(batch))) for at in range(0, len(batch), size))
        results: list[tuple[bool, str]] = []
        pool = self.client.connection_pool
        conn = connection(pool, "FCALL")
        try:
            part = next(parts, None)
            while part is not None:
                decisions, queued, packed = part
                conn.send_packed_command([packed])
                upcoming = next(parts, None)  # encoded while the server runs this transaction
                reply = _reply(conn, queued)
                if isinstance(reply, redis.ResponseError) and "Function not found" in str(reply):
                    self.load_function()  # the server restarted without it
                    conn.send_packed_command([packed])
                    reply = _reply(conn, queued)
                if isinstance(reply, Exception):
                    raise reply
                reasons = str(reply).split("\n")
                if len(reasons) != decisions:
                    raise RuntimeError(f"farm_publish answered {len(reasons)} reasons for {decisions} decisions")
                results += [(not r.startswith(("kept", "refused")), r) for r in reasons]
                part = upcoming
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        return results

    def _transaction(self, batch: PublicationBatch, start: int, stop: int) -> tuple[int, int, bytes]:
        """Decisions ``start`` to ``stop`` as one ``farm_publish`` call (publish.lua's arguments) and their
        index commands in one MULTI/EXEC: the number of decisions, of commands queued (0: none), the bytes."""
        s, digest, count = self.settings, fingerprint_digest(batch.fingerprint), stop - start
        keys = [s.decisions_key(digest), s.problems_key(digest), s.fingerprints_key, s.events_key,
                s.trials_key(digest)]
        args: list[bytes] = []
        for at in range(start, stop):
            fence = batch.fences[at] if batch.fences else None
            if fence is not None:  # its lease key after the others (a lease's value is never empty)
                keys.append(fence[0])
            args += [text.encode() for text in (
                batch.digests[at].hex(), batch.texts[at], batch.problem_ids[at] or "", batch.trials[at],
                "true" if batch.verified[at] else "false", repr(batch.created[at]), batch.names[at],
                batch.runs[at], "" if fence is None else fence[1])]
        call = _resp([b"FCALL", b"farm_publish", b"%d" % len(keys), *(k.encode() for k in keys),
                      digest.encode(), batch.fingerprint.encode(), str(s.events_maxlen).encode(), *args])
        index = redis_nearest.index_commands(s.key, [(k, digest) for k in batch.cache_keys[start:stop]])
        index += [[b"HSET", s.problems_key(digest).encode(), alias.encode(), batch.digests[at].hex().encode()]
                  for at in range(start, stop) for alias in (batch.aliases[at] if batch.aliases else ())]
        return ((count, 1 + len(index), _resp([b"MULTI"]) + call + b"".join(map(_resp, [*index, [b"EXEC"]])))
                if index else (count, 0, call))

    def fingerprints(self) -> dict[str, str]:
        """Digest -> fingerprint text of every fingerprint with published decisions."""
        return dict(self.client.hgetall(self.settings.fingerprints_key))

    def records(self, digest: str) -> Iterator[DecisionRecord]:
        """Every readable record of one fingerprint (corrupt ones are logged and skipped)."""
        for _, raw in self.client.hscan_iter(self.settings.decisions_key(digest), count=1000):
            try:
                yield DecisionRecord.from_json(raw)
            except CorruptRecord as e:
                log.warning("skipping unreadable decision record in %s: %s", digest, e)

    def trials(self, digest: str, cache_key: str) -> list[dict[str, Any]]:
        """The trial rows published with a decision ([] when none were)."""
        raw = self.client.hget(self.settings.trials_key(digest), field_for(cache_key))
        return list(json.loads(raw)) if raw else []

    def problem_records(self, digest: str, problem_ids: list[str]) -> dict[str, DecisionRecord]:
        """Problem id -> published record of each of ``problem_ids`` (unreadable ones left out)."""
        if not problem_ids:
            return {}
        fields = self.client.hmget(self.settings.problems_key(digest), problem_ids)
        raws = self.client.hmget(self.settings.decisions_key(digest), [f or "-" for f in fields])
        found: dict[str, DecisionRecord] = {}
        for pid, field, raw in zip(problem_ids, fields, raws, strict=True):
            if field and raw:
                with contextlib.suppress(CorruptRecord):
                    found[pid] = DecisionRecord.from_json(raw)
        return found

    def decided(self, digest: str, problem_ids: list[str]) -> set[str]:
        """Which of ``problem_ids`` already have a published decision for this fingerprint."""
        found = self.client.hmget(self.settings.problems_key(digest), problem_ids) if problem_ids else []
        return {pid for pid, value in zip(problem_ids, found, strict=True) if value is not None}
