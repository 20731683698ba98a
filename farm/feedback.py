"""Fleet feedback: applications tell the farm what to tune, never on the hot path.

A :class:`FleetReporter` is the controller's ``feedback`` hook. The engine calls it on two paths only: a
persistent problem that every stored tier missed (``kind="miss"``, with the ratio this process then measured, if
it tuned), and a stored decision its regression window invalidated (``kind="regression"``, with the window's
median selected/reference ratio and the ratio the decision promised). A memory hit never reaches it.

A call appends one small report to a bounded buffer (a full buffer drops the report and counts it) and returns;
a daemon thread sends batches to a capped Redis stream (``XADD ... MAXLEN ~``) with the URL's credentials (a
write-only ``reporter`` user, docs/deployment.md). An unreachable Redis costs the application nothing: the
thread backs off (doubling up to 60 s), keeps what fits in the buffer, and counts the failure. redis-py is
imported in that thread only.

A report (one stream entry, field ``report``, JSON)::

    {"v": 1, "kind": "miss", "operation": "matmul", "device_kind": "cpu", "spec": {"m": 64, ...} | null,
     "signature": "...", "fingerprint": "<digest>", "fingerprint_text": "...", "cache_key": "...",
     "host": "<hostname>", "pid": 123, "time": 1700000000.0, "ratios": [0.71]}

A miss the controller served with a borrowed nearest decision (farm.borrowing) is still reported, marked
``"served": "nearest"`` with ``"nearest": {"workload": ..., "distance": ...}`` (the origin workload and its
log-scale distance): the farm tunes the exact workload like any miss, so later processes get an exact hit.

``spec`` is the workload spec rebuilt from the live inputs (the operation's inverse of ``build``); without one
the report carries the workload signature only (counted in ``unsigned``) and the farm cannot tune it.

Calls: every workload the runtime adapter prepares (:meth:`FleetReporter.describe`) gets a counter cell
(:meth:`FleetReporter.counter`), and every ``try_execute_stack`` call adds one to it (one list-item increment,
hits included; without a lock, so threads racing on one workload may lose a count). Every ``count_interval``
seconds, and at :meth:`flush` (atexit included), the sender thread turns the counts since the last report into
``kind="calls"`` reports, at most ``CALLS_PER_REPORT`` workloads each, the busiest first (``farm tune
--from-fleet`` turns them into weights)::

    {"v": 1, "kind": "calls", "host": "...", "pid": 123, "time": 1700000300.0, "since": 1700000000.0,
     "counts": [{"operation": "matmul", "device_kind": "cpu", "spec": {...}, "signature": "...",
                 "fingerprint": "<digest>", "cache_key": "...", "calls": 120000}, ...]}

At most ``MAX_KEYS`` workloads are counted (the oldest counter goes, its last count still reported); workloads
without a spec are counted but never reported (the farm could not weight them).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from farm.environment import fingerprint_digest
from farm.identity import Problem

log = logging.getLogger(__name__)

REPORT_VERSION = 1
CALLS_VERSION = 1  # the "v" of a kind="calls" report
CALLS_PER_REPORT = 256
MAX_KEYS = 4096
STREAM = "feedback"  # the stream key is "<prefix>:feedback" (FARM_PREFIX, default farm)


def stream_key(prefix: str | None = None) -> str:
    """The reports stream of the farm under ``prefix`` (default: FARM_PREFIX or "farm")."""
    return f"{prefix or os.environ.get('FARM_PREFIX') or 'farm'}:{STREAM}"


@dataclass(frozen=True)
class FeedbackStats:
    """Counters since the reporter was created. ``dropped``: reports lost to a full buffer (or an oversized
    backlog while Redis was unreachable); ``failures``: failed sends; ``unsigned``: reports without a spec."""

    queued: int
    sent: int
    dropped: int
    failures: int
    unsigned: int
    pending: int
    counted: int = 0
    """Calls reported in ``kind="calls"`` reports (queued)."""


class FleetReporter:
    """The ``feedback`` hook of a :class:`~farm.engine.StackTuner`: reports misses and regressions to the fleet.

    ``url``: a Redis URL whose user may XADD the stream (``redis://reporter:PASSWORD@host:6379/1``). ``capacity``
    bounds the buffer; ``maxlen`` caps the stream (approximately); ``batch`` reports go in one round trip. Each
    (kind, cache key) is reported once per process (a repeat only counts). ``count_interval``: seconds between
    two reports of the calls counted per workload.
    """

    def __init__(self, url: str, *, prefix: str | None = None, capacity: int = 1024, batch: int = 64,
                 maxlen: int = 100_000, interval: float = 0.2, timeout: float = 2.0,
                 count_interval: float = 300.0) -> None:
        if not isinstance(url, str) or url.split("://", 1)[0] not in ("redis", "rediss", "unix"):
            from farm.errors import TuneFailure

            raise TuneFailure.invalid(f"report_to must be a redis://, rediss:// or unix:// URL, got {url!r}")
        self.url = url
        self.key = stream_key(prefix)
        self.capacity, self.batch, self.maxlen = max(1, capacity), max(1, batch), max(1, maxlen)
        self.interval, self.timeout = interval, timeout
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._buffer: deque[str] = deque()
        self._described: OrderedDict[str, tuple[str, str, dict[str, Any] | None, Problem]] = OrderedDict()
        self._seen: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._served: OrderedDict[str, tuple[str, float]] = OrderedDict()  # cache key -> (origin workload, distance)
        self._counts = {"queued": 0, "sent": 0, "dropped": 0, "failures": 0, "unsigned": 0, "counted": 0}
        # cache key -> ([calls, calls already reported], what it is); the runtime increments calls[0], lock-free
        self._calls: OrderedDict[str, tuple[list[int], tuple[str, str, dict[str, Any] | None, Problem]]] = OrderedDict()
        self._uncounted: list[tuple[str, int, tuple[str, str, dict[str, Any] | None, Problem]]] = []  # evicted
        self.count_interval = count_interval
        self._counted_since = time.time()
        self._next_count = time.monotonic() + count_interval
        self._thread: threading.Thread | None = None
        self._inflight = 0
        self._closed = False
        self._host = socket.gethostname()
        self._client: Any = None

    # -- called by the runtime (never on a hit) ---------------------------------------------------------------

    def describe(self, problem: Problem, cache_key: str, operation: str, device_kind: str,
                 spec: dict[str, Any] | None) -> None:
        """Remember what a cache key is (called once per workload by the runtime adapter when it prepares it)
        and start counting its calls (:meth:`counter`)."""
        with self._lock:
            described = self._described[cache_key] = (operation, device_kind, spec, problem)
            if len(self._described) > MAX_KEYS:
                self._described.popitem(last=False)
            found = self._calls.get(cache_key)
            cell = found[0] if found is not None else [0, 0]
            self._calls[cache_key] = (cell, described)
            if len(self._calls) > MAX_KEYS:
                key, (old, what) = self._calls.popitem(last=False)
                if old[0] > old[1] and len(self._uncounted) < MAX_KEYS:
                    self._uncounted.append((key, old[0] - old[1], what))
            self._start()

    def counter(self, cache_key: str) -> list[int]:
        """The calls counter of a described cache key: the runtime adds one to its item 0 per call (an unknown
        key gets a counter nobody reports)."""
        with self._lock:
            found = self._calls.get(cache_key)
        return found[0] if found is not None else [0, 0]

    def served_nearest(self, cache_key: str, origin: str, distance: float) -> None:
        """Mark the miss of ``cache_key`` (reported next) as served by a borrowed nearest decision."""
        with self._lock:
            self._served[cache_key] = (origin, float(distance))
            if len(self._served) > 4096:
                self._served.popitem(last=False)

    def __call__(self, kind: str, cache_key: str, problem: Problem | None, ratios: tuple[float, ...]) -> None:
        """Queue one report; never blocks on I/O and never raises."""
        try:
            self._report(kind, cache_key, problem, ratios)
        except Exception as e:  # feedback must never fail the application's call
            log.debug("fleet feedback: report not queued: %s", e)

    def _report(self, kind: str, cache_key: str, problem: Problem | None, ratios: tuple[float, ...]) -> None:
        with self._lock:
            seen = self._seen.get((kind, cache_key), 0)
            self._seen[(kind, cache_key)] = seen + 1
            if len(self._seen) > 4096:
                self._seen.popitem(last=False)
            if seen:
                return
            described = self._described.get(cache_key)
            served = self._served.pop(cache_key, None) if kind == "miss" else None
        if described is not None:
            operation, device_kind, spec, problem = described
        elif problem is not None:
            operation, device_kind, spec = problem.operation, "", None
        else:
            return  # a regression of a decision this reporter never saw prepared: nothing to say what it is
        report = {
            "v": REPORT_VERSION, "kind": kind, "operation": operation, "device_kind": device_kind, "spec": spec,
            "signature": problem.workload, "fingerprint": fingerprint_digest(problem.environment),
            "fingerprint_text": problem.environment, "cache_key": cache_key, "host": self._host, "pid": os.getpid(),
            "time": time.time(), "ratios": [round(float(r), 6) for r in ratios],
        }
        if served is not None:
            report["served"] = "nearest"
            report["nearest"] = {"workload": served[0], "distance": round(served[1], 6)}
        text = json.dumps(report, sort_keys=True)
        with self._lock:
            if spec is None:
                self._counts["unsigned"] += 1
            if len(self._buffer) >= self.capacity or self._closed:
                self._counts["dropped"] += 1
                return
            self._buffer.append(text)
            self._counts["queued"] += 1
            self._start()
            self._wake.notify()

    def _start(self) -> None:
        """Start the sender thread, once. Caller holds the lock."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="farm-feedback", daemon=True)
            self._thread.start()
            atexit.register(self.flush, 1.0)  # a short-lived job's reports: at most 1 s more at exit

    def _queue_counts(self) -> None:
        """Queue the calls counted since the last calls report (kind="calls"). Caller holds the lock."""
        now = time.time()
        self._next_count = time.monotonic() + self.count_interval
        counts = [(key, n, what) for key, n, what in self._uncounted]
        self._uncounted.clear()
        for key, (cell, what) in self._calls.items():
            seen = cell[0]  # read once: the runtime may add meanwhile
            if seen > cell[1]:
                counts.append((key, seen - cell[1], what))
                cell[1] = seen
        counts.sort(key=lambda count: -count[1])
        rows = [{"operation": op, "device_kind": kind, "spec": spec, "signature": problem.workload,
                 "fingerprint": fingerprint_digest(problem.environment), "cache_key": key, "calls": n}
                for key, n, (op, kind, spec, problem) in counts if spec is not None]
        totals = [n for _, n, (_, _, spec, _) in counts if spec is not None]
        for start in range(0, len(rows), CALLS_PER_REPORT):
            chunk = rows[start:start + CALLS_PER_REPORT]
            if len(self._buffer) >= self.capacity or self._closed:
                self._counts["dropped"] += 1
                continue
            self._buffer.append(json.dumps({"v": CALLS_VERSION, "kind": "calls", "host": self._host,
                                            "pid": os.getpid(), "time": now, "since": self._counted_since,
                                            "counts": chunk}, sort_keys=True))
            self._counts["queued"] += 1
            self._counts["counted"] += sum(totals[start:start + CALLS_PER_REPORT])
        self._counted_since = now

    # -- the sender thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.5
        while True:
            with self._lock:
                while not self._buffer and not self._closed:
                    due = self._next_count - time.monotonic()
                    if due <= 0:
                        self._queue_counts()
                        continue
                    self._wake.wait(due)
                if not self._buffer:
                    return
                chunk = [self._buffer.popleft() for _ in range(min(self.batch, len(self._buffer)))]
                self._inflight = len(chunk)
            try:
                self._send(chunk)
            except Exception as e:
                with self._lock:
                    self._counts["failures"] += 1
                    room = self.capacity - len(self._buffer)
                    keep = chunk[:max(0, room)]
                    self._buffer.extendleft(reversed(keep))
                    self._counts["dropped"] += len(chunk) - len(keep)
                    self._inflight = 0
                    closed = self._closed
                log.warning("fleet feedback: cannot reach %s (%s: %s); retrying in %.1fs", self.key,
                            type(e).__name__, e, backoff)
                self._client = None
                if closed:
                    return
                time.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
                continue
            backoff = 0.5
            with self._lock:
                self._counts["sent"] += len(chunk)
                self._inflight = 0
                self._wake.notify_all()
            if self.interval > 0:
                time.sleep(self.interval)  # batch what arrives meanwhile

    def _send(self, chunk: list[str]) -> None:
        if self._client is None:
            from farm.stores.redis import connect

            self._client = connect(self.url, timeout=self.timeout, retries=False)
        pipe = self._client.pipeline(transaction=False)
        for text in chunk:
            pipe.xadd(self.key, {"report": text}, maxlen=self.maxlen, approximate=True)
        pipe.execute()

    # -- introspection and shutdown -------------------------------------------------------------------------

    def stats(self) -> FeedbackStats:
        with self._lock:
            return FeedbackStats(pending=len(self._buffer), **self._counts)

    def flush(self, timeout: float = 5.0) -> bool:
        """Queue the calls counted so far, then wait (at most ``timeout`` seconds) until the buffer is sent; True
        when it was."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._queue_counts()
            if self._buffer:
                self._wake.notify_all()
            while self._buffer or self._inflight:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._wake.wait(min(left, 0.1))
        return True

    def close(self) -> None:
        """Stop the thread after it tries the reports left once (queued reports then are dropped)."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
