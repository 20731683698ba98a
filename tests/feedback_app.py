"""An application process for the fleet feedback tests: pinned to its CPU set before NumPy loads (so its
fingerprint is a pinned worker's), with the fleet's Redis as a decision source and fleet feedback on. It selects
each requested workload once, optionally feeds a regression into each decision's window, flushes its reports and
prints one JSON line. Usage: ``python feedback_app.py '{"cpus": [0], "catalog": ..., "redis": ..., "report": ...,
"workloads": [["feedbacktest_scale", {"n": 4000, "dtype": "float64"}]], "regress": false}'``
"""

from __future__ import annotations

import json
import os
import sys

args = json.loads(sys.argv[1])
os.sched_setaffinity(0, set(args["cpus"]))

import farm  # noqa: E402  (after pinning, as tests/regime_app.py)
from farm.adapter import RuntimeTrials, prepare  # noqa: E402
from farm_coordinator.catalog import load_catalog  # noqa: E402
from farm_kernels import registry  # noqa: E402

catalog = load_catalog(args["catalog"], ("farm_feedbackops",), policy_only=True)
tuner = farm.enable_stack_autotune(catalog.policy, fleet=[args["redis"]], report_to=args["report"])
client = farm.HostClient(0)
out: dict = {"decisions": []}
for name, spec in args["workloads"]:
    op = registry.get(name)
    inputs = op.build(spec, client)
    prepared = prepare(tuner, op.name, "cpu", client, op.host, inputs)
    decision = tuner.select_request(prepared.request,
                                    RuntimeTrials(client, op.host, inputs, prepared.indices, tuner.policy.timing))
    row = {"operation": name, "source": decision.source.name, "name": decision.name, "cache_key": decision.cache_key}
    if args.get("regress"):
        regressed = False
        for _ in range(tuner.policy.regression_pairs):
            regressed = tuner.record_comparison(decision, 1.0, 3.0, True)
        row["regressed"] = regressed
    out["decisions"].append(row)
reporter = tuner.feedback
assert reporter is not None
out["flushed"] = reporter.flush(30.0)
out["stats"] = reporter.stats().__dict__
print(json.dumps(out))
