#!/bin/sh
# The coordinator image's health check: healthy while every Redis server this container is configured for answers
# PING through the container's own credentials (FARM_BROKER_URL when it is a redis:// URL, FARM_REDIS_URL), so a
# wrong password, a missing ACL user or an unreachable server shows as unhealthy, naming the variable.
# PYTHON names the interpreter.
exec "${PYTHON:-python3}" - <<'PY'
import os
import sys

from farm.stores.redis import connect

urls = {name: os.environ.get(name, "") for name in ("FARM_BROKER_URL", "FARM_REDIS_URL")}
urls = {name: url for name, url in urls.items() if url.startswith(("redis://", "rediss://", "unix://"))}
if not urls:
    sys.exit("unhealthy: neither FARM_BROKER_URL nor FARM_REDIS_URL names a Redis server")
for name, url in urls.items():
    client = connect(url, timeout=5.0)
    try:
        client.ping()
    except Exception as e:  # redis-py's errors: connection, authentication, ACL
        sys.exit(f"unhealthy: {name}: {type(e).__name__}: {e}")
    finally:
        client.close()
print("healthy: " + ", ".join(sorted(urls)) + " answer PING")
PY
