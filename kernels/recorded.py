"""Recorded problems: a Kernel Tuner cache file (``farm.replay``) as a farm device and as a catalog problem.

- ``farm worker --device replay:PATH[#N]`` serves the recording as its device (:func:`client_for`): device kind
  ``replay``, the fingerprint of the recorded device and file (every worker of one recording shares it: parallel
  devices of one SKU; ``#N`` tells them apart and seeds their draws).
- A catalog problem ``{ recording = "PATH" }`` names the recording's space as a problem (:func:`add`): its
  operation is :func:`operation_name` (the recorded kernel and the file's hash), its one workload :func:`spec_of`,
  planned only on :func:`fingerprint_of` (the recording's workers).
- A worker resolves a recorded task from its own device's recording (:func:`own`), never from the message.
- Across fingerprints, the recordings of one kernel, problem size and parameters are one problem family
  (:func:`family`): another GPU's decision seeds the search as a prior.

An operation name resolves through :func:`tunable` and :func:`label`: a recorded operation this process loaded
(a catalog's), else the kernels registry.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from farm.encoding import fields
from farm.errors import ConfigError
from farm.replay import Recording, ReplayClient, load
from farm.runtimes.base import ComputeClient
from farm.tunable import TunableSet

KIND = "replay"
PREFIX = KIND + ":"
SPEC_FIELD = "recording"

_lock = threading.Lock()
_recordings: dict[str, Recording] = {}  # operation name -> the recording a catalog of this process named


def parse_device(device: str) -> tuple[str, int] | None:
    """``replay:PATH#N`` -> (PATH, N); ``replay:PATH`` -> (PATH, 0); None for another device."""
    if not device.startswith(PREFIX):
        return None
    path, hash_, index = device[len(PREFIX):].rpartition("#")
    if hash_ and index.isdigit():
        return path, int(index)
    return device[len(PREFIX):], 0


def device_kind(device: str) -> str:
    """``replay`` for a replay device, else the kind before the colon (``cpu``, ``cuda``)."""
    return KIND if parse_device(device) is not None else device.partition(":")[0]


def load_device(device: str) -> ReplayClient:
    """The client of ``replay:PATH[#N]`` (seed and index N). ConfigError naming ``--device`` and the file."""
    parsed = parse_device(device)
    if parsed is None or not parsed[0]:
        raise ConfigError("--device", "device", device, "use replay:PATH or replay:PATH#N (a Kernel Tuner cache file)")
    path, index = parsed
    try:
        recording = load(path)
    except ConfigError as e:
        raise ConfigError("--device", "device", device, f"not a usable recording: {e}") from None
    return recording.client(seed=index, index=index)


def client_for(device: str) -> ComputeClient:
    """The client of any device a worker may serve: ``replay:PATH[#N]`` here, else ``farm.runtimes.client_for``."""
    if parse_device(device) is not None:
        return load_device(device)
    from farm.runtimes import client_for as runtime_client

    return runtime_client(device)


def worker_name(device: str, client: ComputeClient) -> str:
    """A device's part of a worker id: ``cpu0``; ``replay0-<12 hex of the file's hash>`` for a recording (a path
    is no name: two recordings served on one host must not share an id)."""
    if isinstance(client, ReplayClient):
        return f"replay{client.index}-{client.recording.digest[:12]}"
    return device.replace(":", "")


def operation_name(recording: Recording) -> str:
    """A recording's operation: its kernel and the first 12 hex of the file's hash (``convolution_kernel@c95e4e2a500b``)."""
    return f"{recording.kernel_name}@{recording.digest[:12]}"


def spec_of(recording: Recording) -> dict[str, Any]:
    """A recording's one workload spec: the file's hash (a path differs from machine to machine)."""
    return {SPEC_FIELD: f"sha256:{recording.digest}"}


def fingerprint_of(recording: Recording) -> str:
    """The fingerprint digest of the recording's workers (whatever their ``#N``)."""
    from farm.environment import runtime_environment

    return runtime_environment(recording.client()).digest


def family(operation: str) -> tuple[str, str, dict[str, Any]] | None:
    """What a loaded recording's problem family is across fingerprints (``farm_coordinator.plan``: priors from
    other SKUs): (operation, checksum, spec) that leave the device and the file out: the recorded kernel, its problem
    size and its parameter names. Two recordings of one kernel on two GPUs are one family (their config names
    are the same); their operations, specs and candidate sets are not (each names its file). None for an
    operation that is not a loaded recording."""
    recording = get(operation)
    if recording is None:
        return None
    shape = json.dumps(recording.problem_size, sort_keys=True)
    return (f"recorded:{recording.kernel_name}", fields(["recorded", recording.kernel_name, shape, *recording.names]),
            {"problem_size": shape})


def add(recording: Recording) -> str:
    """Make a recording's operation resolvable in this process (:func:`tunable`, :func:`label`); its name."""
    name = operation_name(recording)
    with _lock:
        _recordings.setdefault(name, recording)
    return name


def get(operation: str) -> Recording | None:
    with _lock:
        return _recordings.get(operation)


def tunable(operation: str, device_kind: str) -> TunableSet:
    """The tunable set of ``operation`` on ``device_kind``: a loaded recording's, else the registry's."""
    recording = get(operation) if device_kind == KIND else None
    if recording is not None:
        return recording.tunable
    from farm_kernels import registry

    return registry.get(operation).tunable(device_kind)


def label(operation: str, spec: Mapping[str, Any]) -> str | None:
    """A recorded workload's label (``NVIDIA A100-PCIE-40GB [4096, 4096] (convolution_A100.json.gz)``), or None
    for another operation."""
    recording = get(operation)
    if recording is None:
        return None
    return f"{recording.device_name} {recording.problem_size} ({recording.path.name})"


def own(client: ComputeClient, operation: str, spec: Mapping[str, Any]) -> Recording:
    """The worker's own recording, when a task names it (operation and spec); LookupError otherwise: a task never
    chooses what a worker replays."""
    recording = client.recording if isinstance(client, ReplayClient) else None
    if not isinstance(recording, Recording):
        raise LookupError(f"task for recorded operation {operation!r} reached a worker that serves no recording")
    if operation != operation_name(recording) or dict(spec) != spec_of(recording):
        raise LookupError(f"task for recorded operation {operation!r} ({dict(spec)}) reached the worker of "
                          f"{operation_name(recording)} ({recording.path.name})")
    return recording


def load_for_catalog(value: Any, catalog: str, where: str) -> Recording:
    """The recording a catalog problem names (a path relative to the catalog's folder, never outside it);
    ConfigError naming the catalog, the field and the value."""
    if not isinstance(value, str) or not value:
        raise ConfigError(catalog, where, value, "must be the path of a Kernel Tuner cache file (.json or .json.gz)")
    try:
        return load(value, root=Path(catalog).resolve().parent)
    except ConfigError as e:
        detail = e.problem if e.field in ("(path)", "(file)") else f"{e.field} = {e.value!r}: {e.problem}"
        raise ConfigError(catalog, where, value, f"not a usable recording: {detail}") from None
