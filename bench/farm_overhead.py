"""The farm's own overhead, measured in one run against one private redis-server and one `farm worker` (cpu:0).

(a) efficiency: summed trial time reported by the task results / (wall time x devices), for the host part of
    examples/catalog.toml; target >= 0.9.
(b) decisions per second for a catalog of trivial candidates (one group task per decision, plus aggregation
    and publication) vs raw Celery no-op round trips per second on the same broker and worker; target >= 1.0x.
(c) p50 of a fleet-cache lookup as the runtime does it (RedisDecisions.get_in: HGET, JSON, checksum and key check)
    vs a raw redis-py GET of the same bytes; target <= 1.3x.

    .venv/bin/python bench/farm_overhead.py [--trivial 300] [--lookups 5000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]

from servers import farm_env, redis_server, start_worker, wait_worker_ready  # noqa: E402

from farm.identity import CacheKey, Candidate  # noqa: E402
from farm.policy import AccuracyKey, StackPolicy  # noqa: E402
from farm.stores.base import DecisionRecord  # noqa: E402
from farm.stores.redis import RedisDecisions, field_for  # noqa: E402
from farm_coordinator.catalog import load_catalog  # noqa: E402
from farm_coordinator.run import tune  # noqa: E402
from farm_coordinator.runview import ConsoleObserver  # noqa: E402
from farm_fleet.settings import Settings  # noqa: E402

CANDIDATES = (Candidate("reference"), Candidate("candidate"))


def host_catalog(directory: Path) -> Path:
    """examples/catalog.toml without its CUDA problems (this machine has no GPU)."""
    text = (ROOT / "examples" / "catalog.toml").read_text()
    blocks = text.split("[[problems]]")
    kept = [blocks[0]] + [b for b in blocks[1:] if 'devices = ["cuda"]' not in b]
    path = directory / "host-catalog.toml"
    path.write_text("[[problems]]".join(kept))
    return path


def trivial_catalog(directory: Path, count: int) -> Path:
    rows = ",\n".join(f'  {{ n = {n}, dtype = "float64" }}' for n in range(1, count + 1))
    path = directory / "trivial.toml"
    path.write_text(f"[policy]\nsamples = 3\nwarmups = 1\nbudget = 1.0\n\n[[problems]]\n"
                    f'operation = "bench_trivial"\nworkloads = [\n{rows}\n]\n')
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trivial", type=int, default=300, help="problems in the trivial catalog")
    parser.add_argument("--lookups", type=int, default=5000, help="fleet lookups timed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp) / "redis") as redis:
        directory = Path(tmp)
        env = farm_env({"FARM_PREFIX": "bench", "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), farm_env()["PYTHONPATH"]])})
        settings = Settings.from_env(env, broker_url=redis.url(0), redis_url=redis.url(1))
        worker = start_worker("cpu:0", redis.url(0), redis.url(1), directory, env, kernels=("bench_ops",))
        try:
            wait_worker_ready(worker, redis.client(1), settings.prefix)
            from farm_cli import celery_parts

            parts = celery_parts(settings)
            quiet = __import__("rich.console").console.Console(file=open(os.devnull, "w"))  # noqa: SIM115
            parts = replace(parts, observer=ConsoleObserver(quiet))
            fleet, dispatcher = parts.fleet, parts.dispatcher

            # (a) efficiency on the example catalog
            catalog = load_catalog(host_catalog(directory))
            a = tune(catalog, parts, settings)
            efficiency = a.trial_seconds / (a.wall_seconds * 1)

            # (b) decisions/s on trivial candidates vs raw no-op tasks/s
            trivial = load_catalog(trivial_catalog(directory, args.trivial), ("bench_ops",))
            b = tune(trivial, parts, settings)
            decisions_per_s = b.published / b.wall_seconds
            app = dispatcher.app
            queue = fleet.queue(fleet.targets()[0])
            start = time.perf_counter()
            handles = [app.send_task("farm.ping", queue=queue) for _ in range(args.trivial)]
            for h in handles:
                h.get(timeout=120)
            noop_per_s = args.trivial / (time.perf_counter() - start)

            # (c) fleet lookup vs raw GET
            client = redis.client(1)
            store = RedisDecisions(client=client, settings=settings)
            fp = fleet.targets()[0].fingerprint
            keys = []
            for i in range(1000):
                key = CacheKey("operator", f"op{i}", fp, f"workload {i}", "ctx", 0, CANDIDATES,
                               AccuracyKey.of(StackPolicy())).encode()
                meta = {"run": "bench", "operation": f"op{i}", "spec": {"n": i}}
                store.publish(DecisionRecord(key, 1, 0, "candidate", True, 0.8, time.time(), meta), fp)
                raw = client.hget(settings.decisions_key(store._digest(key)), field_for(key))
                client.set(f"raw:{i}", raw)
                keys.append(key)
            for key in keys:
                store.get_in(fp, key)
            fleet_ns, raw_ns = [], []
            for n in range(args.lookups):
                key = keys[n % len(keys)]
                t0 = time.perf_counter_ns()
                store.get_in(fp, key)  # as the runtime's fleet tier asks: it holds the environment
                t1 = time.perf_counter_ns()
                client.get(f"raw:{n % len(keys)}")
                t2 = time.perf_counter_ns()
                fleet_ns.append(t1 - t0)
                raw_ns.append(t2 - t1)
            fleet_p50, raw_p50 = statistics.median(fleet_ns) / 1e3, statistics.median(raw_ns) / 1e3
        finally:
            worker.stop()

    print("farm overhead: one redis-server, one farm worker (cpu:0), this machine")
    print(f"{'measure':<58}{'value':>14}{'target':>12}")
    print(f"{'(a) trial time / (wall x devices), example catalog':<58}{efficiency:>14.3f}{'>= 0.9':>12}")
    print(f"{'    problems, group tasks, wall seconds':<58}{f'{a.published}, {a.tasks}, {a.wall_seconds:.1f}':>14}")
    print(f"{'(b) decisions/s, trivial candidates':<58}{decisions_per_s:>14.1f}")
    print(f"{'    raw Celery no-op tasks/s, same broker and worker':<58}{noop_per_s:>14.1f}")
    print(f"{'    ratio':<58}{decisions_per_s / noop_per_s:>13.2f}x{'>= 1.0x':>12}")
    print(f"{'(c) fleet lookup p50 (us), RedisDecisions.get_in':<58}{fleet_p50:>14.1f}")
    print(f"{'    raw redis-py GET p50 (us), same bytes':<58}{raw_p50:>14.1f}")
    print(f"{'    ratio':<58}{fleet_p50 / raw_p50:>13.2f}x{'<= 1.3x':>12}")


if __name__ == "__main__":
    main()
