"""The content-addressed kernel cache: compiled cubins and their verdicts, keyed by what determines the cubin.

The key (:func:`kernel_key`) is the sha256 of the program text, the NVRTC options, the architecture and the
NVRTC version, so equal inputs share one entry on every machine. An entry is a :class:`KernelEntry`: the
verdict (``compiled``, ``infeasible`` or ``failed``), its reason (the resource limit exceeded, or NVRTC's log),
the resources of each entry point, and the cubin (only for a compiled kernel). Two stores:

- :class:`DirectoryCache` (the default, ``$FARM_KERNEL_CACHE`` or ``~/.cache/farm/kernels``): ``KEY.cubin``
  then ``KEY.json``, each written atomically (temp + fsync + rename); an entry exists once its JSON does;
- :class:`RedisCache` (the fleet's): one hash per key (``meta`` JSON, ``cubin`` bytes), written by one ``HSET``.

No pickle: the metadata is JSON with a schema version; a cubin is stored as its bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from farm.atomicfile import write_atomic
from farm.errors import ConfigError

SCHEMA = 1
CACHE_ENV = "FARM_KERNEL_CACHE"
REDIS_PREFIX = "farm:kernel:"
STATUSES = ("compiled", "infeasible", "failed")


def kernel_key(text: str, options: Sequence[str], arch: str, nvrtc_version: tuple[int, int]) -> str:
    """sha256 (hex) of the source text, the options, the architecture and the NVRTC version."""
    payload = json.dumps([text, list(options), arch, list(nvrtc_version)], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class KernelEntry:
    """One cached compile: verdict, reason, per-entry-point resources and (compiled only) the cubin."""

    key: str
    status: str
    reason: str = ""
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    cubin: bytes = b""
    seconds: float = 0.0  # the compile's wall time (what a GPU worker would have spent)

    def meta(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "key": self.key, "status": self.status, "reason": self.reason,
                "resources": self.resources, "seconds": self.seconds, "cubin_bytes": len(self.cubin)}

    @classmethod
    def from_meta(cls, where: str, meta: Any, cubin: bytes) -> KernelEntry:
        """Rebuild an entry; ConfigError naming ``where`` and the field for anything malformed."""
        if not isinstance(meta, dict):
            raise ConfigError(where, "<entry>", meta, "a kernel cache entry must be a JSON object")
        if meta.get("schema") != SCHEMA:
            raise ConfigError(where, "schema", meta.get("schema"), f"unsupported kernel cache schema (expected {SCHEMA})")
        status = meta.get("status")
        if status not in STATUSES:
            raise ConfigError(where, "status", status, f"must be one of {list(STATUSES)}")
        if status == "compiled" and len(cubin) != meta.get("cubin_bytes"):
            raise ConfigError(where, "cubin_bytes", meta.get("cubin_bytes"), f"the stored cubin has {len(cubin)} bytes")
        return cls(str(meta.get("key")), status, str(meta.get("reason", "")), dict(meta.get("resources") or {}),
                   cubin, float(meta.get("seconds", 0.0)))


class KernelCache(Protocol):
    """Where compiled kernels live; ``get`` is None on a miss."""

    def get(self, key: str) -> KernelEntry | None: ...

    def put(self, entry: KernelEntry) -> None: ...

    def describe(self) -> str: ...


class DirectoryCache:
    """A local directory of ``KEY.json`` + ``KEY.cubin`` files (see the module docstring)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def describe(self) -> str:
        return str(self.root)

    def cubin_path(self, key: str) -> Path:
        """Where ``key``'s cubin file is (whether or not it exists)."""
        return self._paths(key)[1]

    def _paths(self, key: str) -> tuple[Path, Path]:
        _check_key(key)
        folder = self.root / key[:2]
        return folder / f"{key}.json", folder / f"{key}.cubin"

    def get(self, key: str) -> KernelEntry | None:
        meta_path, cubin_path = self._paths(key)
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ConfigError(str(meta_path), "<file>", None, f"unreadable kernel cache entry: {e}") from e
        cubin = cubin_path.read_bytes() if meta.get("status") == "compiled" else b""
        return KernelEntry.from_meta(str(meta_path), meta, cubin)

    def put(self, entry: KernelEntry) -> None:
        meta_path, cubin_path = self._paths(entry.key)
        if entry.cubin:
            write_atomic(cubin_path, entry.cubin)  # before the JSON: an entry is visible only when complete
        write_atomic(meta_path, json.dumps(entry.meta(), sort_keys=True).encode())


class RedisCache:
    """Entries as Redis hashes ``farm:kernel:KEY`` (fields ``meta`` and ``cubin``), one ``HSET`` per entry."""

    def __init__(self, url: str) -> None:
        import redis

        self.url = url
        self.client = redis.Redis.from_url(url)  # bytes replies: cubins are binary

    def describe(self) -> str:
        """The URL, its password (if any) replaced by ``***``: what a log line or a summary may show."""
        from urllib.parse import urlsplit

        password = urlsplit(self.url).password
        return self.url.replace(f":{password}@", ":***@", 1) if password else self.url

    def get(self, key: str) -> KernelEntry | None:
        _check_key(key)
        found = self.client.hmget(REDIS_PREFIX + key, ["meta", "cubin"])
        if found[0] is None:
            return None
        where = f"{self.url} {REDIS_PREFIX}{key}"
        try:
            meta = json.loads(found[0])
        except ValueError as e:
            raise ConfigError(where, "meta", None, f"not JSON: {e}") from e
        data = found[1] or b""
        return KernelEntry.from_meta(where, meta, data if isinstance(data, bytes) else data.encode())

    def put(self, entry: KernelEntry) -> None:
        _check_key(entry.key)
        self.client.hset(REDIS_PREFIX + entry.key,
                         mapping={"meta": json.dumps(entry.meta(), sort_keys=True), "cubin": entry.cubin})


def _check_key(key: str) -> None:
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"kernel cache key {key!r} is not a sha256 hex digest")


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def default_location() -> str:
    """``$FARM_KERNEL_CACHE`` (a directory or a Redis URL), else ``~/.cache/farm/kernels``."""
    return os.environ.get(CACHE_ENV) or str(Path.home() / ".cache" / "farm" / "kernels")


def open_cache(cache_dir: Path | str | None = None, redis_url: str | None = None) -> KernelCache:
    """The cache a command names: Redis when ``redis_url`` is given, else the directory ``cache_dir``, else the
    default location above."""
    if redis_url:
        return RedisCache(redis_url)
    where = str(cache_dir) if cache_dir is not None else default_location()
    return RedisCache(where) if where.startswith(REDIS_SCHEMES) else DirectoryCache(where)
