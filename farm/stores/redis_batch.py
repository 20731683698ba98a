"""Publishing a batch of verified decisions into Redis (an archive import), under the replacement rule.

``farm_publish`` moves every record through Lua, which costs the server about twice what plain hash writes do.
A batch is published in two steps inside one ``WATCH`` of the fingerprint's decisions hash instead:

1. ``farm_judge`` (publish.lua, read only) applies the replacement rule of ``farm_publish`` to each decision
   against what is stored, from its field, ``verified`` and ``created`` alone, and says which win and why;
2. one MULTI/EXEC writes the winners: their records, trial rows and problem ids with one HSET per hash (HDEL of
   the trial rows of a winner without any), the fingerprint text, and their update events (``farm_events``: the
   fields ``farm_publish`` writes).

If anything touched the decisions hash in between, EXEC does nothing and the batch is judged again (after
``RETRIES`` tries, it goes through ``farm_publish`` one call per decision). Each batch is one transaction: a
refusal leaves the batches before it applied, and since every publication is idempotent under the rule,
publishing again completes it. Commands are packed here (redis-py's generic packing costs more than the server's
work); the next batch is judged right after this one's transaction, and encoded while the server runs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from farm.environment import fingerprint_digest
from farm.stores.base import PublicationBatch
from farm.stores.redis import RedisDecisions, connection

BATCH = 1000  # decisions per transaction (farm_judge unpacks its fields: at most 7,000)
RETRIES = 8


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(_bulk(a) for a in args)


class _Part:
    """Decisions ``start`` to ``stop`` of a batch, encoded once (RESP bulk strings) for the two steps."""

    def __init__(self, batch: PublicationBatch, start: int, stop: int) -> None:
        self.start, self.stop = start, stop
        self.fields = [_bulk(d.hex().encode()) for d in batch.digests[start:stop]]
        self.verified = batch.verified[start:stop]
        self.judge = b"".join(
            b"%s%s%s" % (field, b"$1\r\n1\r\n" if v else b"$1\r\n0\r\n", _bulk(b"%r" % created))
            for field, v, created in zip(self.fields, self.verified, batch.created[start:stop], strict=True))
        self.records = [_bulk(t.encode()) for t in batch.texts[start:stop]]
        self.trials = [_bulk(t.encode()) if t else None for t in batch.trials[start:stop]]
        self.problems = [_bulk(p.encode()) if p else None for p in batch.problem_ids[start:stop]]
        self.events = [b"%s%s%s%s" % (field, _bulk(name.encode()), b"$4\r\ntrue\r\n" if v else b"$5\r\nfalse\r\n",
                                      _bulk(run.encode()))
                       for field, name, v, run in zip(self.fields, batch.names[start:stop], self.verified,
                                                      batch.runs[start:stop], strict=True)]

    def __len__(self) -> int:
        return self.stop - self.start


def publish_batch(decisions: RedisDecisions, batch: PublicationBatch, size: int = BATCH) -> list[tuple[bool, str]]:
    """Publish ``batch`` ``size`` decisions per transaction; return (replaced, reason) per decision, the reasons
    of ``farm_publish``. A refused command raises ``redis.ResponseError`` after its transaction."""
    if not decisions._function_loaded:
        decisions.load_function()
    s = decisions.settings
    digest = fingerprint_digest(batch.fingerprint)
    keys = {name: key.encode() for name, key in (
        ("decisions", s.decisions_key(digest)), ("problems", s.problems_key(digest)),
        ("fingerprints", s.fingerprints_key), ("events", s.events_key), ("trials", s.trials_key(digest)))}
    tail = _command(b"HSET", keys["fingerprints"], digest.encode(), batch.fingerprint.encode())
    events_head = _bulk(keys["events"]) + _bulk(digest.encode()) + _bulk(b"%d" % s.events_maxlen)
    parts: Iterator[_Part] = (_Part(batch, at, min(at + size, len(batch))) for at in range(0, len(batch), size))
    results: list[tuple[bool, str]] = []
    pool = decisions.client.connection_pool
    conn = connection(pool, "WATCH")
    try:
        part = next(parts, None)
        if part is not None:
            conn.send_packed_command([_judge(keys, part)])
        upcoming = next(parts, None)
        while part is not None:
            later: _Part | None = None
            fetched = chained = False
            for attempt in range(RETRIES + 1):
                reasons = _read_judge(conn, part)
                if attempt == RETRIES:
                    conn.send_packed_command([_command(b"UNWATCH")])
                    conn.read_response()
                    results += decisions.publish_calls(_calls(batch, part, digest, keys, s.events_maxlen))
                    chained = False
                    break
                transaction, queued = _transaction(part, keys, reasons, tail, events_head)
                chained = upcoming is not None  # the next part is judged right after this transaction
                conn.send_packed_command([transaction + (_judge(keys, upcoming) if upcoming is not None else b"")])
                if not fetched:
                    later, fetched = next(parts, None), True  # encoded while the server works
                if _read_transaction(conn, queued):
                    results += [(not r.startswith("kept"), r) for r in reasons]
                    break
                if upcoming is not None:
                    _read_judge(conn, upcoming)  # judged too early: judged again after this part
                chained = False
                conn.send_packed_command([_judge(keys, part)])  # the hash changed after WATCH: judge again
            if not fetched:
                later = next(parts, None)
            part, upcoming = upcoming, later
            if part is not None and not chained:
                conn.send_packed_command([_judge(keys, part)])
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    return results


def _judge(keys: dict[str, bytes], part: _Part) -> bytes:
    """WATCH the decisions hash, then farm_judge the part's decisions."""
    return (_command(b"WATCH", keys["decisions"]) + b"*%d\r\n" % (4 + 3 * len(part)) + _bulk(b"FCALL_RO")
            + _bulk(b"farm_judge") + _bulk(b"1") + _bulk(keys["decisions"]) + part.judge)


def _read_judge(conn: Any, part: _Part) -> list[str]:
    conn.read_response()  # +OK (WATCH)
    reply = conn.read_response()
    reasons = str(reply).split("\n") if reply else []
    if len(reasons) != len(part):
        raise RuntimeError(f"farm_judge answered {len(reasons)} reasons for {len(part)} decisions")
    return reasons


def _transaction(part: _Part, keys: dict[str, bytes], reasons: list[str], tail: bytes,
                 events_head: bytes) -> tuple[bytes, int]:
    """MULTI, the winners' writes and events, EXEC (nothing between them when nothing wins), and the number of
    commands queued."""
    records: list[bytes] = []
    trials: list[bytes] = []
    no_trials: list[bytes] = []
    problems: list[bytes] = []
    events: list[bytes] = []
    winners = 0
    for i, reason in enumerate(reasons):
        if reason.startswith("kept"):
            continue
        field = part.fields[i]
        records += (field, part.records[i])
        rows = part.trials[i]
        if rows is not None:
            trials += (field, rows)
        else:
            no_trials.append(field)
        pid = part.problems[i]
        if pid is not None:
            problems += (pid, field)
        events += (part.events[i], _bulk(reason.encode()))
        winners += 1
    out = [_command(b"MULTI")]
    if records:
        for name, pairs in (("decisions", records), ("trials", trials), ("problems", problems)):
            if pairs:
                out.append(b"*%d\r\n" % (2 + len(pairs)) + _bulk(b"HSET") + _bulk(keys[name]) + b"".join(pairs))
        if no_trials:
            out.append(b"*%d\r\n" % (2 + len(no_trials)) + _bulk(b"HDEL") + _bulk(keys["trials"])
                       + b"".join(no_trials))
        out.append(tail)
        out.append(b"*%d\r\n" % (6 + 5 * winners) + _bulk(b"FCALL") + _bulk(b"farm_events") + _bulk(b"1")
                   + events_head + b"".join(events))
    out.append(_command(b"EXEC"))
    return b"".join(out), len(out) - 2


def _read_transaction(conn: Any, queued: int) -> bool:
    """Read the replies of a transaction; True when EXEC applied it, False when WATCH cancelled it."""
    import redis

    conn.read_response()  # +OK (MULTI)
    refused: Exception | None = None
    for _ in range(queued):
        try:
            conn.read_response()  # +QUEUED
        except redis.ResponseError as e:
            refused = refused or e
    try:
        replies = conn.read_response()
    except redis.ResponseError as e:  # EXECABORT: a command was refused while queueing; nothing was applied
        raise refused or e from None
    if replies is None:
        return False
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return True


def _calls(batch: PublicationBatch, part: _Part, digest: str, keys: dict[str, bytes],
           maxlen: int) -> list[tuple[list[str], list[str]]]:
    """The ``farm_publish`` calls of a part (when WATCH keeps failing)."""
    names = [keys[k].decode() for k in ("decisions", "problems", "fingerprints", "events", "trials")]
    return [(names, [batch.digests[at].hex(), batch.texts[at], batch.problem_ids[at] or "", digest,
                     batch.fingerprint, str(maxlen), batch.trials[at]]) for at in range(part.start, part.stop)]
