"""Where decisions go: Redis (the fleet) or a local cache directory (the embedded farm, read by the runtime).

Both apply the same replacement rule (``farm.stores.base.replaces``; in Redis by the server-side function)
and remember which problem ids are decided, so a re-run skips them unless forced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from farm.atomicfile import write_atomic
from farm.environment import fingerprint_digest
from farm.stores.base import CorruptRecord, DecisionRecord, replaces
from farm.stores.disk import DiskStore
from farm.stores.redis import RedisDecisions, field_for


class Sink(Protocol):
    def publish(self, record: DecisionRecord, fingerprint: str, problem_id: str,
                trials: list[dict[str, Any]], fence: tuple[str, str] | None = None) -> tuple[bool, str]:
        """Publish under the replacement rule; with ``fence`` (lease key, value) only while that lease holds
        (Redis: atomically, consuming it). A refusal's reason starts with "refused"."""
        ...

    def decided(self, digest: str, problem_ids: list[str]) -> set[str]: ...


class RedisSink:
    """Publication through ``farm_publish`` (one atomic server-side call per decision)."""

    def __init__(self, decisions: RedisDecisions) -> None:
        self.decisions = decisions

    def publish(self, record: DecisionRecord, fingerprint: str, problem_id: str,
                trials: list[dict[str, Any]], fence: tuple[str, str] | None = None) -> tuple[bool, str]:
        return self.decisions.publish(record, fingerprint, problem_id, trials, fence)

    def decided(self, digest: str, problem_ids: list[str]) -> set[str]:
        return self.decisions.decided(digest, problem_ids)


INDEX = "farm-index.json"
TRIALS = "trials"


class DirectorySink:
    """Decision records in the disk tier's format (``StackTuner(cache_directory=...)`` reads them), an index
    of decided problems and fingerprints in ``farm-index.json``, and the trial rows behind each decision in
    ``trials/<sha256 of key>.json``. One writer at a time (the embedded farm)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.store = DiskStore(self.directory, capacity=65536)
        self.index_path = self.directory / INDEX
        self._index = self._load_index()

    def _load_index(self) -> dict[str, Any]:
        try:
            data = json.loads(self.index_path.read_text())
            if isinstance(data, dict) and data.get("schema") == 1:
                return data
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        return {"schema": 1, "fingerprints": {}, "problems": {}}

    def publish(self, record: DecisionRecord, fingerprint: str, problem_id: str,
                trials: list[dict[str, Any]], fence: tuple[str, str] | None = None) -> tuple[bool, str]:
        try:
            old = self.store.get(record.cache_key)
        except CorruptRecord:
            old = None
        if not replaces(record, old):
            return False, "kept: the stored record wins under the replacement rule"
        self.store.put(record)
        write_atomic(self.directory / TRIALS / f"{field_for(record.cache_key)}.json", json.dumps(trials).encode())
        digest = fingerprint_digest(fingerprint)
        self._index["fingerprints"][digest] = fingerprint
        self._index["problems"].setdefault(digest, {})[problem_id] = field_for(record.cache_key)
        write_atomic(self.index_path, json.dumps(self._index, sort_keys=True, indent=1).encode())
        return True, "new" if old is None else "replaced"

    def decided(self, digest: str, problem_ids: list[str]) -> set[str]:
        known = self._index["problems"].get(digest, {})
        return {pid for pid in problem_ids if pid in known}
