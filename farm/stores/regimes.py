"""Fleet misses across regimes: a fleet tier that holds decisions for this device class and operation, measured in
another execution regime (CPU-set size, BLAS and OpenMP pool sizes), serves none of them to this process, because
the regime is part of the fingerprint. Left silent, an application that runs ``cpus=2; blas=2`` next to workers
that tuned at ``cpus=1; blas=1; openmp=1`` just misses and tunes again; :class:`RegimeCheck` says so once per
process, naming both regimes and how to match them (docs/deployment.md, "Match the workers' regime to the
applications'").
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from farm.environment import FINGERPRINT_PARTS, fingerprint_parts
from farm.identity import CacheKey, OperationKey

log = logging.getLogger("farm.fleet")

REGIME_OPTIONS = ("cpus=", "blas=", "openmp=")
SCAN_LIMIT = 500  # records of another regime read at most to find the operation (once per operation and process)

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def split_regime(fingerprint: str) -> tuple[tuple[str, ...], str] | None:
    """(the device class: every fingerprint part but the regime, the regime text ``cpus=2; blas=2 (...);
    openmp=2``), or None for a fingerprint without a host regime (CUDA, or text that does not decode)."""
    parts = fingerprint_parts(fingerprint)
    if parts is None:
        return None
    options = [o.strip() for o in parts["runtime options"].split(";") if o.strip()]
    regime = [o for o in options if o.startswith(REGIME_OPTIONS)]
    if not regime:
        return None
    rest = tuple(o for o in options if o not in regime)
    return tuple(parts[name] for name in FINGERPRINT_PARTS if name != "runtime options") + rest, "; ".join(regime)


def regime_cpus(regime: str) -> int | None:
    """The CPU count of a regime text (``cpus=2; ...`` -> 2)."""
    for option in regime.split(";"):
        name, _, value = option.strip().partition("=")
        if name == "cpus" and value.split()[0].isdigit():
            return int(value.split()[0])
    return None


def operation_name(operation: str) -> str:
    """An adapter's operation text as people know it (``softmax``), other operation text as it is."""
    key = OperationKey.decode(operation)
    return key.name if key is not None else operation


def advice(mine: str, theirs: str) -> str:
    """How to match the regimes: run the application as the workers ran, or the workers as the application runs."""
    own, other = regime_cpus(mine), regime_cpus(theirs)
    if own is None or other is None:
        return ("run the application in the workers' regime, or start workers in the application's "
                "(docs/deployment.md, \"Match the workers' regime to the applications'\")")
    cpus = "0" if other == 1 else f"0-{other - 1}"
    return (f"run the application in the workers' regime (e.g. `taskset -c {cpus} python app.py`: its thread pools "
            f"follow its CPU set) or start workers in the application's (`farm worker --device cpu:N --cores {own}`); "
            f"docs/deployment.md, \"Match the workers' regime to the applications'\"")


def warn_once(tier: str, operation: str, mine: tuple[str, str], theirs: tuple[str, str]) -> bool:
    """Log the warning for this pair of regimes ((regime, digest) each) unless this process already did; True if
    it logged now."""
    with _warned_lock:
        if (mine[0], theirs[0]) in _warned:
            return False
        _warned.add((mine[0], theirs[0]))
    log.warning("fleet miss across regimes: %s has decisions for %s on this device class measured in regime "
                "`%s` (fingerprint %s), but this process runs in `%s` (fingerprint %s) and gets none of them: %s",
                tier, operation_name(operation), theirs[0], theirs[1][:8], mine[0], mine[1][:8],
                advice(mine[0], theirs[0]))
    return True


def forget_warnings() -> None:
    """Warn again (tests)."""
    with _warned_lock:
        _warned.clear()


class RegimeCheck:
    """Looks, once per (fingerprint, operation) in a process, whether a fleet tier's other regimes of the same
    device class hold decisions for an operation that just missed; warns once per pair of regimes.

    ``fingerprints`` returns the tier's digest -> fingerprint text; ``has_key`` whether a digest holds a cache key;
    ``records`` a digest's record JSON texts (read up to ``SCAN_LIMIT``). Errors of the tier are the caller's
    miss already: the check gives up silently."""

    def __init__(self, tier: str, fingerprints: Callable[[], dict[str, str]], has_key: Callable[[str, str], bool],
                 records: Callable[[str], Iterable[str]]) -> None:
        self.tier = tier
        self._fingerprints = fingerprints
        self._has_key = has_key
        self._records = records
        self._checked: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def missed(self, cache_key: str, digest: str) -> bool:
        """Call on a miss of ``cache_key`` (its fingerprint digest ``digest``); True if a warning was logged."""
        try:
            key = CacheKey.decode(cache_key)
        except ValueError:
            return False
        with self._lock:
            if (digest, key.operation) in self._checked:
                return False
            self._checked.add((digest, key.operation))
        mine = split_regime(key.environment)
        if mine is None:
            return False
        try:
            for other, text in sorted(self._fingerprints().items()):
                theirs = split_regime(text)
                if other == digest or theirs is None or theirs[0] != mine[0] or theirs[1] == mine[1]:
                    continue
                if self._decides(key, other, text):
                    return warn_once(self.tier, key.operation, (mine[1], digest), (theirs[1], other))
        except Exception as e:  # an outage or a bad record: the lookup was a miss anyway
            log.debug("regime check of %s skipped: %s", self.tier, e)
        return False

    def _decides(self, key: CacheKey, digest: str, fingerprint: str) -> bool:
        """Whether ``digest`` holds this exact problem, or any decision of the same operation."""
        if self._has_key(digest, key.replace(environment=fingerprint).encode()):
            return True
        for i, raw in enumerate(self._records(digest)):
            if i >= SCAN_LIMIT:
                return False
            other: Any = json.loads(raw).get("cache_key", "")
            try:
                if CacheKey.decode(str(other)).operation == key.operation:
                    return True
            except ValueError:
                continue
        return False
