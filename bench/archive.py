"""Parquet archives at scale, against one private redis-server: 100,000 synthetic decisions (with trial rows).

(a) export rate: Redis -> archive (decisions/s), and bytes per decision of the archive (all three files / n);
(b) import rate: archive -> a fresh Redis (RedisDecisions.publish_batch: a thousand decisions per MULTI/EXEC) and -> a
    fresh local cache (a new file built aside and linked into place) (decisions/s, verification included);
(c) the runtime's first-call latency with the whole archive as its fleet tier: ArchiveStore construction + load
    (manifest, sha256, key index), then the first select() that hits one of the archive's keys (one lookup and
    the one validation trial of a trivial kernel), reported separately; and a second select (a memory hit).

    .venv/bin/python bench/archive.py [--decisions 100000] [--trials 4]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from servers import redis_server  # noqa: E402

import farm  # noqa: E402
from farm.adapter import RuntimeTrials, prepare  # noqa: E402
from farm.environment import farm_version, fingerprint_digest, runtime_environment  # noqa: E402
from farm.identity import Candidate, Problem, Scope, cache_key  # noqa: E402
from farm.stores.archive import ArchiveStore  # noqa: E402
from farm.stores.base import DecisionRecord, Publication  # noqa: E402
from farm.stores.redis import RedisDecisions  # noqa: E402
from farm_archives.operations import export_redis, import_cache, import_redis, load_archives  # noqa: E402
from farm_fleet.settings import Settings  # noqa: E402

POLICY = farm.StackPolicy()
CANDIDATES = [Candidate(n) for n in ("reference", "vectorized", "blocked")]
REPEATS = 5


def trivial_set() -> farm.TunableSet:
    tunable = farm.TunableSet("bench_archive_scale", signature=farm.array_signature)

    @tunable.reference
    def reference(x):
        return x * 2.0

    @tunable.candidate(group=0)
    def doubled(x):
        return x + x

    return tunable


def signing(directory: Path) -> Any:
    """A fresh farm key pair in ``directory``: its signing key, and its public key trusted by every archive reader
    of this process (FARM_TRUSTED_KEYS), as a fleet signs and checks archives (signing is part of the cost)."""
    from farm_archives.signing import generate_keys, load_signing_key

    private, public, _ = generate_keys(directory)
    os.environ["FARM_TRUSTED_KEYS"] = str(public)
    return load_signing_key(private)


def synthetic(i: int, fingerprint: str, now: float, trials: int) -> tuple[DecisionRecord, str, list[dict]]:
    op = f"bench_op_{i % 50}"
    spec = {"n": 1024 + i, "dtype": "float32"}
    problem = Problem(Scope.OPERATOR, op, fingerprint, f"float32[{1024 + i}]:C", persistent=True)
    key = cache_key(problem, CANDIDATES, 0, POLICY)
    winner = 1 + i % 2
    pid = f"p{i:07d}"
    meta = {
        "run": "bench-run", "problem_id": pid, "operation": op, "device_kind": "cpu", "spec": spec,
        "fingerprint": fingerprint_digest(fingerprint), "reference": "reference", "relative_mad": 0.02,
        "samples": 5, "accuracy_key": POLICY.accuracy_key(), "farm_version": farm_version(),
        "workers": ["w-cpu0"], "candidates": [
            {"name": c.name, "ratio": 1.0 if c.name == "reference" else 0.5, "relative_mad": 0.02,
             "verified": True, "note": "selected" if k == winner else "slower"} for k, c in enumerate(CANDIDATES)],
        "tuned_by": "w-cpu0", "confirmation": None, "confirmed_by": None, "confirmation_ratio": None,
        "rejected_winner": None,
    }
    record = DecisionRecord(key, winner, 0, CANDIDATES[winner].name, True, 0.5, now - 60, meta)
    base = {"run": "bench-run", "problem_id": pid, "group": "0", "host": "bench-host", "device": "cpu:0",
            "worker": "w-cpu0", "attempt": 1, "max_abs_error": 0.0, "max_rel_error": 0.0}
    rows = [{**base, "role": "reference", "candidate": "reference", "candidate_index": 0, "verdict": "reference",
             "note": "reference sample", "pair": 0, "reference_seconds": 1e-3, "candidate_seconds": None}]
    for p in range(trials - 1):
        rows.append({**base, "role": "candidate", "candidate": record.name, "candidate_index": winner,
                     "verdict": "passed", "note": "", "pair": p, "reference_seconds": 1e-3 + p * 1e-6,
                     "candidate_seconds": 5e-4 + p * 1e-6})
    return record, pid, rows


def publish_all(store: RedisDecisions, items: list[tuple[DecisionRecord, str, list[dict]]], fingerprint: str) -> None:
    """Setup only: the coordinator's publication function, 2,000 calls per transaction."""
    store.publish_many(Publication(record, fingerprint, pid, tuple(rows)) for record, pid, rows in items)


def size_of(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=100_000)
    parser.add_argument("--trials", type=int, default=4, help="trial rows per decision")
    args = parser.parse_args()
    n = args.decisions
    client = farm.HostClient(0)
    env = runtime_environment(client)
    if not env.persistent:
        sys.exit("bench/archive.py: this machine's environment is not persistent; the runtime would never hit")
    fingerprint = env.fingerprint
    tunable = trivial_set()
    x = np.ones(1024)
    figures: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp) / "redis") as server:
        directory = Path(tmp)
        settings = Settings(prefix="bench")
        now = time.time()
        t = time.perf_counter()
        items = [synthetic(i, fingerprint, now, args.trials) for i in range(n - 1)]
        # One decision the runtime will look up: the trivial set's, on this machine.
        prepared = prepare(farm.StackTuner(POLICY), tunable.name, "cpu", client, tunable, (x,))
        real = DecisionRecord(prepared.request.key, 1, 0, tunable[prepared.indices[1]].name, True, 0.5, now - 60,
                              {"run": "bench-run", "operation": tunable.name})
        items.append((real, "p-real", []))
        source = RedisDecisions(client=server.client(1), settings=settings)
        publish_all(source, items, fingerprint)
        setup = time.perf_counter() - t
        del items

        out = directory / "archives"
        t = time.perf_counter()
        exported = export_redis(RedisDecisions(client=server.client(1), settings=settings), out,
                                signer=signing(directory / "keys"))
        export_s = time.perf_counter() - t
        folder = exported[0].written.path
        total_bytes = size_of(folder)
        figures.append(("export Redis -> archive", f"{n / export_s:,.0f} decisions/s ({export_s:.2f} s)"))
        figures.append(("archive size", f"{total_bytes / n:,.1f} bytes/decision ({total_bytes / 2**20:.1f} MiB; "
                                        f"{exported[0].written.trials:,} trial rows)"))
        for name in ("decisions.parquet", "trials.parquet"):
            figures.append((f"  {name}", f"{(folder / name).stat().st_size / n:,.1f} bytes/decision"))

        t = time.perf_counter()
        archives = load_archives(out)
        verify_s = time.perf_counter() - t
        figures.append(("verify (full read of the archive)", f"{n / verify_s:,.0f} decisions/s ({verify_s:.2f} s)"))
        del archives

        target = RedisDecisions(client=server.client(2), settings=settings)
        t = time.perf_counter()
        result = import_redis(load_archives(out), target)
        import_s = time.perf_counter() - t
        assert result[0].new == n, result
        figures.append(("import archive -> fresh Redis", f"{n / import_s:,.0f} decisions/s ({import_s:.2f} s, "
                                                         f"verification included, batches of 1,000)"))

        t = time.perf_counter()
        result = import_cache(load_archives(out), directory / "cache", fingerprint)
        cache_s = time.perf_counter() - t
        assert result[0].new == n, result
        figures.append(("import archive -> fresh local cache", f"{n / cache_s:,.0f} decisions/s ({cache_s:.2f} s, "
                                                               f"verification included; the new file built aside)"))

        # The runtime, REPEATS times from scratch (a fresh ArchiveStore and controller each): medians (max).
        runs: dict[str, list[float]] = {k: [] for k in ("construct", "load", "lookup", "first", "second", "lazy")}
        for _ in range(REPEATS):
            gc.collect()
            t = time.perf_counter()
            store = ArchiveStore(out)
            runs["construct"].append(time.perf_counter() - t)
            t = time.perf_counter()
            assert store.load() == n
            runs["load"].append(time.perf_counter() - t)
            tuner = farm.StackTuner(POLICY, fleet=[store])
            request = prepare(tuner, tunable.name, "cpu", client, tunable, (x,))
            runner = RuntimeTrials(client, tunable, (x,), request.indices, POLICY.timing)
            t = time.perf_counter()
            first = tuner.select_request(request.request, runner)
            runs["first"].append(time.perf_counter() - t)
            t = time.perf_counter()
            second = tuner.select_request(request.request, runner)
            runs["second"].append(time.perf_counter() - t)
            assert first.source is farm.DecisionSource.FLEET_CACHE and tuner.stats().tunes == 0, (first, tuner.stats())
            assert second.source is farm.DecisionSource.MEMORY_CACHE

            cold = ArchiveStore(out)
            cold.load()
            t = time.perf_counter()
            assert cold.get(real.cache_key) == real
            runs["lookup"].append(time.perf_counter() - t)

            lazy = farm.StackTuner(POLICY, fleet=[ArchiveStore(out)])
            request = prepare(lazy, tunable.name, "cpu", client, tunable, (x,))
            runner = RuntimeTrials(client, tunable, (x,), request.indices, POLICY.timing)
            t = time.perf_counter()
            assert lazy.select_request(request.request, runner).source is farm.DecisionSource.FLEET_CACHE
            runs["lazy"].append(time.perf_counter() - t)

        def ms(name: str) -> str:
            return f"{statistics.median(runs[name]) * 1e3:.2f} ms (max {max(runs[name]) * 1e3:.2f})"

        figures.append(("runtime: ArchiveStore(dir) construction", ms("construct")))
        figures.append((f"runtime: load() of the {n:,}-decision archive", f"{ms('load')}: read, sha256, key index"))
        figures.append(("runtime: first select() (fleet hit)", f"{ms('first')}: lookup + one validation trial"))
        figures.append(("  of which the archive lookup", f"{ms('lookup')}: one row group decoded, the record rebuilt "
                                                         f"and verified"))
        figures.append(("runtime: second select() (memory hit)",
                        f"{statistics.median(runs['second']) * 1e6:.1f} us (max {max(runs['second']) * 1e6:.1f})"))
        figures.append(("runtime: first select(), lazy load", f"{ms('lazy')}: load on first lookup + hit"))
    width = max(len(k) for k, _ in figures)
    print(f"archive benchmark: {n:,} decisions, {args.trials} trial rows each (setup {setup:.1f} s; runtime figures: "
          f"median of {REPEATS} fresh starts)")
    for k, v in figures:
        print(f"  {k:<{width}}  {v}")


if __name__ == "__main__":
    main()
