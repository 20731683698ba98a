"""Fleet feedback: applications tell the farm what to tune, never on the hot path.

A :class:`FleetReporter` is the controller's ``feedback`` hook (``kind`` "miss" or "regression", never on a hit)
and counts prepared workloads' calls (``kind="calls"``); a daemon thread sends its bounded buffer in batches to a
capped Redis stream (redis-py is imported in that thread only). Formats and rules: docs/farm.md, "Fleet feedback".
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

# What a cache key is: (operation, device kind, spec or None, problem).
_What = tuple[str, str, dict[str, Any] | None, Problem]


def stream_key(prefix: str | None = None) -> str:
    """The reports stream of the farm under ``prefix`` (default: FARM_PREFIX or "farm")."""
    return f"{prefix or os.environ.get('FARM_PREFIX') or 'farm'}:{STREAM}"


@dataclass(frozen=True)
class FeedbackStats:
    """Counters since the reporter was created. ``dropped``: reports lost to a full buffer (or a backlog
    while Redis was unreachable); ``unsigned``: reports without a spec; ``counted``: calls reported."""

    queued: int
    sent: int
    dropped: int
    failures: int
    unsigned: int
    pending: int
    counted: int = 0


class FleetReporter:
    """The ``feedback`` hook of a :class:`~farm.engine.StackTuner`: reports misses and regressions to the fleet.

    ``url``: a Redis URL whose user may XADD the stream (``redis://reporter:PASSWORD@host:6379/1``). ``capacity``
    bounds the buffer; ``maxlen`` caps the stream (approximately); ``batch`` reports go in one round trip. Each
    (kind, cache key) is reported once per process. ``count_interval``: seconds between two calls reports.
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
        self.interval, self.timeout, self.count_interval = interval, timeout, count_interval
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._buffer: deque[str] = deque()
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()  # (kind, cache key) reported
        self._served: OrderedDict[str, tuple[str, float]] = OrderedDict()  # cache key -> (origin workload, distance)
        self._counts = {"queued": 0, "sent": 0, "dropped": 0, "failures": 0, "unsigned": 0, "counted": 0}
        # cache key -> ([calls, calls already reported], what it is); the runtime increments calls[0], lock-free
        self._calls: OrderedDict[str, tuple[list[int], _What]] = OrderedDict()
        self._uncounted: list[tuple[str, int, _What]] = []  # (key, calls, what) of evicted counters
        self._counted_since = time.time()
        self._next_count = time.monotonic() + count_interval
        self._thread: threading.Thread | None = None
        self._inflight = 0
        self._closed = False
        self._host = socket.gethostname()
        self._client: Any = None

    def describe(self, problem: Problem, cache_key: str, operation: str, device_kind: str,
                 spec: dict[str, Any] | None) -> None:
        """Remember what a cache key is (called once per workload by the runtime adapter when it prepares it)
        and start counting its calls (:meth:`counter`)."""
        with self._lock:
            cell = self._calls[cache_key][0] if cache_key in self._calls else [0, 0]
            self._calls[cache_key] = (cell, (operation, device_kind, spec, problem))
            if len(self._calls) > MAX_KEYS:
                key, (old, old_what) = self._calls.popitem(last=False)
                if old[0] > old[1] and len(self._uncounted) < MAX_KEYS:
                    self._uncounted.append((key, old[0] - old[1], old_what))
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
            if len(self._served) > MAX_KEYS:
                self._served.popitem(last=False)

    def __call__(self, kind: str, cache_key: str, problem: Problem | None, ratios: tuple[float, ...]) -> None:
        """Queue one report; never blocks on I/O and never raises."""
        try:
            self._report(kind, cache_key, problem, ratios)
        except Exception as e:  # feedback must never fail the application's call
            log.debug("fleet feedback: report not queued: %s", e)

    def _report(self, kind: str, cache_key: str, problem: Problem | None, ratios: tuple[float, ...]) -> None:
        with self._lock:
            if (kind, cache_key) in self._seen:
                return
            self._seen[(kind, cache_key)] = None
            if len(self._seen) > MAX_KEYS:
                self._seen.popitem(last=False)
            described = self._calls.get(cache_key)
            served = self._served.pop(cache_key, None) if kind == "miss" else None
        if described is not None:
            operation, device_kind, spec, problem = described[1]
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
            report.update(served="nearest", nearest={"workload": served[0], "distance": round(served[1], 6)})
        text = json.dumps(report, sort_keys=True)
        with self._lock:
            if spec is None:
                self._counts["unsigned"] += 1
            if self._enqueue(text):
                self._start()
                self._wake.notify()

    def _enqueue(self, text: str) -> bool:
        """Buffer a report, or drop it when the buffer is full or closed (caller holds the lock)."""
        if len(self._buffer) >= self.capacity or self._closed:
            self._counts["dropped"] += 1
            return False
        self._buffer.append(text)
        self._counts["queued"] += 1
        return True

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
        counts, self._uncounted = self._uncounted, []
        for key, (cell, what) in self._calls.items():
            seen = cell[0]  # read once: the runtime may add meanwhile
            if seen > cell[1]:
                counts.append((key, seen - cell[1], what))
                cell[1] = seen
        counts = sorted((count for count in counts if count[2][2] is not None), key=lambda count: -count[1])
        for start in range(0, len(counts), CALLS_PER_REPORT):
            chunk = counts[start:start + CALLS_PER_REPORT]
            rows = [{"operation": op, "device_kind": kind, "spec": spec, "signature": problem.workload,
                     "fingerprint": fingerprint_digest(problem.environment), "cache_key": key, "calls": n}
                    for key, n, (op, kind, spec, problem) in chunk]
            report = {"v": CALLS_VERSION, "kind": "calls", "host": self._host, "pid": os.getpid(),
                      "time": now, "since": self._counted_since, "counts": rows}
            if self._enqueue(json.dumps(report, sort_keys=True)):
                self._counts["counted"] += sum(n for _, n, _ in chunk)
        self._counted_since = now

    def _run(self) -> None:
        backoff = 0.5
        while True:
            with self._lock:
                while not self._buffer and not self._closed:
                    if (due := self._next_count - time.monotonic()) <= 0:
                        self._queue_counts()
                    else:
                        self._wake.wait(due)
                if not self._buffer:
                    return
                chunk = [self._buffer.popleft() for _ in range(min(self.batch, len(self._buffer)))]
                self._inflight = len(chunk)
            try:
                self._send(chunk)
            except Exception as e:
                log.warning("fleet feedback: cannot reach %s (%s: %s); retrying in %.1fs", self.key,
                            type(e).__name__, e, backoff)
                self._client = None
                with self._lock:
                    self._counts["failures"] += 1
                    keep = chunk[:max(0, self.capacity - len(self._buffer))]
                    self._buffer.extendleft(reversed(keep))
                    self._counts["dropped"] += len(chunk) - len(keep)
                    self._inflight = 0
                    if self._closed:
                        return
                time.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
                continue
            backoff = 0.5
            with self._lock:
                self._counts["sent"] += len(chunk)
                self._inflight = 0
                self._wake.notify_all()
            time.sleep(max(0.0, self.interval))  # batch what arrives meanwhile

    def _send(self, chunk: list[str]) -> None:
        if self._client is None:
            from farm.stores.redis import connect

            self._client = connect(self.url, timeout=self.timeout, retries=False)
        pipe = self._client.pipeline(transaction=False)
        for text in chunk:
            pipe.xadd(self.key, {"report": text}, maxlen=self.maxlen, approximate=True)
        pipe.execute()

    def stats(self) -> FeedbackStats:
        with self._lock:
            return FeedbackStats(pending=len(self._buffer), **self._counts)

    def flush(self, timeout: float = 5.0) -> bool:
        """Queue the calls counted so far, then wait up to ``timeout`` s for the buffer to go; True if it went."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._queue_counts()
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
