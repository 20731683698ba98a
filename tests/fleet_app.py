"""An application as the README's "The farm on a fleet" recipe runs it: the controller with the fleet's Redis as a
tier, one softmax call. Usage: ``python fleet_app.py REDIS_URL '{"rows": 64, ...}'`` -> its stats as one JSON
line (stdout); the controller's warnings go to stderr."""

from __future__ import annotations

import dataclasses
import json
import sys

import farm
from farm_kernels import registry

url, spec = sys.argv[1], json.loads(sys.argv[2])
registry.ensure_loaded()
op = registry.get("softmax")
client = farm.HostClient(0)
inputs = op.build(spec, client)
farm.enable_stack_autotune(farm.StackPolicy(samples=3, budget=5.0), fleet=[url])
farm.try_execute_stack(op.name, client.device_id, client, op.tunable("cpu"), inputs)
print(json.dumps(dataclasses.asdict(farm.stack_autotuner().stats())))
