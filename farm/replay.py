"""Replay: a recorded tuning space served as a device, so a search runs on real GPU data without a GPU.

A recording is a Kernel Tuner cache file (``.json`` or ``.json.gz``); :func:`load` reads one into a
:class:`Recording`, whose ``tunable``, ``inputs`` and ``client(seed)`` run a search on it. Its configs,
failures, simulated clock, fingerprint and the refusal of hostile files: docs/replay.md.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from farm.errors import ConfigError, ReplayFailure
from farm.identity import fields
from farm.runtimes.replay import Key, Recorded, ReplayClient, active_client
from farm.space import Space, format_value
from farm.tunable import TunableSet

MAX_BYTES = 512 * 1024 * 1024  # the largest recording read, compressed or not (public ones are ~60 MB)

SPACE = "kernel"
REFERENCE = "reference"
# Kernel Tuner's failure markers in a config's "time": a recorded failure, or a config its restrictions refused.
FAILURES = {"CompilationFailedConfig": "compile", "RuntimeFailedConfig": "runtime"}
INVALID = "InvalidConfig"

__all__ = ["Launch", "Recorded", "Recording", "ReplayClient", "ReplayFailure", "load"]


class _InRecording:
    """The space's restriction: a config is feasible when the recording measured it (or recorded its failure)."""

    def __init__(self, names: Sequence[str], keys: frozenset[Key]) -> None:
        self.names, self.keys = tuple(names), keys

    def __call__(self, **config: Any) -> bool:
        return tuple(config[n] for n in self.names) in self.keys


class Launch:
    """The one input of a recording's tunable set: runs a config on the replay client active in this thread."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording

    def run(self, config: Mapping[str, Any]) -> np.ndarray:
        client = active_client()
        if client is not None:
            client.run(self.recording.key(config))
        return np.zeros(1, dtype=np.float32)

    def __repr__(self) -> str:
        return f"Launch({self.recording.kernel_name}, sha256:{self.recording.digest[:16]})"


def _kernel(launch: Launch, **config: Any) -> np.ndarray:
    """A recorded kernel's config, launched on the active replay client."""
    return launch.run(config)


def _workload(launch: Launch) -> str:
    return launch.recording.workload


def _same(launch: Launch) -> tuple[Launch]:
    return (launch,)  # nothing writable: every trial may share the launcher


class Recording:
    """A loaded recording; see the module docstring. Built by :func:`load`."""

    def __init__(self, path: Path, data: bytes, document: Any, reference: Mapping[str, Any] | None) -> None:
        self.path = path
        self.digest = hashlib.sha256(data).hexdigest()
        where = str(path)
        if not isinstance(document, dict):
            raise ConfigError(where, "(document)", type(document).__name__, "a Kernel Tuner cache file is a JSON object")
        params = document.get("tune_params")
        if not isinstance(params, dict) or not params:
            raise ConfigError(where, "tune_params", params, "must be a non-empty object of parameter value lists")
        keys = document.get("tune_params_keys", list(params))
        if not isinstance(keys, list) or sorted(map(str, keys)) != sorted(params):
            raise ConfigError(where, "tune_params_keys", keys, "must list the tune_params names")
        self.params: dict[str, list[Any]] = {name: params[name] for name in keys}
        for name, values in self.params.items():
            if not isinstance(values, list) or not values or not all(_plain(v) for v in values):
                raise ConfigError(where, f"tune_params.{name}", values, "must be a non-empty list of numbers or strings")
        self.names = tuple(self.params)
        name = document.get("device_name", "")
        kernel = document.get("kernel_name", "kernel")
        if not isinstance(name, str) or not isinstance(kernel, str) or not kernel:
            raise ConfigError(where, "device_name", name, "device_name and kernel_name must be strings")
        self.device_name = name or path.name.split(".")[0]  # some recordings name no device: the file does
        self.kernel_name = kernel
        self.problem_size = document.get("problem_size")
        self.configs = self._configs(where, document.get("cache"))
        self.workload = fields([kernel, json.dumps(self.problem_size), f"recording sha256:{self.digest}"])
        self.reference = self._reference(where, reference)
        self.tunable = self._tunable()
        self.inputs: tuple[Launch] = (Launch(self),)
        self._space = self.tunable.spaces[0]

    def _configs(self, where: str, cache: Any) -> dict[Key, Recorded]:
        if not isinstance(cache, dict) or not cache:
            raise ConfigError(where, "cache", type(cache).__name__, "must be a non-empty object of recorded configs")
        spelled = {n: {format_value(v) for v in values} for n, values in self.params.items()}
        configs: dict[Key, Recorded] = {}
        for label, entry in cache.items():
            field = f"cache.{label}"
            if not isinstance(entry, dict):
                raise ConfigError(where, field, type(entry).__name__, "must be an object")
            key = tuple(entry.get(n) for n in self.names)
            for n, value in zip(self.names, key, strict=True):
                if not _plain(value) or format_value(value) not in spelled[n]:  # type: ignore[arg-type]
                    raise ConfigError(where, f"{field}.{n}", value, f"is not one of tune_params.{n}")
            recorded = _recorded(where, field, entry)
            if recorded is not None:
                configs[key] = recorded
        if not any(r.failure is None for r in configs.values()):
            raise ConfigError(where, "cache", len(cache), "records no valid config")
        return configs

    def _reference(self, where: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
        if given is None:
            order = [{format_value(v): i for i, v in enumerate(self.params[n])} for n in self.names]
            valid = [k for k, r in self.configs.items() if r.failure is None]
            first = min(valid, key=lambda k: [o[format_value(v)] for o, v in zip(order, k, strict=True)])
            return dict(zip(self.names, first, strict=True))
        if not isinstance(given, Mapping) or sorted(given) != sorted(self.names):
            raise ConfigError(where, "reference", given, f"must give every parameter: {', '.join(self.names)}")
        recorded = self.configs.get(self.key(given))
        if recorded is None or recorded.failure is not None:
            raise ConfigError(where, "reference", dict(given), "is not a recorded valid config")
        return {n: given[n] for n in self.names}

    def _tunable(self) -> TunableSet:
        identity = f"replay sha256:{self.digest}"
        ts = TunableSet(self.kernel_name, signature=_workload, generate=_same)
        ts.add(functools.partial(_kernel, **self.reference), name=REFERENCE, reference=True, identity=identity)
        ts.add_space(Space(SPACE, _kernel, self.params, _InRecording(self.names, frozenset(self.configs)),
                           identity=identity))
        return ts

    def key(self, config: Mapping[str, Any]) -> Key:
        return tuple(config[n] for n in self.names)

    def config_of(self, name: str) -> dict[str, Any]:
        """The config a candidate name of :attr:`tunable` denotes (``reference`` too); KeyError for another."""
        if name == REFERENCE:
            return dict(self.reference)
        config = self._space.parse(name)
        if config is None:
            raise KeyError(f"{name!r} is not a candidate of recording {self.path.name}")
        return config

    def name_of(self, config: Mapping[str, Any]) -> str:
        """The space candidate's name of a config."""
        return self._space.config_name(config)

    def mean_ms(self, name: str) -> float:
        """The recorded mean ms of a candidate name (or ``reference``); inf: a failure; KeyError: unrecorded."""
        recorded = self.configs.get(self.key(self.config_of(name)))
        if recorded is None:
            raise KeyError(f"{name!r} was not recorded in {self.path.name}")
        return recorded.mean * 1e3

    @functools.cached_property
    def best(self) -> tuple[str, float]:
        """(name, recorded mean ms) of the recorded optimum."""
        key, recorded = min(((k, r) for k, r in self.configs.items() if r.failure is None), key=lambda kr: kr[1].mean)
        return self.name_of(dict(zip(self.names, key, strict=True))), recorded.mean * 1e3

    def client(self, seed: int = 0, index: int = 0) -> ReplayClient:
        """A device serving this recording; ``index`` tells parallel devices of the same recording apart."""
        return ReplayClient(self, seed, index)

    def __repr__(self) -> str:
        return f"Recording({self.path.name}: {self.kernel_name} on {self.device_name}, {len(self.configs)} configs)"


def _plain(value: Any) -> bool:
    return isinstance(value, (int, str)) or (isinstance(value, float) and math.isfinite(value))


def _recorded(where: str, field: str, entry: Mapping[str, Any]) -> Recorded | None:
    """One cache entry's record (None for a config its tuner's restrictions refused)."""
    compile_ms = entry.get("compile_time", 0.0)
    if not isinstance(compile_ms, (int, float)) or isinstance(compile_ms, bool) or not (0 <= compile_ms < math.inf):
        raise ConfigError(where, f"{field}.compile_time", compile_ms, "must be a finite number of ms >= 0")
    mean = entry.get("time")
    if mean == INVALID:
        return None
    if isinstance(mean, str):
        if mean not in FAILURES:
            raise ConfigError(where, f"{field}.time", mean, f"is neither a time nor one of {', '.join(FAILURES)}")
        return Recorded((), math.inf, compile_ms / 1e3, FAILURES[mean])
    if not _positive(mean):
        raise ConfigError(where, f"{field}.time", mean, "must be a positive finite number of ms")
    times = entry.get("times", [mean])
    if not isinstance(times, list) or not times or not all(_positive(t) for t in times):
        raise ConfigError(where, f"{field}.times", times, "must be a non-empty list of positive finite ms")
    return Recorded(tuple(t / 1e3 for t in times), float(mean) / 1e3, compile_ms / 1e3, None)  # type: ignore[arg-type]


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def read_bytes(path: Path, limit: int = MAX_BYTES) -> bytes:
    """A regular file's bytes, gunzipped when it is gzip, refusing more than ``limit`` bytes either way."""
    where = str(path)
    try:
        info = os.stat(path)
    except OSError as e:
        raise ConfigError(where, "(file)", str(path), f"cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(where, "(file)", str(path), "is not a regular file")
    if info.st_size > limit:
        raise ConfigError(where, "(file)", info.st_size, f"is larger than {limit} bytes")
    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        if head != b"\x1f\x8b":
            return f.read(limit + 1)
        try:
            with gzip.GzipFile(fileobj=f) as z:
                data = z.read(limit + 1)
        except (OSError, EOFError) as e:
            raise ConfigError(where, "(gzip)", str(path), f"is not a readable gzip file: {e}") from None
    if len(data) > limit:
        raise ConfigError(where, "(file)", f"> {limit} bytes", "decompresses to more than the limit")
    return data


def load(path: str | os.PathLike[str], reference: Mapping[str, Any] | None = None, *,
         root: str | os.PathLike[str] | None = None, limit: int = MAX_BYTES) -> Recording:
    """Load a Kernel Tuner cache file as a :class:`Recording` (see the module docstring). ``root``: refuse a path
    that resolves outside that folder. Raises ConfigError naming the file, field and value."""
    given = Path(path)
    if root is not None:
        base = Path(root).resolve()
        resolved = (base / given).resolve()
        if not resolved.is_relative_to(base):
            raise ConfigError(str(path), "(path)", str(path), f"lies outside {base}")
        given = resolved
    data = read_bytes(given, limit)
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(str(given), "(json)", str(e)[:200], "is not a JSON document") from None
    except RecursionError:
        raise ConfigError(str(given), "(json)", "nesting", "is nested too deeply") from None
    return Recording(given, data, document, reference)
