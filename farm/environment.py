"""Environment identity: the fingerprint of a device CLASS (model, driver, compiler, build, options) in one
execution regime.

The fingerprint never names a device index, so a decision tuned on GPU 3 of one host serves GPU 0 of another
host of the same model. It does name the regime the decision is true for (tuning regime = serving regime): for
the host, the size of the process's CPU set and of its BLAS and OpenMP pools; for CUDA, the model, compute
capability, MIG profile, compute mode, driver, CUDA runtime, NVRTC and CuPy versions. A process computes it from
itself, so a decision measured in another regime has another fingerprint and is never served. It is persistent
(disk and fleet reuse) only when both a driver identity and a build identity are known; otherwise it is unique to
this process and nothing is written.
"""

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


@lru_cache(maxsize=4096)  # a store names a fingerprint's keys on every lookup
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
        if spec is None or not spec.submodule_search_locations:
            continue
        for root in spec.submodule_search_locations:
            base = Path(root)
            try:
                files = sorted(p for p in base.rglob("*") if p.suffix in (".py", ".cu", ".lua") and p.is_file())
                for path in files:
                    digest.update(f"{package}/{path.relative_to(base).as_posix()}\0".encode())
                    digest.update(path.read_bytes())
                    digest.update(b"\0")
                    found = True
            except OSError:
                return UNAVAILABLE
    if not found:
        return UNAVAILABLE
    return f"{farm_version()}+{digest.hexdigest()[:20]}"


_session_lock = threading.Lock()
_session: str | None = None


def session_identity() -> str:
    """A driver identity unique to this process, used when the real one is unknown (never persisted)."""
    global _session
    with _session_lock:
        if _session is None:
            _session = f"session-only:{os.getpid()}:{time.time_ns()}"
        return _session


_memo: dict[tuple[type, str, str, tuple[int, ...]], RuntimeEnvironment] = {}
_memo_lock = threading.Lock()


def runtime_environment(client: DescribedDevice) -> RuntimeEnvironment:
    """Probe and memoize (bounded) the environment of ``client``. Deployment tags must be set before first use.

    The memo notices a change of the process's CPU set or of a loaded pool's size (``os.sched_setaffinity``,
    ``threadpoolctl.threadpool_limits``) and probes again; after loading a new numeric library mid-process, call
    :func:`clear_environment_memo`."""
    key = (type(client), client.device_id, client.properties_fingerprint(), regime_key())
    with _memo_lock:
        found = _memo.get(key)
    if found is not None:
        return found
    env = probe_environment(client)
    with _memo_lock:
        if len(_memo) < 256:
            _memo[key] = env
    return env


def probe_environment(client: DescribedDevice) -> RuntimeEnvironment:
    """Build the environment from the client and the FARM_AUTOTUNE_* tags (not memoized)."""
    driver_tag = os.environ.get(DRIVER_TAG) or None
    probed = client.driver_fingerprint()
    if probed is not None and driver_tag is not None:
        driver: str | None = fields([probed, driver_tag])
    else:
        driver = probed or driver_tag
    build = build_identity()
    persistent = driver is not None and build != UNAVAILABLE
    # A session-only identity is unique to this process, so nothing can be shared under it.
    if driver is None:
        driver = session_identity()
    elif not persistent:
        driver = fields([driver, session_identity()])
    fingerprint = fields(
        [client.backend, client.device_kind, client.properties_fingerprint(), driver, client.compiler(), build,
         os.environ.get(BUILD_TAG, ""), client.runtime_options()]
    )
    context = os.environ.get(CONTEXT_TAG) or DEFAULT_CONTEXT
    return RuntimeEnvironment(fingerprint, persistent, context)


# The named parts of a fingerprint, in the order probe_environment encodes them.
FINGERPRINT_PARTS = ("backend", "device kind", "device", "driver", "compiler", "build", "build tag", "runtime options")


def fingerprint_parts(fingerprint: str) -> dict[str, str] | None:
    """A fingerprint's parts by name (``FINGERPRINT_PARTS``), or None for text that is not a fingerprint."""
    try:
        parts = split_fields(fingerprint)
    except ValueError:
        return None
    return dict(zip(FINGERPRINT_PARTS, parts, strict=True)) if len(parts) == len(FINGERPRINT_PARTS) else None


def clear_environment_memo() -> None:
    """Forget probed environments (tests change deployment tags between cases)."""
    with _memo_lock:
        _memo.clear()


def fingerprint_differences(mine: str, theirs: str) -> list[tuple[str, str, str]]:
    """The fields in which two fingerprints differ, as (field, value in ``mine``, value in ``theirs``), "" for a
    field one of them lacks: each runtime option by its name (``("cpus", "1", "2")``: the execution regime), every
    other part by its name in ``FINGERPRINT_PARTS`` (``driver``, ``build``, ...); one ``("fingerprint", mine,
    theirs)`` row when either text is not a fingerprint. Empty when they are the same."""
    if mine == theirs:
        return []
    a, b = fingerprint_parts(mine), fingerprint_parts(theirs)
    if a is None or b is None:
        return [("fingerprint", mine, theirs)]
    found = [(name, a[name], b[name]) for name in FINGERPRINT_PARTS if name != "runtime options" and a[name] != b[name]]
    options = [_options(a["runtime options"]), _options(b["runtime options"])]
    for name in dict.fromkeys([*options[0], *options[1]]):
        if options[0].get(name) != options[1].get(name):
            found.append((name, options[0].get(name, ""), options[1].get(name, "")))
    return found


def _options(text: str) -> dict[str, str]:
    """A runtime-options part by option name: ``cpus=2; blas=2 (openblas Haswell)`` -> {cpus: 2, blas: 2 (...)}."""
    found = {}
    for option in (o.strip() for o in text.split(";")):
        if option:
            name, sep, value = option.partition("=")
            found[name.strip() if sep else option] = value.strip() if sep else option
    return found
