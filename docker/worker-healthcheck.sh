#!/bin/sh
# The worker image's health check: healthy while this container's `farm worker` keeps its presence record in Redis
# fresh (a heartbeat every FARM_HEARTBEAT_SECONDS) and is not quarantined after a device failure. It applies the
# coordinator's own rule (presence.WorkerInfo.effective_state), and since every heartbeat rewrites the whole
# record, a worker that was frozen (or whose Redis was) turns healthy again with its next beat.
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
    data = client.hgetall(settings.worker_key(worker_id))
finally:
    client.close()
try:
    info = presence.WorkerInfo.from_fields(data)
except (KeyError, ValueError):
    sys.exit(f"unhealthy: worker {worker_id} has no presence record (not started yet, or its heartbeats stopped)")
state = info.effective_state(settings)
if state == presence.QUARANTINED:
    sys.exit(f"unhealthy: worker {worker_id} is quarantined after a device failure")
if state == presence.STALE:
    sys.exit(f"unhealthy: worker {worker_id} last beat {time.time() - info.updated:.0f}s ago")
print(f"healthy: worker {worker_id} is {state}")
PY
