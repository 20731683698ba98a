"""The Redis tier: one hash of decision records per fingerprint, published by one server-side function.

Writers (the coordinator) publish through ``farm_publish`` (``publish.lua``): replacement rule, problem index,
fingerprint text and the update event happen in one atomic call. Readers (runtime processes) use the store as a
read-only fleet tier: one HGET per lookup; an unreachable server is a miss and a logged warning, retried only
after a back-off, never an exception on the caller's path.
"""

from __future__ import annotations

import binascii
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
# The "farm" library: publication (publish.lua), the nearest-decision lookup (nearest.lua) and the fleet-priors
# lookup (priors.lua), one FUNCTION LOAD.
FUNCTION_SOURCE = "\n".join((Path(__file__).with_name(name)).read_text()
                             for name in ("publish.lua", "nearest.lua", "priors.lua"))


@dataclass(frozen=True)
class KeyLayout:
    """Where decision data lives in Redis: every key starts with ``prefix`` (``FARM_PREFIX``, default "farm").

    The fleet's settings extend it with the fleet's own keys; a runtime reading decisions needs only this."""

    prefix: str = "farm"
    events_maxlen: int = 10000

    @classmethod
    def from_env(cls) -> KeyLayout:
        return cls(prefix=os.environ.get("FARM_PREFIX") or "farm")

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def decisions_key(self, fingerprint_digest: str) -> str:
        """Hash per fingerprint: sha256(cache key) -> decision record JSON."""
        return self.key("decisions", fingerprint_digest)

    @property
    def fingerprints_key(self) -> str:
        """Hash: fingerprint digest -> full fingerprint text."""
        return self.key("fingerprints")

    @property
    def events_key(self) -> str:
        """Stream of decision updates."""
        return self.key("events")

    def trials_key(self, fingerprint_digest: str) -> str:
        """Hash per fingerprint: sha256(cache key) -> JSON list of the trial rows behind the decision."""
        return self.key("trials", fingerprint_digest)

    def problems_key(self, fingerprint_digest: str) -> str:
        """Hash per fingerprint: problem id -> sha256(cache key) of its published decision."""
        return self.key("problems", fingerprint_digest)


field_for = key_sha256  # the hash field of a cache key (farm.stores.base.key_sha256, its one definition)


def connection(pool: Any, command: str) -> Any:
    """A connection of redis-py's ``pool`` for packed commands (release it to the pool when done)."""
    try:
        return pool.get_connection()
    except TypeError:  # redis-py before 5.3 needs a command name
        return pool.get_connection(command)


_BULK = b"$%d\r\n%b\r\n"  # a bulk string of the Redis protocol (RESP): its length in bytes, then its bytes
_DECISION = _BULK * 9  # the nine arguments of one decision of farm_publish, formatted at once


def _resp(args: Sequence[bytes], decisions: Sequence[bytes] = ()) -> bytes:
    """One command in the Redis protocol (RESP), the project's one encoder: an array of bulk strings, ``args``
    then the nine of each of ``decisions`` (formatted by ``_DECISION``)."""
    return b"".join([b"*%d\r\n" % (len(args) + 9 * len(decisions)), *[_BULK % (len(arg), arg) for arg in args],
                     *decisions])


def _reply(conn: Any, queued: int) -> Any:
    """The reply of the first command sent: of a transaction of ``queued`` commands, or of one command alone
    (``queued`` 0); an error reply is returned. A command refused while queueing raises (EXECABORT)."""
    redis = redis_module()
    if not queued:
        try:
            return conn.read_response()
        except redis.ResponseError as e:
            return e
    conn.read_response()  # +OK
    for _ in range(queued):
        with contextlib.suppress(redis.ResponseError):
            conn.read_response()  # +QUEUED, or why the command was refused (EXEC then aborts)
    return conn.read_response()[0]


def redis_module() -> Any:
    import redis

    return redis


def connect(url: str, timeout: float = 2.0, retries: bool = True) -> Any:
    """A redis-py client for ``url`` with bounded socket timeouts (imported lazily: the core stays light).
    ``retries=False`` for the runtime's read path: one failed attempt, then the store's own back-off."""
    import redis

    options: dict[str, Any] = {}
    if not retries:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        options = {"retry": Retry(NoBackoff(), 0), "retry_on_error": []}
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout, socket_connect_timeout=timeout,
                                **options)


class RedisDecisions:
    """Decision records in Redis under ``settings``' key layout.

    As a fleet tier give it ``url`` (or a client); lookups back off for ``backoff`` seconds (doubling up to 60)
    after a connection failure.
    """

    def __init__(
        self, url: str | None = None, *, client: Any = None, settings: KeyLayout | None = None,
        timeout: float = 0.5, backoff: float = 1.0,
    ) -> None:
        if client is None:
            if url is None:
                raise ValueError("RedisDecisions needs a url or a client")
            client = connect(url, timeout, retries=False)
        self.client = client
        self.settings = settings or KeyLayout.from_env()
        self._backoff_initial = backoff
        self._backoff = backoff
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._function_loaded = False
        self._rank_on_server = True  # farm_nearest answers (false once it was missing or refused)
        self._priors_on_server = True  # farm_priors answers (likewise)
        self._publish_keys: dict[str, tuple[str, str, list[str]]] = {}
        self.failures = 0
        self._regimes = RegimeCheck(
            "the fleet Redis", lambda: dict(self.client.hgetall(self.settings.fingerprints_key)),
            lambda digest, key: bool(self.client.hexists(self.settings.decisions_key(digest), field_for(key))),
            lambda digest: (raw for _, raw in self.client.hscan_iter(self.settings.decisions_key(digest), count=100)))

    # -- fleet-tier reads ---------------------------------------------------------------------------------

    def _digest(self, cache_key: str) -> str:
        """The digest of the environment a cache key names, decoded from the key (callers without it)."""
        return fingerprint_digest(key_environment(cache_key))

    def get(self, cache_key: str) -> DecisionRecord | None:
        """The record for a cache key (its environment read from the key), as :meth:`get_in`."""
        return self.get_in(key_environment(cache_key), cache_key)

    def get_in(self, environment: str, cache_key: str) -> DecisionRecord | None:
        """The record for a cache key whose environment (fingerprint) is ``environment``: None on a miss or while
        backing off; CorruptRecord for a bad record."""
        import redis

        if time.monotonic() < self._down_until:
            return None
        try:
            raw = self.client.hget(self.settings.decisions_key(fingerprint_digest(environment)), field_for(cache_key))
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            self._unreachable(e)
            return None
        self._backoff = self._backoff_initial
        if raw is None:
            self._regimes.missed(cache_key, fingerprint_digest(environment))  # says once if another regime has decisions
            return None
        return DecisionRecord.from_json(raw, expected_key=cache_key)

    def _unreachable(self, e: Exception) -> None:
        with self._lock:
            self.failures += 1
            self._down_until = time.monotonic() + self._backoff
            log.warning("fleet Redis unreachable (%s); treating lookups as misses for %.1fs", e, self._backoff)
            self._backoff = min(self._backoff * 2, 60.0)

    def nearest(self, query: NearestQuery, max_distance: float) -> list[NearestHit]:
        """The stored decisions of the query's family within ``max_distance``, nearest first (farm.nearest, the
        index of farm.stores.redis_nearest: two round trips, ranked on the server where its function may run);
        [] while backing off."""
        import redis

        if time.monotonic() < self._down_until:
            return []
        try:
            found, self._rank_on_server = redis_nearest.lookup(self.client, self.settings, query, max_distance,
                                                               self._rank_on_server)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            self._unreachable(e)
            return []
        self._backoff = self._backoff_initial
        return found

    def priors(self, family: str, exclude: str, limit: int) -> list[tuple[str, DecisionRecord]]:
        """(fingerprint digest, record) of up to ``limit`` fingerprints other than ``exclude`` whose problem index
        maps ``family`` (a problem family's id across fingerprints, farm_coordinator.plan), in digest order: one
        round trip (farm.stores.redis_priors). Raises what redis-py raises: the coordinator's store is no fleet
        tier, an outage there is the run's."""
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
        """Add every stored decision to the nearest-decision index (for decisions published before it existed;
        idempotent); return how many were read."""
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

    # -- publication --------------------------------------------------------------------------------------

    def load_function(self) -> None:
        self.client.function_load(FUNCTION_SOURCE, replace=True)
        self._function_loaded = True

    def publish(
        self, record: DecisionRecord, fingerprint: str, problem_id: str = "", trials: list[dict[str, Any]] | None = None,
        fence: tuple[str, str] | None = None,
    ) -> tuple[bool, str]:
        """Publish atomically under the replacement rule, with the trial rows behind the decision (every timing
        pair and verdict with its provenance); return (replaced, reason). With ``fence`` (key, value) the call is
        refused ("refused: stale lease ...") unless that key holds exactly that value, and consumes the key."""
        return self.publish_many([Publication(record, fingerprint, problem_id, tuple(trials or ()), fence=fence)])[0]

    def publish_many(self, publications: Iterable[Publication], batch: int = 2000) -> list[tuple[bool, str]]:
        """Publish through :meth:`publish_batch`, ``batch`` publications at a time, one ``farm_publish`` call for
        each fingerprint's run of them; return (replaced, reason) per publication."""
        results: list[tuple[bool, str]] = []
        pending = iter(publications)
        while chunk := list(itertools.islice(pending, batch)):
            for _, run in itertools.groupby(chunk, key=lambda pub: pub.fingerprint):
                pubs = list(run)
                results += self.publish_batch(PublicationBatch.of(pubs[0].fingerprint, pubs), size=len(pubs))
        return results

    def publish_batch(self, batch: PublicationBatch, size: int = 1000) -> list[tuple[bool, str]]:
        """The store's one publication: ``batch`` by ``farm_publish`` (publish.lua: for each decision, in order,
        the replacement rule, trial rows, problem index, fingerprint, update event and fence), ``size`` decisions
        per call, each call in one MULTI/EXEC with their nearest-decision index entries and problem-id aliases (one
        round trip each, the next one encoded while the server runs this one); return (replaced, reason) per
        decision. A refused command raises ``redis.ResponseError`` after its transaction: earlier ones stay applied
        (each publication is idempotent under the replacement rule)."""
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
                reasons = str(reply).split("\n") if decisions else []
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
        """Decisions ``start`` to ``stop`` of ``batch`` as one ``farm_publish`` call (its keys and arguments,
        publish.lua's, built here and nowhere else) followed by their index commands, packed in one MULTI/EXEC:
        the number of decisions, of commands queued (0: the call alone, no transaction) and the packed bytes.
        redis-py's generic per-argument packing costs more than the server's work for a batch."""
        cached = self._publish_keys.get(batch.fingerprint)
        if cached is None:
            digest = fingerprint_digest(batch.fingerprint)
            s = self.settings
            cached = self._publish_keys[batch.fingerprint] = (digest, str(s.events_maxlen), [
                s.decisions_key(digest), s.problems_key(digest), s.fingerprints_key, s.events_key,
                s.trials_key(digest)])
        digest, maxlen, keys = cached
        texts, trials, fields = batch.texts[start:stop], batch.trials[start:stop], batch.digests[start:stop]
        names = [b"FCALL", b"farm_publish", b"", *(k.encode() for k in keys)]
        decisions = []
        for i in range(stop - start):
            at = start + i
            fence = batch.fences[at] if batch.fences else None
            if fence is not None:  # its lease key after the others (a lease's value is never empty)
                names.append(fence[0].encode())
            text, pid, rows = texts[i].encode(), (batch.problem_ids[at] or "").encode(), trials[i].encode()
            verified, created = b"true" if batch.verified[at] else b"false", repr(batch.created[at]).encode()
            name, run, lease = batch.names[at].encode(), batch.runs[at].encode(), b"" if fence is None else fence[1].encode()
            decisions.append(_DECISION % (64, binascii.hexlify(fields[i]), len(text), text, len(pid), pid, len(rows),
                                          rows, len(verified), verified, len(created), created, len(name), name,
                                          len(run), run, len(lease), lease))
        names[2] = b"%d" % (len(names) - 3)
        head = [*names, digest.encode(), batch.fingerprint.encode(), maxlen.encode()]
        index = redis_nearest.index_commands(self.settings.key, [(k, digest) for k in batch.cache_keys[start:stop]])
        problems = self.settings.problems_key(digest).encode()
        index += [[b"HSET", problems, alias.encode(), fields[i].hex().encode()]  # Publication.aliases
                  for i, aliases in enumerate(batch.aliases[start:stop]) for alias in aliases]
        call = _resp(head, decisions)
        if not index:
            return stop - start, 0, call
        return stop - start, 1 + len(index), b"".join([_resp([b"MULTI"]), call, *(_resp(c) for c in index),
                                                      _resp([b"EXEC"])])

    # -- listing ------------------------------------------------------------------------------------------

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
        """The published records of ``problem_ids`` for this fingerprint (problem id -> record); unreadable ones are
        left out."""
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
        if not problem_ids:
            return set()
        found = self.client.hmget(self.settings.problems_key(digest), problem_ids)
        return {pid for pid, value in zip(problem_ids, found, strict=True) if value is not None}
