"""Where decisions go: Redis (the fleet) or a local cache (the embedded farm, read by the runtime).

Both publish through their store's one publication function (``RedisDecisions.publish_many``: the server-side
``farm_publish``; ``LocalStore.publish_many``: one SQLite transaction), a batch of decisions per call (the run
publishes in batches), which applies the replacement rule
(``farm.stores.base.replaces``) and remembers which problem ids are decided, so a re-run skips them unless forced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from farm.stores.base import DecisionRecord, Publication, TrialRow
from farm.stores.local import FARM, LocalStore
from farm.stores.redis import RedisDecisions


class Sink(Protocol):
    def publish(self, record: DecisionRecord, fingerprint: str, problem_id: str,
                trials: list[TrialRow], fence: tuple[str, str] | None = None) -> tuple[bool, str]:
        """Publish under the replacement rule; with ``fence`` (lease key, value) only while that lease holds
        (Redis: atomically, consuming it). A refusal's reason starts with "refused"."""
        ...

    def publish_many(self, publications: list[Publication]) -> list[tuple[bool, str]]:
        """:meth:`publish` for each, in one call (each still atomic and fenced by its own ``fence``); one
        (replaced, reason) per publication, in order."""
        ...

    def decided(self, digest: str, problem_ids: list[str]) -> set[str]: ...

    def problem_records(self, digest: str, problem_ids: list[str]) -> dict[str, DecisionRecord]:
        """The published records of decided problems (problem id -> record), read back for the summary."""
        ...


class RedisSink:
    """Publication through ``farm_publish`` (one atomic server-side call per decision)."""

    def __init__(self, decisions: RedisDecisions) -> None:
        self.decisions = decisions

    def publish(self, record: DecisionRecord, fingerprint: str, problem_id: str,
                trials: list[TrialRow], fence: tuple[str, str] | None = None) -> tuple[bool, str]:
        return self.decisions.publish(record, fingerprint, problem_id, trials, fence)

    def publish_many(self, publications: list[Publication]) -> list[tuple[bool, str]]:
        """One pipelined MULTI/EXEC of ``farm_publish`` calls: each call atomic and fenced on its own."""
        return self.decisions.publish_many(publications)

    def decided(self, digest: str, problem_ids: list[str]) -> set[str]:
        return self.decisions.decided(digest, problem_ids)

    def problem_records(self, digest: str, problem_ids: list[str]) -> dict[str, DecisionRecord]:
        return self.decisions.problem_records(digest, problem_ids)


class DirectorySink:
    """Publication into the local cache of ``directory`` (``farm.stores.local``: the file
    ``StackTuner(cache_directory=...)`` reads), as the farm: the record, its trial rows and the problem index in
    one transaction per decision; an application's capacity never prunes these records."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.store = LocalStore(self.directory, owner=FARM)

    def publish(self, record: DecisionRecord, fingerprint: str, problem_id: str,
                trials: list[TrialRow], fence: tuple[str, str] | None = None) -> tuple[bool, str]:
        """``fence`` is not needed here: the embedded farm's leases live in this process (LocalLeases)."""
        return self.store.publish(record, fingerprint, problem_id, trials)

    def publish_many(self, publications: list[Publication]) -> list[tuple[bool, str]]:
        """One SQLite transaction for the batch (all of it or none): fewer commits, each publication whole."""
        return self.store.publish_many(publications)

    def decided(self, digest: str, problem_ids: list[str]) -> set[str]:
        return self.store.decided(digest, problem_ids)

    def problem_records(self, digest: str, problem_ids: list[str]) -> dict[str, DecisionRecord]:
        return self.store.problem_records(digest, problem_ids)
