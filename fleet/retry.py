"""Riding out a store outage: which failures are transient, and retrying them with back-off for a bounded time
before :class:`~farm_fleet.errors.StoreUnavailable` says the store is gone. Workers and coordinators use it for
every call to the results and leases Redis."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from farm_fleet.errors import StoreUnavailable

__all__ = ["retrying", "transient"]

log = logging.getLogger(__name__)
T = TypeVar("T")


def transient(error: BaseException) -> bool:
    """Whether ``error`` is a connection-level failure worth retrying (redis-py, kombu or the socket layer)."""
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    name = type(error).__name__
    module = type(error).__module__
    if module.startswith("redis") and name in ("ConnectionError", "TimeoutError", "BusyLoadingError"):
        return True
    return module.startswith(("kombu", "amqp")) and name in ("OperationalError", "ConnectionError",
                                                             "RecoverableConnectionError")


def retrying(call: Callable[[], T], seconds: float, what: str = "Redis") -> T:
    """Run ``call``, retrying transient failures with exponential back-off (0.1 s doubling, at most 2 s) for up
    to ``seconds``; then raise StoreUnavailable from the last failure."""
    deadline = time.monotonic() + seconds
    pause = 0.1
    while True:
        try:
            return call()
        except Exception as e:
            if not transient(e):
                raise
            if time.monotonic() + pause > deadline:
                raise StoreUnavailable(f"{what} unreachable for {seconds:g}s: {e}") from e
            log.warning("%s unreachable (%s); retrying in %.1fs", what, e, pause)
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
