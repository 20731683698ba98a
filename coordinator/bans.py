"""Fleet bans: a candidate the fleet must not choose again for one problem of one fingerprint.

The in-process controller bans a candidate for a key when its live run fails or its regression window fires
(SEMANTICS.md, "Execution"). The fleet's counterpart: when an application reports that a fleet decision regressed
(``farm tune --from-fleet``) and the farm's forced re-measure on a confirmed device finds the old winner failing or
slower than the reference by more than ``regression_ratio`` there too, the candidate is banned for that problem.
Every later run of the problem on that fingerprint plans it as SKIPPED ("banned for this key after a failure or
regression", ``farm.search.admit``), so the fleet never publishes it again for that key; other workloads and
other fingerprints (a new driver or build is a new fingerprint) may still choose it. ``farm unban`` lifts one.

Redis layout: the hash ``<prefix>:bans:<fingerprint digest>``, field problem id -> JSON object
``{candidate: {"reason": str, "run": str, "time": float, "ratio": float | null}}``. Updates are one WATCH/MULTI
transaction each; a run reads a fingerprint's bans once, with one HGETALL (bans are few).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from farm.errors import CorruptRecord
from farm.policy import StackPolicy
from farm.stores.redis import KeyLayout


@dataclass(frozen=True)
class Ban:
    """Why one candidate is banned for one problem."""

    candidate: str
    reason: str
    run: str
    time: float
    ratio: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "run": self.run, "time": self.time, "ratio": self.ratio}


def regressed_there_too(candidate: dict[str, Any], policy: StackPolicy) -> str | None:
    """Whether a candidate's re-measure (an entry of a record's ``meta["candidates"]``) confirms a reported
    regression: it failed (wrong output, error, rejected) or its ratio to the reference exceeds
    ``policy.regression_ratio``. The reason, or None when the farm's measure does not confirm it (not tried, or
    within the threshold: the regression was the host's own)."""
    ratio = candidate.get("ratio")
    if candidate.get("verified") is False:
        return f"failed its re-measure on the farm ({candidate.get('note') or 'not verified'})"
    if isinstance(ratio, (int, float)) and ratio > policy.regression_ratio:
        return (f"regressed on the farm too: {ratio:.2f}x the reference's time "
                f"(regression_ratio {policy.regression_ratio:g})")
    return None


class RedisBans:
    """The fleet's bans in Redis (see the module docstring)."""

    def __init__(self, client: Any, layout: KeyLayout) -> None:
        self.client = client
        self.layout = layout

    def key(self, digest: str) -> str:
        return self.layout.key("bans", digest)

    def banned(self, digest: str) -> dict[str, set[str]]:
        """Problem id -> the candidates banned for it, on one fingerprint (one HGETALL: bans are few)."""
        key = self.key(digest)
        return {pid: set(self._parse(key, pid, raw)) for pid, raw in self.client.hgetall(key).items()}

    def all(self, digests: Iterable[str]) -> list[tuple[str, str, Ban]]:
        """Every ban of ``digests``: (digest, problem id, ban), for ``farm status``."""
        rows: list[tuple[str, str, Ban]] = []
        for digest in digests:
            key = self.key(digest)
            for pid, raw in sorted(self.client.hgetall(key).items()):
                for name, why in sorted(self._parse(key, pid, raw).items()):
                    rows.append((digest, pid, Ban(name, str(why.get("reason", "")), str(why.get("run", "")),
                                                  float(why.get("time") or 0.0), why.get("ratio"))))
        return rows

    def ban(self, digest: str, problem_id: str, ban: Ban) -> None:
        """Add (or update) one ban, in one transaction."""
        key = self.key(digest)

        def update(pipe: Any) -> None:
            raw = pipe.hget(key, problem_id)
            current = self._parse(key, problem_id, raw) if raw is not None else {}
            current[ban.candidate] = ban.to_dict()
            pipe.multi()
            pipe.hset(key, problem_id, json.dumps(current, sort_keys=True))

        self.client.transaction(update, key)

    def lift(self, digest: str, problem_id: str, candidate: str | None = None) -> int:
        """Lift one candidate's ban (all of the problem's without ``candidate``); how many were lifted."""
        key = self.key(digest)
        lifted = 0

        def update(pipe: Any) -> None:
            nonlocal lifted
            raw = pipe.hget(key, problem_id)
            current = self._parse(key, problem_id, raw) if raw is not None else {}
            gone = [n for n in current if candidate is None or n == candidate]
            lifted = len(gone)
            for name in gone:
                del current[name]
            pipe.multi()
            if current:
                pipe.hset(key, problem_id, json.dumps(current, sort_keys=True))
            else:
                pipe.hdel(key, problem_id)

        self.client.transaction(update, key)
        return lifted

    @staticmethod
    def _parse(key: str, pid: str, raw: str | bytes) -> dict[str, dict[str, Any]]:
        try:
            value = json.loads(raw)
        except ValueError as e:
            raise CorruptRecord(f"Redis {key} field {pid}: bans are not JSON ({e})") from e
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise CorruptRecord(f"Redis {key} field {pid}: bans must be an object of objects, got {raw!r:.200}")
        return value


def new_ban(candidate: str, reason: str, run: str, ratio: float | None) -> Ban:
    return Ban(candidate, reason, run, time.time(), ratio)
