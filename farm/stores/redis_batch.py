"""Publishing a batch of verified decisions into Redis (an archive import), under the replacement rule.

``farm_publish`` moves every record through Lua, which costs the server about twice what plain hash writes do.
A batch is published in two steps inside one ``WATCH`` of the fingerprint's decisions hash instead:

1. ``farm_judge`` (publish.lua, read only) applies the replacement rule of ``farm_publish`` to each decision
   against what is stored, from its field, ``verified`` and ``created`` alone, and says which win and why;
2. one MULTI/EXEC writes the winners: their records, trial rows and problem ids with one HSET per hash (HDEL of
   the trial rows of a winner without any), the fingerprint text, and their update events (``farm_events``: the
   fields ``farm_publish`` writes), and the part's nearest-decision index entries (``farm.stores.redis_nearest``).

If anything touched the decisions hash in between, EXEC does nothing and the batch is judged again (after
``RETRIES`` tries, it goes through ``farm_publish`` one call per decision). Each batch is one transaction: a
refusal leaves the batches before it applied, and since every publication is idempotent under the rule,
publishing again completes it. Commands are packed here, column by column (redis-py's generic packing, or any
Python work per value, costs more than the server's): a part's values become Arrow arrays, pyarrow compute builds
every RESP bulk string and selects the winners' rows, and their arguments are sent straight from the arrays' data.
The next batch is judged right after this one's transaction, and encoded while the server runs it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

from farm.environment import fingerprint_digest
from farm.stores.base import PublicationBatch
from farm.stores.columns import arrow_texts
from farm.stores.redis import RedisDecisions, connection
from farm.stores.redis_nearest import index_commands

BATCH = 1000  # decisions per transaction (farm_judge unpacks its fields: at most 7,000)
RETRIES = 8


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(_bulk(a) for a in args)


# Column-wise encoding (pyarrow compute): the values of a part are the rows of large_string arrays (64-bit
# offsets: no 2 GiB bound), encoded for all rows at once by Arrow's kernels, with no Python object per value.
_Chunk = bytes | memoryview  # what is sent: packed commands, and views of the arrays' data


def _column(values: Sequence[str | None]) -> Any:
    """The values as a large_string array (None: null)."""
    import pyarrow as pa

    return pa.array(values, pa.large_string())


def _join(*parts: Any) -> Any:
    """Element-wise concatenation of large_string arrays and ``str`` constants (repeated on every row); null
    where any array is null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(
        *(pa.scalar(p, pa.large_string()) if isinstance(p, str) else p for p in parts), pa.scalar("", pa.large_string()))


def _bulks(values: Any) -> tuple[Any, ...]:
    """The pieces of each value's RESP bulk string, for :func:`_join`: ``$``, its UTF-8 byte length, CRLF, the
    value, CRLF."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return "$", pc.cast(pc.binary_length(values), pa.large_string()), "\r\n", values, "\r\n"


def _either(mask: Any, yes: str, no: str) -> Any:
    """``yes`` where ``mask`` holds, ``no`` elsewhere (large_string)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.if_else(mask, pa.scalar(yes, pa.large_string()), pa.scalar(no, pa.large_string()))


def _present(values: Any) -> Any:
    """Whether each value is there: neither null nor empty."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.greater(pc.binary_length(values), 0), False)


def _where(rows: Any, mask: Any) -> Any:
    """The rows where ``mask`` holds (all of them without a copy when it always does)."""
    import pyarrow.compute as pc

    return rows if mask.false_count == 0 else pc.filter(rows, mask)


def _packed(rows: Any) -> memoryview:
    """The rows of a large_string array without nulls, concatenated, as a view of its data buffer: the rows are
    contiguous there, between the first and the last offset."""
    if len(rows) == 0:
        return memoryview(b"")
    if rows.null_count:
        raise ValueError("cannot pack a column holding nulls")
    _, offsets, data = rows.buffers()
    if data is None:  # every row empty
        return memoryview(b"")
    (first,) = struct.unpack_from("=q", offsets, 8 * rows.offset)
    (last,) = struct.unpack_from("=q", offsets, 8 * (rows.offset + len(rows)))
    return memoryview(data)[first:last]


class _Part:
    """Decisions ``start`` to ``stop`` of a batch, encoded once, column-wise, for the two steps: ``judge`` the
    arguments of farm_judge (packed), the others one row per decision (RESP bulk strings, large_string arrays):
    ``fields``, ``records`` (field and record), ``trials`` (field and trial rows: written where ``with_trials``,
    the field deleted elsewhere), ``problems`` (problem id and field: written where ``with_problem``) and
    ``events`` (field, winner, verified and run: the arguments of the decision's event but its reason)."""

    def __init__(self, batch: PublicationBatch, start: int, stop: int, index: list[list[bytes]] | None = None) -> None:
        import pyarrow as pa

        self.start, self.stop = start, stop
        self.index = index or []  # the part's nearest-decision index commands (farm.stores.redis_nearest)
        self.fields = fields = _join(*_bulks(_column([d.hex() for d in batch.digests[start:stop]])))
        verified = pa.array(batch.verified[start:stop], pa.bool_())
        created = _column([repr(c) for c in batch.created[start:stop]])  # Python's repr, as Lua's tonumber reads
        self.judge = bytes(_packed(_join(fields, _either(verified, "$1\r\n1\r\n", "$1\r\n0\r\n"), *_bulks(created))))
        self.records = _join(fields, *_bulks(arrow_texts(batch.texts, start, stop)))
        trials = arrow_texts(batch.trials, start, stop)
        self.with_trials = _present(trials)
        self.trials = _join(fields, *_bulks(trials))
        problems = _column(batch.problem_ids[start:stop])
        self.with_problem = _present(problems)
        self.problems = _join(*_bulks(problems), fields)  # null where there is none
        self.events = _join(fields, *_bulks(_column(batch.names[start:stop])),
                            _either(verified, "$4\r\ntrue\r\n", "$5\r\nfalse\r\n"),
                            *_bulks(_column(batch.runs[start:stop])))

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
    parts: Iterator[_Part] = (
        _Part(batch, at, stop, index_commands(s.key, [(k, digest) for k in batch.cache_keys[at:stop]]))
        for at, stop in ((at, min(at + size, len(batch))) for at in range(0, len(batch), size)))
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
                    results += decisions.publish_calls(_calls(batch, part, digest, keys, s.events_maxlen), part.index)
                    chained = False
                    break
                transaction, queued = _transaction(part, keys, reasons, tail, events_head)
                chained = upcoming is not None  # the next part is judged right after this transaction
                after = [_judge(keys, upcoming)] if upcoming is not None else []
                conn.send_packed_command([*transaction, *after])
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
                 events_head: bytes) -> tuple[list[_Chunk], int]:
    """MULTI, the winners' writes and events, the part's nearest-decision index entries, EXEC, as the chunks to
    send, and the number of commands queued. The winners (reasons but "kept...") are the rows selected from the
    part's arrays; their arguments are sent straight from the arrays' data."""
    import pyarrow.compute as pc

    said = _column(reasons)
    wins = pc.invert(pc.starts_with(said, "kept"))
    out: list[_Chunk] = [_command(b"MULTI")]
    queued = 0
    if wins.true_count:
        records = _where(part.records, wins)
        trials = _where(part.trials, pc.and_(wins, part.with_trials))
        problems = _where(part.problems, pc.and_(wins, part.with_problem))
        for name, pairs in (("decisions", records), ("trials", trials), ("problems", problems)):
            if len(pairs):
                out += (b"*%d\r\n" % (2 + 2 * len(pairs)) + _bulk(b"HSET") + _bulk(keys[name]), _packed(pairs))
                queued += 1
        no_trials = _where(part.fields, pc.and_not(wins, part.with_trials))
        if len(no_trials):
            out += (b"*%d\r\n" % (2 + len(no_trials)) + _bulk(b"HDEL") + _bulk(keys["trials"]), _packed(no_trials))
            queued += 1
        events = _where(_join(part.events, *_bulks(said)), wins)
        out += (tail, b"*%d\r\n" % (6 + 5 * len(events)) + _bulk(b"FCALL") + _bulk(b"farm_events") + _bulk(b"1")
                + events_head, _packed(events))
        queued += 2
    out += [_command(*command) for command in part.index]  # keyed by cache key alone: written for every decision
    queued += len(part.index)
    out.append(_command(b"EXEC"))
    return out, queued


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
