"""Environment identity: the fingerprint of a device CLASS (model, driver, compiler, build, options) in one
execution regime.

It names no device index but does name the regime (tuning regime = serving regime); it is persistent only when
both a driver and a build identity are known (docs/contract.md, "Environment identity")."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
import time
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from farm.encoding import split_fields
from farm.identity import DEFAULT_CONTEXT, fields
from farm.runtimes.base import DescribedDevice
from farm.runtimes.host import regime_key

DRIVER_TAG = "FARM_AUTOTUNE_DRIVER_TAG"
BUILD_TAG = "FARM_AUTOTUNE_BUILD_TAG"
CONTEXT_TAG = "FARM_AUTOTUNE_CONTEXT_TAG"
BUILD_PACKAGES = ("farm", "farm_kernels")
UNAVAILABLE = "unavailable"
# The named parts of a fingerprint, in the order probe_environment encodes them.
FINGERPRINT_PARTS = ("backend", "device kind", "device", "driver", "compiler", "build", "build tag", "runtime options")


@dataclass(frozen=True)
class RuntimeEnvironment:
    """``fingerprint``: canonical device-class/driver/build/options text. ``persistent``: disk and fleet reuse
    permitted. ``execution_context``: the deployment's regime (FARM_AUTOTUNE_CONTEXT_TAG)."""

    fingerprint: str
    persistent: bool
    execution_context: str

    @property
    def digest(self) -> str:
        return fingerprint_digest(self.fingerprint)


@lru_cache(maxsize=4096)  # asked on every fleet lookup and publication: a process meets a few fingerprints
def fingerprint_digest(fingerprint: str) -> str:
    """A short stable name for a fingerprint (queue names, archive folders): 16 hex digits of its sha256."""
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:16]


@cache
def farm_version() -> str:
    try:
        from importlib.metadata import version

        return version("tuning-farm")
    except Exception:
        return "0+unknown"


@cache
def build_identity() -> str:
    """Package version + sha256 of the installed ``farm/`` and ``kernels/`` sources, or "unavailable"."""
    digest = hashlib.sha256()
    found = False
    for package in BUILD_PACKAGES:
        spec = importlib.util.find_spec(package)
        for root in (spec and spec.submodule_search_locations) or ():
            base = Path(root)
            try:
                files = sorted(p for p in base.rglob("*") if p.suffix in (".py", ".cu", ".lua") and p.is_file())
                for path in files:
                    digest.update(f"{package}/{path.relative_to(base).as_posix()}\0".encode())
                    digest.update(path.read_bytes() + b"\0")
                    found = True
            except OSError:
                return UNAVAILABLE
    return f"{farm_version()}+{digest.hexdigest()[:20]}" if found else UNAVAILABLE


_lock = threading.Lock()  # of the session identity and the memo
_session: str | None = None
_memo: dict[tuple[type, str, str, tuple[int, ...]], RuntimeEnvironment] = {}


def session_identity() -> str:
    """A driver identity unique to this process, used when the real one is unknown (never persisted)."""
    global _session
    with _lock:
        if _session is None:
            _session = f"session-only:{os.getpid()}:{time.time_ns()}"
        return _session


def runtime_environment(client: DescribedDevice) -> RuntimeEnvironment:
    """Probe and memoize (bounded) the environment of ``client``; set deployment tags before first use. A new
    CPU set or pool size probes again; after loading a numeric library, :func:`clear_environment_memo`."""
    key = (type(client), client.device_id, client.properties_fingerprint(), regime_key())
    with _lock:
        found = _memo.get(key)
    if found is None:
        found = probe_environment(client)
        with _lock:
            if len(_memo) < 256:
                _memo[key] = found
    return found


def probe_environment(client: DescribedDevice) -> RuntimeEnvironment:
    """Build the environment from the client and the FARM_AUTOTUNE_* tags (not memoized)."""
    driver_tag = os.environ.get(DRIVER_TAG) or None
    probed = client.driver_fingerprint()
    driver: str | None = probed or driver_tag
    if probed is not None and driver_tag is not None:
        driver = fields([probed, driver_tag])
    build = build_identity()
    persistent = driver is not None and build != UNAVAILABLE
    if driver is None:
        driver = session_identity()
    elif not persistent:
        driver = fields([driver, session_identity()])
    fingerprint = fields([client.backend, client.device_kind, client.properties_fingerprint(), driver,
                          client.compiler(), build, os.environ.get(BUILD_TAG, ""), client.runtime_options()])
    return RuntimeEnvironment(fingerprint, persistent, os.environ.get(CONTEXT_TAG) or DEFAULT_CONTEXT)


def fingerprint_parts(fingerprint: str) -> dict[str, str] | None:
    """A fingerprint's parts by name (``FINGERPRINT_PARTS``), or None for text that is not a fingerprint."""
    try:
        parts = split_fields(fingerprint)
    except ValueError:
        return None
    return dict(zip(FINGERPRINT_PARTS, parts, strict=True)) if len(parts) == len(FINGERPRINT_PARTS) else None


def clear_environment_memo() -> None:
    """Forget probed environments (tests change deployment tags between cases)."""
    with _lock:
        _memo.clear()


def fingerprint_differences(mine: str, theirs: str) -> list[tuple[str, str, str]]:
    """(part or runtime option name, value in ``mine``, value in ``theirs`` ("" if absent)) where they differ:
    ``("cpus", "1", "2")``; one ``("fingerprint", mine, theirs)`` row when either is not a fingerprint."""
    if mine == theirs:
        return []
    a, b = fingerprint_parts(mine), fingerprint_parts(theirs)
    if a is None or b is None:
        return [("fingerprint", mine, theirs)]
    found = [(name, a[name], b[name]) for name in FINGERPRINT_PARTS if name != "runtime options" and a[name] != b[name]]
    oa, ob = _options(a["runtime options"]), _options(b["runtime options"])
    return found + [(name, oa.get(name, ""), ob.get(name, "")) for name in dict.fromkeys([*oa, *ob])
                    if oa.get(name) != ob.get(name)]


def _options(text: str) -> dict[str, str]:
    """A runtime-options part by option name: ``cpus=2; blas=2 (openblas Haswell)`` -> {cpus: 2, blas: 2 (...)}."""
    found = {}
    for option in filter(None, (o.strip() for o in text.split(";"))):
        name, sep, value = option.partition("=")
        found[name.strip() if sep else option] = value.strip() if sep else option
    return found
