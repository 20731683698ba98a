"""``farm worker``: one process per device, pinned before any CUDA initialization, announced in Redis.

cuda:N sets CUDA_VISIBLE_DEVICES=N (the pool process then sees it as cuda:0). cpu:N pins the process (and the
pool process it forks) to the cores it owns (``--cores``; by default CPU N alone) and limits every thread pool
(BLAS, OpenMP) to that many threads, both before the environment is probed: the regime the worker tunes in is the
regime its fingerprint names, and an application computes the same fingerprint only in the same regime. The
environment is probed in a separate process for CUDA devices so that the parent never initializes CUDA before
forking. The worker consumes the queue of its fingerprint and its own.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from farm.environment import farm_version, runtime_environment
from farm.errors import ConfigError, FarmError
from farm.runtimes import parse_device
from farm.runtimes.host import host_regime, limit_threads
from farm_fleet import presence
from farm_fleet.settings import Settings
from farm_kernels import recorded
from farm_kernels.cuda.kcache import CACHE_ENV, default_location

log = logging.getLogger(__name__)


def parse_cores(spec: str | None, index: int, available: set[int] | frozenset[int]) -> frozenset[int]:
    """The CPUs worker ``cpu:index`` owns. ``None``: CPU ``index`` alone. A list (``0-3``, ``0,2,4-5``, ``3-3``):
    those CPUs. A bare count ``K``: the K allowed CPUs at positions ``index*K .. index*K+K-1`` of the sorted
    allowed set, so that cpu:0, cpu:1, ... declared with the same count share no core. Raises ConfigError."""
    def bad(reason: str) -> ConfigError:
        return ConfigError("--cores", "cores", spec, reason)

    if spec is None:
        wanted = {index}
    elif spec.strip().isdigit():
        count, allowed = int(spec), sorted(available)
        if count < 1:
            raise bad("a core count must be at least 1")
        wanted = set(allowed[index * count:(index + 1) * count])
        if len(wanted) < count:
            raise bad(f"cpu:{index} with {count} cores needs CPUs at positions {index * count}..{(index + 1) * count - 1} "
                      f"of the {len(allowed)} allowed ({format_cpus(allowed)})")
    else:
        wanted = set()
        for part in spec.split(","):
            low, dash, high = part.strip().partition("-")
            if not low.isdigit() or (dash and not high.isdigit()):
                raise bad("use a count (4) or a CPU list (0-3, 0,2,4-5)")
            first, last = int(low), int(high) if dash else int(low)
            if last < first:
                raise bad(f"range {part.strip()} runs backwards")
            wanted.update(range(first, last + 1))
    missing = sorted(wanted - set(available))
    if missing:
        raise bad(f"CPU {format_cpus(missing)} is not available to this process (have {format_cpus(available)})")
    return frozenset(wanted)


def format_cpus(cpus: Iterable[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"`` (the taskset/cpuset list syntax)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def pin(device: str, cores: str | None = None) -> tuple[str, frozenset[int] | None]:
    """Pin this process to ``device``; return the device id the pinned process uses and the cores it owns.

    A host device also limits every thread pool to its core count (the environment for libraries that load
    later, threadpoolctl for those already loaded), so no library runs more threads than the worker has cores.
    A CUDA device pins its host threads only when ``cores`` is given. A replay device (``replay:PATH[#N]``, a
    recording: ``farm_kernels.recorded``) runs nothing here: it is loaded (ConfigError naming a bad file), not pinned."""
    if recorded.parse_device(device) is not None:
        recorded.load_device(device)
        return device, None
    kind, index = parse_device(device)
    if kind == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
        if cores is None:
            return "cuda:0", None
        owned = parse_cores(cores, 0, os.sched_getaffinity(0))
        os.sched_setaffinity(0, owned)
        limit_threads(len(owned))
        return "cuda:0", owned
    owned = parse_cores(cores, index, os.sched_getaffinity(0))
    os.sched_setaffinity(0, owned)
    regime = limit_threads(len(owned))
    if max(regime.blas, regime.openmp) > len(owned):
        raise ConfigError("--cores", "cores", cores, f"a thread pool kept more threads than {len(owned)} cores "
                          f"after limiting ({regime.text()})")
    return device, owned


def probe(device: str) -> dict[str, Any]:
    """Fingerprint and model of the (pinned) device, probed in a child process for CUDA."""
    if device.startswith("cuda"):
        code = ("import json,sys; from farm.errors import FarmError; from farm_workers.worker import probe_here\n"
                "try: print(json.dumps(probe_here(sys.argv[1])))\n"
                "except FarmError as e: print(json.dumps({'error': str(e)}))")
        out = subprocess.run([sys.executable, "-c", code, device], capture_output=True, text=True)
        lines = out.stdout.strip().splitlines()
        if out.returncode != 0 or not lines:
            last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
            raise FarmError(f"--device {device}: probing the device failed: {last}")
        data: dict[str, Any] = json.loads(lines[-1])
        if "error" in data:  # e.g. no CuPy: the child's message names the install command
            raise FarmError(f"--device {device}: {data['error']}")
        return data
    return probe_here(device)


def probe_here(device: str) -> dict[str, Any]:
    client = recorded.client_for(device)
    env = runtime_environment(client)
    return {
        "name": recorded.worker_name(device, client),
        "fingerprint": env.fingerprint,
        "digest": env.digest,
        "persistent": env.persistent,
        "model": client.model(),
        "regime": host_regime().to_dict(),
    }


def kernel_cache_location(device_kind: str, redis_url: str | None, env: Mapping[str, str]) -> str | None:
    """Where a worker's trial path loads CUDA space cubins from (``farm_kernels.cuda.compile.load_module``): None
    for a host device (nothing to load); the cache configured explicitly (``$FARM_KERNEL_CACHE``, a directory or a
    Redis URL); else the fleet's kernel cache, the Redis of the worker's settings, where ``farm compile``, the
    coordinator's compile stage and ``farm worker --compile`` store; else the local default directory."""
    if device_kind != "cuda":
        return None
    explicit = env.get(CACHE_ENV)
    if explicit:
        return explicit
    return redis_url or default_location()


def use_fleet_kernel_cache(device: str, settings: Settings) -> str | None:
    """At a worker's start: open the kernel cache :func:`kernel_cache_location` names for ``device`` and make the
    trial path load through it (``use_kernel_cache``; ``$FARM_KERNEL_CACHE`` for the pool processes too). A miss
    there compiles once on this worker and stores the entry; NVRTC never runs twice for one kernel. The cache's
    description (a Redis URL without its password), or None."""
    location = kernel_cache_location(recorded.device_kind(device), settings.redis_url, os.environ)
    if location is None:
        return None
    from farm_kernels.cuda.compile import use_kernel_cache
    from farm_kernels.cuda.kcache import open_cache

    os.environ[CACHE_ENV] = location
    cache = open_cache(location)
    use_kernel_cache(cache)
    return cache.describe()


def run_worker(device: str, settings: Settings, kernels: tuple[str, ...] = (), loglevel: str = "INFO",
               cores: str | None = None, check_servers: Callable[[], None] | None = None) -> int:
    """Run the worker until it is stopped; return its exit code. ``cores``: see :func:`parse_cores`.
    ``check_servers`` runs once the device is known to be usable, before any server is used (the CLI's one-line
    "cannot reach" errors): a bad device is reported before an unreachable server."""
    if not settings.broker_url or not settings.redis_url:
        raise ConfigError("farm worker", "--broker/--redis", None, "both the broker URL and the Redis URL are required")
    from farm_kernels import registry

    registry.ensure_loaded(kernels)  # fail early on a bad --kernels module
    pinned, owned = pin(device, cores)
    os.environ["FARM_WORKER_DEVICE"] = pinned
    os.environ["FARM_KERNELS"] = ",".join(kernels)
    os.environ["FARM_BROKER_URL"] = settings.broker_url
    os.environ["FARM_REDIS_URL"] = settings.redis_url
    identity = probe(pinned)
    cache = use_fleet_kernel_cache(device, settings)
    if check_servers is not None:
        check_servers()
    regime = identity["regime"]
    log.info("worker %s on cores %s: %s", device, format_cpus(owned) if owned else "unpinned",
             host_regime().text())
    if cache is not None:
        log.info("kernel cache %s: CUDA space cubins load from it, a miss compiles once and is stored", cache)
    if not identity["persistent"]:
        log.warning("environment is session-only (no driver or build identity): decisions will not be reusable")
    host = socket.gethostname()
    worker_id = f"{host}-{identity['name']}"
    os.environ["FARM_WORKER_ID"] = worker_id
    nodename = f"{identity['name']}@{host}"
    queues = [settings.fingerprint_queue(identity["digest"]), settings.worker_queue(worker_id)]

    from farm.stores.redis import connect
    from farm_workers.app import create_app

    app = create_app(settings)
    redis_client = connect(settings.redis_url, timeout=10.0)
    redis_client.hset(settings.fingerprints_key, identity["digest"], identity["fingerprint"])
    kind = recorded.device_kind(device)
    info = presence.WorkerInfo(
        worker_id=worker_id, host=host, device=device, device_kind=kind, fingerprint=identity["digest"],
        model=identity["model"], farm_version=farm_version(), state=presence.HEALTHY, pid=os.getpid(),
        updated=time.time(), queue=queues[1], hostname=nodename, cores=format_cpus(owned) if owned else "",
        blas_threads=int(regime["blas"]), openmp_threads=int(regime["openmp"]),
    )
    presence.announce(redis_client, settings, info)
    stop = threading.Event()
    heart = threading.Thread(
        target=_heartbeat, args=(app, redis_client, settings, worker_id, nodename, queues, stop), daemon=True
    )
    heart.start()
    try:
        argv = ["worker", f"--hostname={nodename}", "-Q", ",".join(queues), "--concurrency=1", "--pool=prefork",
                "--events", f"--loglevel={loglevel}", "--without-mingle", "--without-gossip"]
        app.worker_main(argv=argv)
    finally:
        stop.set()
        try:
            presence.withdraw(redis_client, settings, worker_id)
        except Exception as e:  # shutting down: nothing to do about an unreachable Redis
            log.warning("could not withdraw worker %s: %s", worker_id, e)
    return 0


def _heartbeat(app: Any, client: Any, settings: Settings, worker_id: str, nodename: str, queues: list[str],
               stop: threading.Event) -> None:
    cancelled = False
    while not stop.wait(settings.heartbeat_seconds):
        try:
            presence.beat(client, settings, worker_id)
            if not cancelled and presence.state_of(client, settings, worker_id) == presence.QUARANTINED:
                for queue in queues:
                    app.control.cancel_consumer(queue, destination=[nodename])
                cancelled = True
                log.error("worker %s quarantined after a device failure: stopped consuming", worker_id)
        except Exception as e:
            log.warning("heartbeat failed: %s", e)
