"""Fleet misses across regimes: a fleet tier that holds decisions for this device class and operation, measured in
another execution regime (CPU-set size, BLAS and OpenMP pool sizes), serves none of them to this process, because
the regime is part of the fingerprint. :class:`RegimeCheck` says so once per process, naming both regimes and
how to match them (docs/deployment.md, "Match the workers' regime to the applications'")."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from farm.environment import FINGERPRINT_PARTS, _options, fingerprint_parts
from farm.identity import CacheKey, OperationKey

log = logging.getLogger("farm.fleet")

SCAN_LIMIT = 500  # records of another regime read at most to find the operation (once per operation and process)

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def split_regime(fingerprint: str) -> tuple[tuple[str, ...], str] | None:
    """(device class, regime text ``cpus=2; blas=2 (...); openmp=2``), or None if no host regime (CUDA)."""
    parts = fingerprint_parts(fingerprint)
    if parts is None:
        return None
    options = [o.strip() for o in parts["runtime options"].split(";") if o.strip()]
    regime = [o for o in options if o.startswith(("cpus=", "blas=", "openmp="))]
    if not regime:
        return None
    rest = tuple(o for o in options if o not in regime)
    return tuple(parts[name] for name in FINGERPRINT_PARTS if name != "runtime options") + rest, "; ".join(regime)


def advice(mine: str, theirs: str) -> str:
    """How to match the regimes: run the application as the workers ran, or the workers as the application runs."""
    counts = [_options(regime).get("cpus", "").partition(" ")[0] for regime in (mine, theirs)]
    if not all(count.isdigit() for count in counts):
        return ("run the application in the workers' regime, or start workers in the application's "
                "(docs/deployment.md, \"Match the workers' regime to the applications'\")")
    own, other = map(int, counts)
    cpus = "0" if other == 1 else f"0-{other - 1}"
    return (f"run the application in the workers' regime (e.g. `taskset -c {cpus} python app.py`: its thread pools "
            f"follow its CPU set) or start workers in the application's (`farm worker --device cpu:N --cores {own}`); "
            f"docs/deployment.md, \"Match the workers' regime to the applications'\"")


def warn_once(tier: str, operation: str, mine: tuple[str, str], theirs: tuple[str, str]) -> bool:
    """Log the warning for this pair of (regime, digest) unless this process did already; True if now."""
    with _warned_lock:
        if (mine[0], theirs[0]) in _warned:
            return False
        _warned.add((mine[0], theirs[0]))
    op = OperationKey.decode(operation)  # an adapter's operation as people know it (``softmax``)
    log.warning("fleet miss across regimes: %s has decisions for %s on this device class measured in regime "
                "`%s` (fingerprint %s), but this process runs in `%s` (fingerprint %s) and gets none of them: %s",
                tier, operation if op is None else op.name, theirs[0], theirs[1][:8], mine[0], mine[1][:8],
                advice(mine[0], theirs[0]))
    return True


def forget_warnings() -> None:
    """Warn again (tests)."""
    with _warned_lock:
        _warned.clear()


@dataclass(eq=False)
class RegimeCheck:
    """Looks, once per (fingerprint, operation) in a process, whether a fleet tier's other regimes of the same
    device class hold decisions for an operation that just missed; warns once per pair of regimes.
    ``has_key``: whether a digest holds a cache key; ``records``: its record JSON. A tier's error ends it."""

    tier: str
    fingerprints: Callable[[], dict[str, str]]
    has_key: Callable[[str, str], bool]
    records: Callable[[str], Iterable[str]]
    _checked: set[tuple[str, str]] = field(default_factory=set, init=False)

    def missed(self, cache_key: str, digest: str) -> bool:
        """Call on a miss of ``cache_key`` (its fingerprint digest ``digest``); True if a warning was logged."""
        try:
            key = CacheKey.decode(cache_key)
        except ValueError:
            return False
        mine = split_regime(key.environment)
        with _warned_lock:
            if mine is None or (digest, key.operation) in self._checked:
                return False
            self._checked.add((digest, key.operation))
        try:
            for other, text in sorted(self.fingerprints().items()):
                theirs = split_regime(text)
                if (other != digest and theirs is not None and theirs[0] == mine[0] and theirs[1] != mine[1]
                        and self._decides(key, other, text)):
                    return warn_once(self.tier, key.operation, (mine[1], digest), (theirs[1], other))
        except Exception as e:  # an outage or a bad record: the lookup was a miss anyway
            log.debug("regime check of %s skipped: %s", self.tier, e)
        return False

    def _decides(self, key: CacheKey, digest: str, fingerprint: str) -> bool:
        """Whether ``digest`` holds this problem, or the operation in its first ``SCAN_LIMIT`` records."""
        if self.has_key(digest, key.replace(environment=fingerprint).encode()):
            return True
        for raw in itertools.islice(self.records(digest), SCAN_LIMIT):
            other = str(json.loads(raw).get("cache_key", ""))
            with contextlib.suppress(ValueError):
                if CacheKey.decode(other).operation == key.operation:
                    return True
        return False
