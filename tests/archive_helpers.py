"""What the archive tests share: fingerprints, keys and records, a fleet in Redis, hand-made
archives and their edits, and the CLI."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from servers import farm_env

import farm
import farm_archives
from farm.environment import fingerprint_digest, runtime_environment
from farm.identity import Candidate, Problem, Scope, cache_key, fields, key_environment, split_fields
from farm.stores import archive as arc
from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore
from farm.stores.redis import RedisDecisions
from farm_fleet.settings import Settings

FP_A = fields(["host-numpy", "cpu", "model A", "driver 1", "cpython", "build 1", "", "opts"])
FP_B = fields(["host-numpy", "cpu", "model B", "driver 1", "cpython", "build 1", "", "opts"])
POLICY = farm.StackPolicy()
NAMES = ("ref", "fast", "other")
PREFIX = "t"


def key_for(fingerprint: str, workload: str, operation: str = "scale", names: tuple[str, ...] = NAMES) -> str:
    problem = Problem(Scope.OPERATOR, operation, fingerprint, workload, persistent=True)
    return cache_key(problem, [Candidate(n) for n in names], 0, POLICY)


def make_record(key: str, winner: int = 1, *, verified: bool = True, created: float = 1000.0, ratio: float = 0.5,
                run: str = "run-1", names: tuple[str, ...] = NAMES, **meta: object) -> DecisionRecord:
    workload = split_fields(key)[4]
    body = {"run": run, "problem_id": f"pid-{hashlib.sha256(key.encode()).hexdigest()[:8]}",
            "operation": split_fields(key)[2], "device_kind": "cpu", "spec": {"workload": workload, "n": 4},
            "fingerprint": fingerprint_digest(key_environment(key)), "reference": names[0], "relative_mad": 0.01,
            "samples": 5, "accuracy_key": POLICY.accuracy_key(), "farm_version": "0.1.0", "confirmation": None,
            **meta}
    return DecisionRecord(key, winner, 0, names[winner], verified, ratio if winner else 1.0, created, body)


def make_trials(record: DecisionRecord, n: int = 3) -> list[dict[str, object]]:
    rows = []
    for i in range(n):
        rows.append({"run": record.meta.get("run"), "problem_id": record.meta.get("problem_id"), "group": "0",
                     "role": "candidate", "candidate": record.name, "candidate_index": record.index,
                     "verdict": "passed", "note": "", "pair": i, "reference_seconds": 0.002 + i * 1e-4,
                     "candidate_seconds": 0.001 + i * 1e-5, "max_abs_error": 0.0, "max_rel_error": None,
                     "host": "host-1", "device": "cpu:0", "worker": "local-cpu0", "attempt": 1})
    rows.append({**rows[0], "role": "reference", "candidate": "ref", "candidate_index": 0, "verdict": "reference",
                 "pair": 0, "candidate_seconds": None})
    return rows


def entry(key: str, **kw: object) -> arc.ArchiveEntry:
    record = make_record(key, **kw)  # type: ignore[arg-type]
    return arc.ArchiveEntry(record, str(record.meta["problem_id"]), tuple(make_trials(record)))


@pytest.fixture(name="store")
def store_fixture(redis_db):
    """A RedisDecisions store on the private redis-server (tests import it under its fixture name, ``store``)."""
    return RedisDecisions(client=redis_db, settings=Settings(prefix=PREFIX))


def publish_fleet(store: RedisDecisions) -> list[DecisionRecord]:
    """Five decisions over two fingerprints, with trial rows and problem ids; one without either."""
    records = []
    for fp, workloads in ((FP_A, ("n=1", "n=2", "n=3")), (FP_B, ("n=1", "n=9"))):
        for i, w in enumerate(workloads):
            r = make_record(key_for(fp, w), winner=1 + i % 2, verified=i != 1, created=1000.0 + i)
            if w == "n=3":
                store.publish(r, fp)
            else:
                store.publish(r, fp, str(r.meta["problem_id"]), make_trials(r))
            records.append(r)
    return records


def redis_state(client) -> dict[str, object]:
    """Every key of the database with its content (hashes; streams as their entries' fields)."""
    state: dict[str, object] = {}
    for key in sorted(client.keys("*")):
        kind = client.type(key)
        if kind == "hash":
            value = client.hgetall(key)
            if ":trials:" in key:
                value = {k: json.loads(v) for k, v in value.items()}
            state[key] = value
        elif kind == "stream":
            state[key] = [fields_ for _, fields_ in client.xrange(key)]
        else:
            state[key] = (kind, client.dump(key))
    return state


def tree(directory: Path) -> dict[str, bytes]:
    if not directory.exists():
        return {}
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def cache_state(cache: Path) -> list[tuple[object, ...]]:
    """Every row of a local cache (records, problem ids, trial rows) and its fingerprints."""
    local = LocalStore(cache)
    state = sorted(row for batch in local.scan() for row in batch)
    fingerprints = sorted(local.fingerprints().items())
    local.close()
    return [*state, *fingerprints]


def reseal(folder: Path) -> None:
    """Recompute the manifest's checksums, byte and row counts after a hand edit (so deeper checks are reached)."""
    manifest = json.loads((folder / arc.MANIFEST_FILE).read_text())
    for name in arc.DATA_FILES:
        data = (folder / name).read_bytes()
        manifest["sha256"][name] = hashlib.sha256(data).hexdigest()
        manifest["bytes"][name] = len(data)
    manifest["rows"] = {"decisions": pq.read_metadata(folder / arc.DECISIONS_FILE).num_rows,
                        "trials": pq.read_metadata(folder / arc.TRIALS_FILE).num_rows}
    (folder / arc.MANIFEST_FILE).write_text(json.dumps(manifest))


def edit_rows(folder: Path, name: str, change) -> None:
    table = pq.read_table(folder / name)
    rows = change(table.to_pylist())
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), folder / name)
    reseal(folder)


def edit_manifest(folder: Path, change) -> None:
    manifest = json.loads((folder / arc.MANIFEST_FILE).read_text())
    change(manifest)
    (folder / arc.MANIFEST_FILE).write_text(json.dumps(manifest))


def hand_archive(parent: Path, fingerprint: str, entries: list[arc.ArchiveEntry]) -> Path:
    return farm_archives.write_archive(parent, fingerprint, entries).path


def farm_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", "archive", *args], capture_output=True, text=True,
                          env=farm_env({"FARM_PREFIX": PREFIX}), cwd=cwd, timeout=120)


def scale_operation():
    from farm_kernels import registry

    registry.ensure_loaded(("farm_testops",))
    return registry.get("farmtest_scale")


def publish_runtime_decision(store: RedisDecisions, fingerprint: str | None = None) -> DecisionRecord:
    """The decision a fresh runtime on cpu:0 looks up for farmtest_scale, n=64, under ``fingerprint``'s key."""
    from farm.adapter import prepare

    op = scale_operation()
    client = farm.HostClient(0)
    env = runtime_environment(client)
    assert env.persistent
    inputs = op.build({"n": 64, "dtype": "float64"}, client)
    prepared = prepare(farm.StackTuner(POLICY), op.name, "cpu", client, op.host, inputs)
    key = prepared.request.key
    if fingerprint is not None:
        parts = split_fields(key)
        parts[3] = fingerprint
        key = fields(parts)
    names = tuple(c.name for c in prepared.request.candidates)
    record = DecisionRecord(key, names.index("vectorized"), 0, "vectorized", True, 0.2, time.time() - 60,
                            {"run": "r1", "operation": op.name, "problem_id": "p-runtime"})
    store.publish(record, key_environment(key), "p-runtime")
    return record


def row_key(row: dict[str, object], fingerprint: str) -> str:
    """The cache key a schema 2 row stands for."""
    return fields([row["key_version"], row["scope"], row["operation_key"], fingerprint, row["workload"],
                   row["execution_context"], str(row["reference_index"]), row["manifest"], row["accuracy_key"]])


def resealed_row(row: dict[str, object], fingerprint: str = FP_A) -> dict[str, object]:
    """The row with a checksum and key hash recomputed from its columns (an edit a reader must still refuse)."""
    key = row_key(row, fingerprint)
    body = arc.record_body(key, row["created"], row["winner_index"], row["meta_json"], row["winner"], row["ratio"],
                           row["reference_index"], row["verified"])
    digest = hashlib.sha256(key.encode()).digest()
    return {**row, "checksum": hashlib.sha256(body.encode()).digest(),
            "key_hash": int.from_bytes(digest[:8], "big", signed=True)}
