"""An application process for the regime tests: it takes its CPU set before NumPy loads (as ``taskset`` would),
so its BLAS pool starts at that size, then prints its fingerprint and, when asked, tunes (or looks up) one
workload of ``regimetest_blas``. Usage: ``python regime_app.py '{"cpus": [0], "tune": {...}}'`` -> one JSON line.
"""

from __future__ import annotations

import json
import os
import sys

args = json.loads(sys.argv[1])
os.sched_setaffinity(0, set(args["cpus"]))

import farm  # noqa: E402  (after pinning: the BLAS pool sizes itself from the CPU set when it loads)
from farm.adapter import RuntimeTrials, prepare  # noqa: E402
from farm.environment import runtime_environment  # noqa: E402
from farm.runtimes.host import host_regime  # noqa: E402

client = farm.HostClient(0)
env = runtime_environment(client)
out: dict = {"fingerprint": env.fingerprint, "digest": env.digest, "regime": host_regime().text()}
tune = args.get("tune")
if tune:
    from farm.stores.redis import RedisDecisions
    from farm_coordinator.catalog import load_catalog
    from farm_fleet.settings import Settings
    from farm_kernels import registry

    catalog = load_catalog(tune["catalog"], ("farm_regimeops",))
    fleet = [RedisDecisions(tune["redis"], settings=Settings.from_env())] if tune.get("redis") else []
    tuner = farm.StackTuner(catalog.policy, fleet=fleet)
    op = registry.get("regimetest_blas")
    inputs = op.build(tune["spec"], client)
    prepared = prepare(tuner, op.name, "cpu", client, op.host, inputs)
    trials = RuntimeTrials(client, op.host, inputs, prepared.indices, tuner.policy.timing)
    decision = tuner.select_request(prepared.request, trials)
    out.update(name=decision.name, ratio=decision.ratio, source=decision.source.name, cache_key=decision.cache_key,
               verified=decision.verified)
print(json.dumps(out))
