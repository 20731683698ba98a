#!/bin/sh
# The worker image's health check: healthy while this container's `farm worker` keeps its presence record in Redis
# fresh (a heartbeat every FARM_HEARTBEAT_SECONDS) and is not quarantined after a device failure.
# Usage: worker-healthcheck.sh [DEVICE]  (default cuda:0, the device `farm worker` was given).
# Reads FARM_REDIS_URL, FARM_PREFIX and FARM_HEARTBEAT_SECONDS like the worker; PYTHON names the interpreter.
exec "${PYTHON:-python3}" - "${1:-cuda:0}" <<'PY'
import socket
import sys
import time

from farm_fleet import presence
from farm_fleet.settings import Settings
from farm.stores.redis import connect

device = sys.argv[1]
settings = Settings.from_env()
if not settings.redis_url:
    sys.exit("unhealthy: FARM_REDIS_URL is not set")
worker_id = f"{socket.gethostname()}-{device.replace(':', '')}"  # as farm_workers.worker.run_worker names it
client = connect(settings.redis_url, timeout=5.0)
try:
    state, updated = client.hmget(settings.worker_key(worker_id), "state", "updated")
finally:
    client.close()
if state is None or updated is None:
    sys.exit(f"unhealthy: worker {worker_id} has no presence record (not started yet, or its heartbeats stopped)")
age = time.time() - float(updated)
if state == presence.QUARANTINED:
    sys.exit(f"unhealthy: worker {worker_id} is quarantined after a device failure")
if age > 2 * settings.heartbeat_seconds:  # presence.WorkerInfo.effective_state's rule for stale
    sys.exit(f"unhealthy: worker {worker_id} last beat {age:.0f}s ago")
print(f"healthy: worker {worker_id} is {state}")
PY
