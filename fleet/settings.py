"""The farm's configuration in one typed place: URLs, Redis key layout, time limits, retry bounds.

Every value has a default and a ``FARM_*`` environment variable; a malformed variable is a ConfigError naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

from farm.errors import ConfigError
from farm.policy import StackPolicy
from farm.stores.redis import KeyLayout
from farm_fleet.protocol import PROTOCOL_VERSION, GroupKey


@dataclass(frozen=True)
class Settings(KeyLayout):
    """Farm-wide settings. ``prefix`` (from :class:`~farm.stores.redis.KeyLayout`) namespaces every Redis key the
    farm writes; the decision keys are the core's layout, the keys below are the fleet's own."""

    broker_url: str | None = None
    redis_url: str | None = None
    heartbeat_seconds: float = 5.0
    heartbeat_ttl: float = 20.0
    max_attempts: int = 3
    result_ttl: float = 7 * 86400.0
    max_in_flight: int = 64
    max_batch: int = 16
    lease_ttl: float = 30.0
    batch_target_seconds: float = 0.25
    soft_limit_floor: float = 10.0
    visibility_timeout: float = 3600.0
    store_retry_seconds: float = 20.0
    lost_grace_seconds: float = 10.0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``FARM_<FIELD>`` variables (e.g. FARM_BROKER_URL, FARM_MAX_ATTEMPTS), then apply overrides."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = f"FARM_{f.name.upper()}"
            raw = env.get(name)
            if raw is None or raw == "":
                continue
            kind = type(getattr(cls(), f.name)) if getattr(cls(), f.name) is not None else str
            try:
                values[f.name] = kind(raw)
            except ValueError as e:
                raise ConfigError("environment", name, raw, f"must be {kind.__name__}") from e
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)

    # -- the fleet's own keys ------------------------------------------------------------------------------

    def worker_key(self, worker_id: str) -> str:
        """Hash per worker, expiring: host, device, fingerprint, model, version, state."""
        return self.key("worker", worker_id)

    def result_key(self, group: GroupKey) -> str:
        """A group's result, under the protocol version that wrote it: a round resumed after an upgrade reruns the
        groups instead of reading results it cannot parse."""
        return self.key("result", f"v{PROTOCOL_VERSION}", str(group))

    def done_key(self, run: str) -> str:
        """List of notices of a run: the key of each result stored, or an :meth:`unrun_key`. The coordinator
        blocks on it instead of polling; :meth:`notice_of` reads a notice back."""
        return self.key("done", run)

    def unrun_key(self, group: GroupKey) -> str:
        """The notice that a batch ended without running a group (nothing is stored under it)."""
        return self.key("unrun", str(group))

    def notice_of(self, name: str) -> tuple[str, GroupKey] | None:
        """("result" or "unrun", the group's key) of a notice, or None for a foreign one (another prefix, another
        protocol version's result)."""
        if not name.startswith(self.prefix + ":"):
            return None
        head, _, rest = name.removeprefix(self.prefix + ":").partition(":")
        if head == "result":
            version, _, rest = rest.partition(":")
            if version != f"v{PROTOCOL_VERSION}":
                return None
        elif head != "unrun":
            return None
        key = GroupKey.parse(rest)
        return (head, key) if key is not None else None

    def attempts_key(self, group: GroupKey) -> str:
        return self.key("attempts", str(group))

    def started_key(self, group: GroupKey) -> str:
        """When (and by which worker) a group's latest delivery started: the coordinator's deadline starts here."""
        return self.key("started", str(group))

    def running_key(self, group: GroupKey) -> str:
        """The run claim of a group: which delivery runs it now (``farm_fleet.results.Runner``); deleted with its
        result, expiring at the task's hard time limit."""
        return self.key("running", str(group))

    def claims_key(self, worker_id: str) -> str:
        """The name of the run claim a worker took last: what its next pool process releases if the process that
        took it is gone."""
        return self.key("claims", worker_id)

    def fence_key(self, problem_id: str) -> str:
        """Counter per problem: every lease taken on it gets the next token (tokens only grow)."""
        return self.key("fence", problem_id)

    def lease_key(self, problem_id: str) -> str:
        return self.key("lease", problem_id)

    def run_key(self, run: str) -> str:
        return self.key("run", run)

    @property
    def runs_key(self) -> str:
        return self.key("runs")

    # -- queues and time limits ---------------------------------------------------------------------------

    @staticmethod
    def fingerprint_queue(fingerprint_digest: str) -> str:
        return f"farm.fp.{fingerprint_digest}"

    @staticmethod
    def worker_queue(worker_id: str) -> str:
        return f"farm.worker.{worker_id}"

    def time_limits(self, policy: StackPolicy, groups: int = 1) -> tuple[float, float]:
        """(soft, hard) seconds for one task carrying ``groups`` groups: twice the budget per group plus a
        floor, and a margin on top. A group carries at most the policy's budget (what its problem's earlier groups
        left: ``farm.search``) and stops starting new samples when it is spent, and its reference timing is bounded
        like the controller's, so only a hung candidate reaches the soft limit."""
        soft = 2.0 * policy.budget * groups + self.soft_limit_floor
        return soft, soft + max(5.0, 0.25 * soft)

    def lost_after(self, hard: float) -> float:
        """Seconds without a result, after a group started (or after its queue last moved), before the coordinator
        sends it again: the hard time limit plus a grace for the result to travel."""
        return hard + self.lost_grace_seconds

    def batch_limit(self, policy: StackPolicy) -> int:
        """The most groups one task may carry while its hard limit stays below the visibility timeout."""
        n = self.max_batch
        while n > 1 and self.time_limits(policy, n)[1] >= self.visibility_timeout:
            n -= 1
        return n

    def check_limits(self, policy: StackPolicy, source: str) -> None:
        """Refuse a policy whose hard time limit would outlast the broker's visibility timeout (the task would be
        redelivered while it still runs)."""
        hard = self.time_limits(policy)[1]
        if hard >= self.visibility_timeout:
            raise ConfigError(
                source, "policy.budget", policy.budget,
                f"hard time limit {hard:g}s must stay below FARM_VISIBILITY_TIMEOUT {self.visibility_timeout:g}s",
            )
