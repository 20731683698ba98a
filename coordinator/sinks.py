"""Where decisions go: Redis (the fleet) or a local cache (the embedded farm, read by the runtime). The stores are
the sinks: a run is given the store itself (``RedisDecisions``, or ``LocalStore(directory, owner=FARM)``: the file
``StackTuner(cache_directory=...)`` reads, whose capacity never prunes the farm's records).

Both publish through their store's one publication function (``RedisDecisions.publish_many``: the server-side
``farm_publish``, one call per fingerprint's run of decisions; ``LocalStore.publish_many``: one SQLite transaction), a batch of decisions per call (the run
publishes in batches), which applies the replacement rule
(``farm.stores.base.replaces``) and remembers which problem ids are decided, so a re-run skips them unless forced.
"""

from __future__ import annotations

from typing import Protocol

from farm.stores.base import DecisionRecord, Publication


class Sink(Protocol):
    def publish_many(self, publications: list[Publication]) -> list[tuple[bool, str]]:
        """Publish each under the replacement rule, in one call, each atomic and, with its ``fence`` (lease key,
        value), only while that lease holds (Redis: atomically, consuming it); one (replaced, reason) per
        publication, in order. A refusal's reason starts with "refused"."""
        ...

    def decided(self, digest: str, problem_ids: list[str]) -> set[str]: ...

    def problem_records(self, digest: str, problem_ids: list[str]) -> dict[str, DecisionRecord]:
        """The published records of decided problems (problem id -> record), read back for the summary."""
        ...
