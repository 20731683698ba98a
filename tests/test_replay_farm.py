"""The farm's main job on recordings: `farm worker --device replay:PATH` serves a Kernel Tuner cache file as its
device, a catalog names recorded spaces as problems, and `farm tune` publishes one decision per recording's
fingerprint, then `farm archive export` writes one archive per fingerprint (real processes, private redis-server)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from farm_helpers import fleet
from servers import farm_env

from farm.errors import ConfigError
from farm.replay import load
from farm_coordinator.catalog import load_catalog
from farm_coordinator.plan import Target, expand
from farm_coordinator.precompile import precompile
from farm_kernels import recorded

PARAMS = {"block_size_x": [16, 32, 64, 128], "block_size_y": [1, 2, 4, 8], "unroll": [0, 1]}
COMPILE_FAILED = "kernel[block_size_x=128,block_size_y=8,unroll=1]"
RUNTIME_FAILED = "kernel[block_size_x=128,block_size_y=8,unroll=0]"
# Both failures are recorded as the fastest configs would be: a search that let a failure win would pick them.
FAILED = {(128, 8, 1): "CompilationFailedConfig", (128, 8, 0): "RuntimeFailedConfig", (16, 1, 1): "InvalidConfig"}
POLICY = "[policy]\nsamples = 5\nwarmups = 1\nbudget = 2.0\n\n"


def write_recording(path: Path, device: str, best: tuple[int, int, int], seed: int) -> Path:
    """A Kernel Tuner cache file of 32 configs (one invalid, one compile and one runtime failure) whose fastest
    valid config is ``best``."""
    rng = random.Random(seed)
    cache = {}
    for bx in PARAMS["block_size_x"]:
        for by in PARAMS["block_size_y"]:
            for unroll in PARAMS["unroll"]:
                key = (bx, by, unroll)
                entry: dict[str, object] = {"block_size_x": bx, "block_size_y": by, "unroll": unroll,
                                            "compile_time": 200.0 + 100 * rng.random()}
                if key in FAILED:
                    entry["time"] = FAILED[key]
                else:
                    base = 0.5 if key == best else 1.0 + 0.1 * (bx // 16 + by + unroll)
                    times = [base * (1 + 0.01 * rng.random()) for _ in range(7)]
                    entry.update(time=sum(times) / len(times), times=times)
                cache[",".join(map(str, key))] = entry
    path.write_text(json.dumps({"device_name": device, "kernel_name": "vector_add", "problem_size": [4096],
                                "tune_params_keys": list(PARAMS), "tune_params": PARAMS, "cache": cache}))
    return path


@pytest.fixture
def recordings(tmp_path):
    folder = tmp_path / "recordings"
    folder.mkdir()
    a = write_recording(folder / "vector_add_A.json", "GPU A", (64, 4, 0), 1)
    b = write_recording(folder / "vector_add_B.json", "GPU B", (32, 2, 1), 2)
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(POLICY + '[[problems]]\nrecording = "recordings/vector_add_A.json"\n\n'
                                '[[problems]]\nrecording = "recordings/vector_add_B.json"\n')
    return a, b, catalog


def farm(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


@pytest.mark.servers
def test_two_replay_workers_of_two_recordings_publish_one_decision_per_fingerprint(redis_srv, recordings, tmp_path):
    a, b, catalog = recordings
    expected = {recorded.fingerprint_of(load(a)): "kernel[block_size_x=64,block_size_y=4,unroll=0]",
                recorded.fingerprint_of(load(b)): "kernel[block_size_x=32,block_size_y=2,unroll=1]"}
    # The workers run in the recordings' folder: a device path relative to it keeps the log names flat.
    with fleet(redis_srv, a.parent, (f"replay:{a.name}", f"replay:{b.name}#1")) as f:
        args = ("--broker", f.broker, "--redis", f.results_url)
        env = {**f.env, "FARM_KERNEL_CACHE": str(tmp_path / "kcache"), "COLUMNS": "400"}
        done = farm("tune", str(catalog), "--json", *args, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        # The compile stage's note per recording: its recorded compile time, its compile failure never sent.
        staged = " ".join(done.stderr.split()).count("of recorded compile time, charged to the compile stage; "
                                                     "1 failed (never sent)")
        assert staged == 2, done.stderr
        decisions = json.loads(done.stdout)["decisions"]
        exported = farm("archive", "export", "--redis", f.results_url, "--out", str(tmp_path / "archives"),
                        env=env, cwd=tmp_path)
    assert sorted(d["fingerprint"] for d in decisions) == sorted(expected)  # one decision per fingerprint
    for decision in decisions:
        record = decision["record"]
        assert record["name"] == expected[decision["fingerprint"]]  # each SKU's own recorded optimum
        notes = {c["name"]: c["note"] for c in record["meta"]["candidates"]}
        assert notes[COMPILE_FAILED] == "rejected: failed: compile failed as recorded (CompilationFailedConfig)"
        assert "RuntimeFailedConfig" in notes[RUNTIME_FAILED]
    assert exported.returncode == 0, exported.stderr
    assert sorted(p.name for p in (tmp_path / "archives").iterdir()) == sorted(expected)  # one archive per SKU


def test_a_bad_replay_device_is_one_line_naming_the_file_before_any_server(tmp_path):
    missing = tmp_path / "nope.json"
    (tmp_path / "bad.json").write_text("{not json")
    for path, why in ((missing, "cannot be read"), (tmp_path / "bad.json", "is not a JSON document")):
        done = farm("worker", "--device", f"replay:{path}", "--broker", "redis://127.0.0.1:1/0", "--redis",
                    "redis://127.0.0.1:1/1", env=farm_env(), cwd=tmp_path)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith(f"farm: error: --device: field 'device' = 'replay:{path}': not a usable "
                                   f"recording: {path}"), lines[0]
        assert why in lines[0]


def test_a_recorded_problem_is_planned_only_on_its_recordings_fingerprint(recordings):
    a, b, catalog = recordings
    loaded = load_catalog(catalog)
    digests = [recorded.fingerprint_of(load(p)) for p in (a, b)]
    targets = [Target(d, d, recorded.KIND, ("w",)) for d in digests] + [Target("c" * 16, "cpu", "cpu", ("w",))]
    problems = expand(loaded, targets, "run")
    assert [(p.target.digest, p.workload.operation) for p in problems] == [
        (digests[0], recorded.operation_name(load(a))), (digests[1], recorded.operation_name(load(b)))]
    stage = precompile(loaded, targets, compiler=lambda jobs: pytest.fail("no CUDA target: nothing to compile"))
    # The recorded compile time is the compile stage's; the recorded compile failure is never sent.
    assert stage.compile_seconds[digests[0]] == pytest.approx(sum(c.compile_seconds for c in load(a).configs.values()))
    assert stage.rejected[digests[0]] == {recorded.operation_name(load(a)): {
        COMPILE_FAILED: "failed: compile failed as recorded (CompilationFailedConfig)"}}


@pytest.mark.parametrize(("problem", "field", "why"), [
    ('recording = "../outside.json"', "problems[0].recording", "lies outside"),
    ('recording = "recordings/missing.json"', "problems[0].recording", "cannot be read"),
    ('recording = "recordings/vector_add_A.json"\noperation = "matmul"', "problems[0].operation",
     "a recorded problem has only ['recording', 'weight']"),
])
def test_a_catalog_refuses_a_recording_it_cannot_use_naming_the_field(recordings, tmp_path, problem, field, why):
    write_recording(tmp_path / "outside.json", "GPU C", (64, 4, 0), 3)
    catalog = tmp_path / "bad.toml"
    catalog.write_text(f"[[problems]]\n{problem}\n")
    with pytest.raises(ConfigError) as e:
        load_catalog(catalog)
    assert e.value.source == str(catalog) and e.value.field == field and why in str(e.value)


def test_a_catalog_naming_one_recording_twice_is_refused(recordings, tmp_path):
    catalog = tmp_path / "twice.toml"
    catalog.write_text('[[problems]]\nrecording = "recordings/vector_add_A.json"\n\n'
                       '[[problems]]\nrecording = "./recordings/vector_add_A.json"\n')
    with pytest.raises(ConfigError, match=r"problems\[1\]\.recording.*duplicates problems\[0\]"):
        load_catalog(catalog)


def test_a_worker_runs_only_its_own_recording(recordings):
    a, b, _ = recordings
    client = recorded.load_device(f"replay:{a}#2")
    assert (client.index, client.seed) == (2, 2)
    mine = load(a)
    assert recorded.own(client, recorded.operation_name(mine), recorded.spec_of(mine)).digest == mine.digest
    other = load(b)
    with pytest.raises(LookupError, match="reached the worker of"):
        recorded.own(client, recorded.operation_name(other), recorded.spec_of(other))


def test_a_recording_no_worker_serves_is_named_in_a_note(recordings):
    from farm_cli.summary import not_tuned

    a, _, catalog = recordings
    loaded = load_catalog(catalog)
    (line,) = not_tuned(loaded, {recorded.KIND}, {recorded.fingerprint_of(load(a))})
    assert line.startswith(f"problems[1] of {catalog} not tuned: no worker serves its recording "
                           "'recordings/vector_add_B.json'")
