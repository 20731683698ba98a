"""``farm worker``: one process per device, pinned before any CUDA initialization, announced in Redis.

cuda:N sets CUDA_VISIBLE_DEVICES=N (the pool process then sees it as cuda:0); cpu:N pins the process (and the
pool process it forks) to CPU N. The environment is probed in a separate process for CUDA devices so that the
parent never initializes CUDA before forking. The worker consumes the queue of its fingerprint and its own.
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
from typing import Any

from farm.environment import farm_version, runtime_environment
from farm.errors import ConfigError, FarmError
from farm.runtimes.base import client_for, parse_device
from farm_fleet import presence
from farm_fleet.settings import Settings

log = logging.getLogger(__name__)


def pin(device: str) -> str:
    """Pin this process to ``device``; return the device id the pinned process uses."""
    kind, index = parse_device(device)
    if kind == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
        return "cuda:0"
    available = os.sched_getaffinity(0)
    if index not in available:
        raise ConfigError("--device", "device", device, f"CPU {index} is not available (have {sorted(available)})")
    os.sched_setaffinity(0, {index})
    return device


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
    client = client_for(device)
    env = runtime_environment(client)
    return {
        "fingerprint": env.fingerprint,
        "digest": env.digest,
        "persistent": env.persistent,
        "model": client.model(),
    }


def run_worker(device: str, settings: Settings, kernels: tuple[str, ...] = (), loglevel: str = "INFO") -> int:
    """Run the worker until it is stopped; return its exit code."""
    if not settings.broker_url or not settings.redis_url:
        raise ConfigError("farm worker", "--broker/--redis", None, "both the broker URL and the Redis URL are required")
    from farm_kernels import registry

    registry.ensure_loaded(kernels)  # fail early on a bad --kernels module
    pinned = pin(device)
    os.environ["FARM_WORKER_DEVICE"] = pinned
    os.environ["FARM_KERNELS"] = ",".join(kernels)
    os.environ["FARM_BROKER_URL"] = settings.broker_url
    os.environ["FARM_REDIS_URL"] = settings.redis_url
    identity = probe(pinned)
    if not identity["persistent"]:
        log.warning("environment is session-only (no driver or build identity): decisions will not be reusable")
    host = socket.gethostname()
    worker_id = f"{host}-{device.replace(':', '')}"
    os.environ["FARM_WORKER_ID"] = worker_id
    nodename = f"{device.replace(':', '')}@{host}"
    queues = [settings.fingerprint_queue(identity["digest"]), settings.worker_queue(worker_id)]

    from farm.stores.redis import connect
    from farm_workers.app import create_app

    app = create_app(settings)
    redis_client = connect(settings.redis_url, timeout=10.0)
    redis_client.hset(settings.fingerprints_key, identity["digest"], identity["fingerprint"])
    kind = parse_device(device)[0]
    info = presence.WorkerInfo(
        worker_id=worker_id, host=host, device=device, device_kind=kind, fingerprint=identity["digest"],
        model=identity["model"], farm_version=farm_version(), state=presence.HEALTHY, pid=os.getpid(),
        updated=time.time(), queue=queues[1], hostname=nodename,
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
