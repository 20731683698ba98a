"""Fleet scale: cost per decision from 1,000 to 100,000 problems, archives, and a 1,000,000-decision local cache.

(a) embedded farm (`farm tune` without a broker, one cpu device) on a trivial catalog (bench/bench_ops.py) of each
    --sizes problems, each in its own process: decisions/s and the coordinator's peak RSS. Every problem of the
    catalog costs the same (`bench_flat`: 64 elements), so a falling rate is the farm's own cost per decision;
    `--catalog growing` runs `bench_trivial` instead, whose problem n has n elements (the workers' time per
    problem then grows with the catalog: 0.5 ms at n = 1,000, 1.9 ms at n = 95,000 on the reference machine);
(b) the farm with two `farm worker` processes (cpu:0, cpu:1) and a private redis-server for each --farm-sizes:
    decisions/s, coordinator peak RSS and Redis memory per decision;
(c) archives of --archive-decisions synthetic decisions (4 trial rows each): export rate (Redis -> archive), bytes
    per decision, the rate of verification alone (what every import does before it writes), and import rates into a
    fresh Redis, a fresh local cache (the file built aside) and an existing local cache (one WAL transaction),
    verification included; beside the Redis rate, the floor: a fresh Redis storing the same record texts and
    trial rows with nothing else (HSET, 1,000 fields per command, pipelined), more than any import can reach on
    the machine;
(d) a local cache of --cache-decisions decisions: an application's first lookup (the disk tier: LocalStore.get of a
    key not yet in memory; p50 over 1,000 keys) and first and second select() (a memory hit).

A size that does not finish within --timeout seconds is reported as such. Numbers from a shared machine are noisy;
the embedded runs take the machine's cpu:0 device lock, so on a machine where other processes use cpu:0 (another
benchmark's workers) set FARM_LOCK_DIR to a folder of your own, or they wait for it.

    .venv/bin/python bench/scale.py --quick            # a few minutes: 1,000 and 10,000 problems, 20,000 archived,
                                                       # 100,000 cached decisions
    .venv/bin/python bench/scale.py                    # 1,000 / 10,000 / 100,000 problems, 100,000 archived,
                                                       # 1,000,000 cached decisions
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench"), str(ROOT)]


def trivial_catalog(path: Path, count: int, kind: str = "flat") -> Path:
    """``count`` trivial problems: ``flat`` (the same cost each) or ``growing`` (problem n has n elements)."""
    if kind == "flat":
        operation, rows = "bench_flat", ",\n".join(f'  {{ index = {i}, dtype = "float64" }}' for i in range(count))
    else:
        operation, rows = "bench_trivial", ",\n".join(f'  {{ n = {n}, dtype = "float64" }}' for n in range(1, count + 1))
    path.write_text(f"[policy]\nsamples = 3\nwarmups = 1\nbudget = 1.0\n\n[[problems]]\n"
                    f'operation = "{operation}"\nworkloads = [\n{rows}\n]\n')
    return path


def child(mode: str, catalog: Path, target: str) -> None:
    """Run one coordinator in this process; print its figures as one JSON line."""
    import io

    from rich.console import Console

    from farm_cli import celery_parts, embedded_parts
    from farm_coordinator.catalog import load_catalog
    from farm_coordinator.run import tune
    from farm_coordinator.runview import ConsoleObserver
    from farm_fleet.settings import Settings

    cat = load_catalog(catalog, ("bench_ops",))
    if mode == "embedded":
        settings = Settings.from_env()
        parts = embedded_parts(settings, ("cpu:0",), Path(target), ("bench_ops",))
    else:
        broker, redis_url = target.split(" ")
        settings = Settings.from_env(broker_url=broker, redis_url=redis_url)
        parts = celery_parts(settings)
    summary = tune(cat, replace(parts, observer=ConsoleObserver(Console(file=io.StringIO()))), settings)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"published": summary.published, "wall": summary.wall_seconds, "rss_mb": rss}))


def run_child(mode: str, catalog: Path, target: str, env: dict[str, str], timeout: float) -> dict[str, float] | None:
    try:
        done = subprocess.run([sys.executable, __file__, "--child", mode, str(catalog), target], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        raise SystemExit(f"bench/scale.py: the {mode} run failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def farm_runs(sizes: list[int], farm_sizes: list[int], timeout: float, directory: Path,
              kind: str = "flat") -> Iterator[str]:
    from servers import farm_env, redis_server, start_worker, wait_worker_ready

    env = farm_env({"FARM_PREFIX": "bench", "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"),
                                                                         farm_env()["PYTHONPATH"]])})
    rates: dict[str, float] = {}
    for n in sizes:
        catalog = trivial_catalog(directory / f"trivial-{n}.toml", n, kind)
        figures = run_child("embedded", catalog, str(directory / f"cache-{n}"), env, timeout)
        if figures is None:
            yield f"  embedded, {n:>7,} problems: did not finish within {timeout:.0f} s"
            continue
        rate = figures["published"] / figures["wall"]
        rates.setdefault("embedded", rate)
        yield (f"  embedded, {n:>7,} problems: {rate:8,.0f} decisions/s ({figures['wall']:.1f} s, "
               f"{rate / rates['embedded']:.2f}x the smallest), coordinator peak RSS {figures['rss_mb']:.0f} MB")
    if not farm_sizes:
        return
    with redis_server(directory / "redis") as redis:
        settings_env = {**env}
        workers = [start_worker(device, redis.url(0), redis.url(1), directory, settings_env, kernels=("bench_ops",))
                   for device in ("cpu:0", "cpu:1")]
        try:
            for w in workers:
                wait_worker_ready(w, redis.client(1), "bench")
            for n in farm_sizes:
                catalog = trivial_catalog(directory / f"farm-{n}.toml", n, kind)
                before = redis.client(1).info("memory")["used_memory"]
                figures = run_child("farm", catalog, f"{redis.url(0)} {redis.url(1)}", env, timeout)
                if figures is None:
                    yield f"  farm (2 workers), {n:>7,} problems: did not finish within {timeout:.0f} s"
                    continue
                used = redis.client(1).info("memory")["used_memory"] - before
                rate = figures["published"] / figures["wall"]
                rates.setdefault("farm", rate)
                yield (f"  farm (2 workers), {n:>7,} problems: {rate:8,.0f} decisions/s ({figures['wall']:.1f} s, "
                       f"{rate / rates['farm']:.2f}x the smallest), coordinator peak RSS "
                       f"{figures['rss_mb']:.0f} MB, Redis {used / max(figures['published'], 1):,.0f} "
                       f"bytes/decision")
        finally:
            for w in workers:
                w.stop()


def archive_runs(n: int, directory: Path) -> list[str]:
    from archive import signing, synthetic
    from servers import redis_server

    import farm
    from farm.environment import runtime_environment
    from farm.stores.base import Publication
    from farm.stores.local import LocalStore
    from farm.stores.redis import RedisDecisions
    from farm_archives.operations import export_redis, import_cache, import_redis, load_archives
    from farm_fleet.settings import Settings

    fingerprint = runtime_environment(farm.HostClient(0)).fingerprint
    now = time.time()
    lines = []
    with redis_server(directory / "archive-redis") as server:
        settings = Settings(prefix="bench")
        source = RedisDecisions(client=server.client(1), settings=settings)
        source.publish_many(Publication(r, fingerprint, pid, tuple(rows))
                            for r, pid, rows in (synthetic(i, fingerprint, now, 4) for i in range(n)))
        t = time.perf_counter()
        exported = export_redis(source, directory / "archives", signer=signing(directory / "keys"))
        export_s = time.perf_counter() - t
        written = exported[0].written
        lines.append(f"  export Redis -> archive: {n / export_s:8,.0f} decisions/s; archive "
                     f"{written.bytes / n:.1f} bytes/decision ({written.trials:,} trial rows)")
        t = time.perf_counter()
        load_archives(directory / "archives")
        verify_s = time.perf_counter() - t
        lines.append(f"  verify (read + every check, nothing written): {n / verify_s:8,.0f} decisions/s")
        t = time.perf_counter()
        result = import_redis(load_archives(directory / "archives"),
                              RedisDecisions(client=server.client(2), settings=settings))
        redis_s = time.perf_counter() - t
        assert result[0].new == n, result
        with redis_server(directory / "floor-redis") as fresh:
            floor_s = redis_floor(load_archives(directory / "archives")[0], fresh.client(0))
        t = time.perf_counter()
        result = import_cache(load_archives(directory / "archives"), directory / "imported-cache", fingerprint)
        cache_s = time.perf_counter() - t
        assert result[0].new == n, result
        existing = directory / "existing-cache"
        LocalStore(existing, 10).put(synthetic(n, fingerprint, now, 0)[0])  # an application's record
        t = time.perf_counter()
        result = import_cache(load_archives(directory / "archives"), existing, fingerprint)
        existing_s = time.perf_counter() - t
        assert result[0].new == n, result
    lines.append(f"  import archive -> fresh Redis: {n / redis_s:8,.0f} decisions/s (verification included)")
    lines.append(f"    floor: Redis storing the same records and trial rows, nothing else: {n / floor_s:8,.0f} "
                 f"decisions/s")
    lines.append(f"  import archive -> fresh local cache: {n / cache_s:8,.0f} decisions/s (verification included; "
                 f"the file built aside)")
    lines.append(f"  import archive -> existing local cache: {n / existing_s:8,.0f} decisions/s (verification "
                 f"included; one WAL transaction)")
    return lines


def redis_floor(archive, client) -> float:
    """Seconds a fresh Redis database takes to store an archive's record texts and trial rows alone: HSET of
    1,000 fields per command, pipelined, sent as ready-made bytes (no judging, events, problem index or checks).
    No import that stores those bytes can be faster on this machine."""
    def bulk(value: bytes) -> bytes:
        return b"$%d\r\n%s\r\n" % (len(value), value)

    rows = archive.rows
    fields = [bulk(d.hex().encode()) for d in rows.digests]
    commands = []
    for name, values in ((b"floor:decisions", list(rows.texts)), (b"floor:trials", list(rows.trials))):
        for at in range(0, len(fields), 1000):
            part = values[at : at + 1000]
            commands.append(b"*%d\r\n" % (2 + 2 * len(part)) + bulk(b"HSET") + bulk(name) + b"".join(
                f + bulk(v.encode()) for f, v in zip(fields[at : at + 1000], part, strict=False)))
    from farm.stores.redis import connection

    conn = connection(client.connection_pool, "HSET")
    try:
        t = time.perf_counter()
        for command in commands:
            conn.send_packed_command([command])
        for _ in commands:
            conn.read_response()
        return time.perf_counter() - t
    finally:
        client.connection_pool.release(conn)


def cache_runs(n: int, directory: Path) -> list[str]:
    import numpy as np

    import farm
    from farm.adapter import RuntimeTrials, prepare
    from farm.environment import runtime_environment
    from farm.identity import Candidate, Problem, Scope, cache_key
    from farm.stores.base import DecisionRecord, Publication
    from farm.stores.local import FARM, STORE_FILE, LocalStore

    client = farm.HostClient(0)
    fingerprint = runtime_environment(client).fingerprint
    policy = farm.StackPolicy()
    candidates = [Candidate(c) for c in ("reference", "vectorized", "blocked")]
    now = time.time()
    cache = directory / "big-cache"
    t = time.perf_counter()
    keys = []

    def records(count: int):
        for i in range(count):
            problem = Problem(Scope.OPERATOR, f"op{i % 50}", fingerprint, f"float32[{i}]:C", persistent=True)
            key = cache_key(problem, candidates, 0, policy)
            if i % max(count // 1000, 1) == 0:
                keys.append(key)
            yield Publication(DecisionRecord(key, 1 + i % 2, 0, candidates[1 + i % 2].name, True, 0.5, now - 60),
                              fingerprint)

    store = LocalStore(cache, owner=FARM)
    gen = records(n)
    while True:
        batch = [p for _, p in zip(range(50_000), gen, strict=False)]
        if not batch:
            break
        store.publish_many(batch)
    tunable = farm.TunableSet("bench_scale_trivial", signature=farm.array_signature)

    @tunable.reference
    def reference(x):
        return x * 2.0

    @tunable.candidate(group=0)
    def doubled(x):
        return x + x

    x = np.ones(1024)
    prepared = prepare(farm.StackTuner(policy), tunable.name, "cpu", client, tunable, (x,))
    store.publish(DecisionRecord(prepared.request.key, 1, 0, tunable[prepared.indices[1]].name, True, 0.5, now - 60),
                  fingerprint)
    store.close()
    build_s = time.perf_counter() - t
    size = (cache / STORE_FILE).stat().st_size

    app = LocalStore(cache, policy.capacity, policy.ttl)
    t = time.perf_counter_ns()
    app.get(keys[0])
    open_us = (time.perf_counter_ns() - t) / 1e3
    random.shuffle(keys)
    first = []
    for key in keys[1:]:
        t = time.perf_counter_ns()
        assert app.get(key) is not None
        first.append((time.perf_counter_ns() - t) / 1e3)
    tuner = farm.StackTuner(policy, cache_directory=cache)
    request = prepare(tuner, tunable.name, "cpu", client, tunable, (x,))
    runner = RuntimeTrials(client, tunable, (x,), request.indices, policy.timing)
    t = time.perf_counter_ns()
    decision = tuner.select_request(request.request, runner)
    select_first = (time.perf_counter_ns() - t) / 1e3
    assert decision.source is farm.DecisionSource.DISK_CACHE, decision
    seconds = []
    for _ in range(1000):
        t = time.perf_counter_ns()
        again = tuner.select_request(request.request, runner)
        seconds.append((time.perf_counter_ns() - t) / 1e3)
    assert again.source is farm.DecisionSource.MEMORY_CACHE
    return [
        f"  local cache of {n + 1:,} decisions: built in {build_s:.1f} s ({n / build_s:,.0f} decisions/s), "
        f"{size / (n + 1):.0f} bytes/decision on disk",
        f"  application's first lookup (LocalStore.get, key not in memory): p50 {statistics.median(first):.1f} us "
        f"(p99 {sorted(first)[int(len(first) * 0.99)]:.1f} us, {len(first)} keys; opening the file: {open_us:.0f} us)",
        f"  first select() (disk hit + one validation trial): {select_first:.0f} us; second select() (memory hit): "
        f"p50 {statistics.median(seconds):.1f} us",
    ]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes: a run of a few minutes")
    parser.add_argument("--sizes", help="embedded catalog sizes, comma-separated (default 1000,10000,100000)")
    parser.add_argument("--farm-sizes", help="farm catalog sizes with two workers (default 1000,10000; '' for none)")
    parser.add_argument("--archive-decisions", type=int, help="decisions archived (default 100000; 0: skip)")
    parser.add_argument("--cache-decisions", type=int, help="decisions in the local cache (default 1000000; 0: skip)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per catalog run")
    parser.add_argument("--catalog", choices=("flat", "growing"), default="flat",
                        help="(a, b): problems of one cost (flat) or problem n with n elements (growing)")
    args = parser.parse_args()

    def sizes(text: str | None, default: str) -> list[int]:
        text = default if text is None else text
        return [int(s) for s in text.split(",") if s.strip()]

    quick = args.quick
    embedded = sizes(args.sizes, "1000,10000" if quick else "1000,10000,100000")
    farm_sizes = sizes(args.farm_sizes, "1000" if quick else "1000,10000")
    archived = args.archive_decisions if args.archive_decisions is not None else 20_000 if quick else 100_000
    cached = args.cache_decisions if args.cache_decisions is not None else 100_000 if quick else 1_000_000
    print(f"scale benchmark on {os.cpu_count()} cores (shared machine: numbers are noisy)")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for title, wanted, lines in (
            ("(a, b) catalogs of trivial problems", embedded or farm_sizes,
             lambda: farm_runs(embedded, farm_sizes, args.timeout, directory, args.catalog)),
            (f"(c) archives of {archived:,} decisions", archived, lambda: archive_runs(archived, directory)),
            (f"(d) a local cache of {cached:,} decisions", cached, lambda: cache_runs(cached, directory)),
        ):
            if not wanted:
                continue
            print(title, flush=True)
            for line in lines():
                print(line, flush=True)


if __name__ == "__main__":
    main()
