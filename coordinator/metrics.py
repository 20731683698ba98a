"""Prometheus metrics for the farm: counters the coordinators keep in Redis, and a small exporter that reads them
with the fleet's live state (workers by state, queue depth per fingerprint) at every scrape.

Coordinators count as they go (:class:`RunMetrics`, the run's observer, ``Parts.observer``): problems
published, failed and reused, trial, device and compile seconds and confirmation outcomes, in one Redis hash (``<prefix>:metrics``)
shared by every coordinator, so the counters are monotonic across runs and hosts. ``farm metrics`` serves them on
``/metrics`` (docs/farm.md, Metrics); a Redis that does not answer at start is an error (exit status 2), one
that goes away later makes ``farm_up`` 0, never a failed scrape.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from farm_fleet.settings import Settings

if TYPE_CHECKING:  # types only
    from farm_coordinator.aggregate import Aggregate

log = logging.getLogger(__name__)

COUNTERS = {
    "published": ("farm_decisions_published", "Problems decided and published by a tuning run."),
    "failed": ("farm_decisions_failed", "Problems a tuning run could not decide (every group failed, or no "
                                         "validation)."),
    "reused": ("farm_decisions_reused", "Problems a tuning run skipped because an earlier run decided them."),
}
CONFIRMATIONS = ("confirmed", "failed", "unconfirmed")


def confirmation_result(text: str) -> str:
    """confirmed, failed (the second device did not confirm: the reference stays) or unconfirmed (no second device
    answered), from a record's ``confirmation`` note."""
    if text.startswith("confirmed"):
        return "confirmed"
    return "unconfirmed" if text.startswith("unconfirmed") else "failed"


def metrics_key(settings: Settings) -> str:
    key: str = settings.key("metrics")
    return key


class RunMetrics:
    """A run observer that counts into Redis, then forwards to ``inner`` (the bar or the log lines). Failing to
    count is a warning: metrics never stop a run."""

    def __init__(self, client: Any, settings: Settings, inner: Any = None) -> None:
        self.client, self.settings, self.inner = client, settings, inner
        self.key = metrics_key(settings)

    def __getattr__(self, name: str) -> Any:  # started, group_done, finished...: the inner hook's
        return getattr(self.inner, name)

    def started(self, run: str, problems: int, reused: int, trials: int) -> None:
        if reused:
            self._count({"reused": reused}, {})
        if self.inner is not None:
            self.inner.started(run, problems, reused, trials)

    def problem_done(self, outcome: str, aggregate: Aggregate | None = None) -> None:
        counts = {outcome: 1}
        floats = {}
        if aggregate is not None:
            floats["trial_seconds"] = float(aggregate.trial_seconds or 0.0)
            floats["device_seconds"] = aggregate.device_seconds
            record = aggregate.record
            confirmation = str((record.meta.get("confirmation") if record is not None else None) or "")
            if confirmation:
                counts[f"confirmations_{confirmation_result(confirmation)}"] = 1
        self._count(counts, floats)
        if self.inner is not None:
            self.inner.problem_done(outcome, aggregate)

    def compiled(self, seconds: float) -> None:
        if seconds:
            self._count({}, {"compile_seconds": seconds})
        if self.inner is not None:
            self.inner.compiled(seconds)

    def _count(self, counts: dict[str, int], floats: dict[str, float]) -> None:
        try:
            with self.client.pipeline(transaction=True) as pipe:
                for name, n in counts.items():
                    pipe.hincrby(self.key, name, n)
                for name, x in floats.items():
                    pipe.hincrbyfloat(self.key, name, x)
                pipe.execute()
        except Exception as e:
            log.warning("could not count farm metrics in Redis: %s", e)


class FarmCollector:
    """Reads the counters and the fleet's state from Redis at each scrape (a prometheus_client collector)."""

    def __init__(self, client: Any, settings: Settings, broker: Any = None) -> None:
        self.client, self.settings, self.broker = client, settings, broker

    def describe(self) -> list[Any]:
        return []  # collected on demand: nothing to check at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from farm_coordinator.status import collect as status

        up = GaugeMetricFamily("farm_up", "1 when the exporter could read the farm's Redis, else 0.")
        try:
            counts = self.client.hgetall(metrics_key(self.settings))
            state = status(self.client, self.settings, self.broker)
        except Exception as e:
            log.warning("farm metrics: cannot read Redis: %s", e)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for field, (name, text) in COUNTERS.items():
            yield CounterMetricFamily(name, text, value=float(counts.get(field, 0)))
        yield CounterMetricFamily("farm_trial_seconds", "Seconds of trials behind the problems tuned (all devices).",
                                  value=float(counts.get("trial_seconds", 0)))
        yield CounterMetricFamily("farm_device_seconds", "Seconds the searches ran on their devices (validation, "
                                  "warm-ups, timed runs, confirmations): what tuning cost the fleet.",
                                  value=float(counts.get("device_seconds", 0)))
        yield CounterMetricFamily("farm_compile_seconds", "Seconds the runs' compile stages charged (NVRTC time of "
                                  "fresh compiles, a replay recording's compile time), off the devices.",
                                  value=float(counts.get("compile_seconds", 0)))
        confirmations = CounterMetricFamily("farm_confirmations", "Winners sent to a second device, by outcome "
                                            "(failed: the second device did not confirm; the reference stays).",
                                            labels=["result"])
        for result in CONFIRMATIONS:
            confirmations.add_metric([result], float(counts.get(f"confirmations_{result}", 0)))
        yield confirmations
        workers = GaugeMetricFamily("farm_workers", "Live workers by fingerprint and state.",
                                    labels=["fingerprint", "state"])
        queued = GaugeMetricFamily("farm_queue_depth", "Group tasks waiting in each fingerprint's queue.",
                                   labels=["fingerprint"])
        decisions = GaugeMetricFamily("farm_decisions", "Decisions stored per fingerprint.", labels=["fingerprint"])
        for fp in state["fingerprints"]:
            for worker_state, n in sorted(fp["workers"].items()):
                workers.add_metric([fp["digest"], worker_state], n)
            if fp["queued"] is not None:
                queued.add_metric([fp["digest"]], fp["queued"])
            decisions.add_metric([fp["digest"]], fp["decisions"])
        runs = GaugeMetricFamily("farm_runs", "Recent tuning runs by state.", labels=["state"])
        by_state: dict[str, int] = {}
        for run in state["runs"]:
            by_state[run["state"]] = by_state.get(run["state"], 0) + 1
        for run_state, n in sorted(by_state.items()):
            runs.add_metric([run_state], n)
        reports = GaugeMetricFamily("farm_fleet_reports", "Fleet reports (misses, regressions) waiting for "
                                    "`farm tune --from-fleet`, by operation, fingerprint and kind.",
                                    labels=["operation", "fingerprint", "kind"])
        for row in state.get("feedback", {}).get("by", ()):
            reports.add_metric([row["operation"], row["fingerprint"], row["kind"]], row["reports"])
        bans = GaugeMetricFamily("farm_fleet_bans", "Candidates banned for a problem after a confirmed regression "
                                 "(`farm status` lists them, `farm unban` lifts them), by fingerprint.",
                                 labels=["fingerprint"])
        by_fingerprint: dict[str, int] = {}
        for ban in state.get("bans", ()):
            by_fingerprint[ban["fingerprint"]] = by_fingerprint.get(ban["fingerprint"], 0) + 1
        for digest, n in sorted(by_fingerprint.items()):
            bans.add_metric([digest], n)
        yield from (workers, queued, decisions, runs, reports, bans)


def registry_for(settings: Settings) -> Any:
    """A prometheus_client registry holding only the farm's collector."""
    from prometheus_client import CollectorRegistry

    from farm.stores.redis import connect

    assert settings.redis_url is not None
    client = connect(settings.redis_url, timeout=5.0)
    broker_url = settings.broker_url or ""
    broker = connect(broker_url, timeout=5.0) if broker_url.startswith("redis") else None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FarmCollector(client, settings, broker))
    return registry


def serve(settings: Settings, address: str, port: int, stop: threading.Event | None = None) -> None:
    """Serve ``/metrics`` on ``address:port`` until ``stop`` is set (or the process is interrupted).

    Raises FarmError when the decisions Redis does not answer at start (a misconfigured exporter would otherwise
    serve ``farm_up 0`` for ever; an outage later is ``farm_up 0``) or when ``address:port`` cannot be bound."""
    from prometheus_client import start_http_server

    from farm.errors import FarmError
    from farm.stores.redis import connect

    assert settings.redis_url is not None
    where = _server_address(settings.redis_url)
    try:
        connect(settings.redis_url, timeout=5.0, retries=False).ping()
    except Exception as e:  # redis-py's connection errors share no base class with OSError
        if type(e).__module__.startswith("redis") or isinstance(e, OSError):
            raise FarmError(f"cannot reach Redis at {where} ({type(e).__name__}: {e}): start it, or give the "
                            f"right --redis (FARM_REDIS_URL)") from e
        raise
    try:
        server, thread = start_http_server(port, addr=address, registry=registry_for(settings))
    except OSError as e:
        raise FarmError(f"cannot serve metrics on {address}:{port}: {e.strerror or e}: choose another --port "
                        f"or --address") from e
    log.info("serving farm metrics on http://%s:%d/metrics", address, port)
    try:
        (stop or threading.Event()).wait()
    finally:
        server.shutdown()
        thread.join(5)


def _server_address(url: str) -> str:
    """``host:port/db`` of a Redis URL, without its credentials."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}{parts.path}"
