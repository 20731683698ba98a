"""The local devices a command is given (``--device cpu:N``), checked before anything is started: a host device
names a CPU this process may run on, so `farm tune` and `farm worker` refuse ``cpu:7`` on a 2-core machine alike,
blaming ``--device`` (not an option the user did not give); a replay device (``replay:PATH[#N]``) names a
recording that loads."""

from __future__ import annotations

import os

from farm.errors import ConfigError


def check_device(device: str, cores: str | None = None, available: frozenset[int] | None = None) -> None:
    """Raise ConfigError naming ``--device`` (or ``--cores`` when given) unless ``device`` is usable here:
    ``cpu:N`` needs CPU N among the CPUs this process may use (``--cores`` replaces that rule by its own)."""
    from farm_kernels import recorded
    from farm_workers.worker import format_cpus, parse_cores

    if recorded.parse_device(device) is not None:  # a recording: the file must load (ConfigError naming it)
        recorded.load_device(device)
        return
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or not index.isdigit():
        raise ConfigError("--device", "device", device, "use cpu:N, cuda:N (N a number: cpu:0, cuda:1) or replay:PATH")
    allowed = available if available is not None else frozenset(os.sched_getaffinity(0))
    if cores is not None:
        if kind == "cpu":
            parse_cores(cores, int(index), allowed)
        return
    if kind == "cpu" and int(index) not in allowed:
        top = sorted(allowed)
        raise ConfigError("--device", "device", device,
                          f"CPU {index} is not available to this process (have {format_cpus(top)}): use cpu:{top[0]}"
                          f"..cpu:{top[-1]}, or give --cores to choose this device's CPUs")
