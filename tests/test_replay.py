"""The replay device (farm.replay): the loader (formats, failures, restrictions, hostile files), the client's
simulated clock, and seeded end-to-end searches on a synthetic recording and on a vendored real one."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

import farm
from farm.environment import runtime_environment
from farm.errors import ConfigError
from farm.trials import TrialVerdict

ROOT = Path(__file__).resolve().parent.parent
A100 = ROOT / "recordings" / "benchmark_hub" / "convolution_A100.json.gz"
DEVICE = farm.Timing.DEVICE


def recording(tmp_path: Path, name: str = "tiny.json", *, gz: bool = False, mutate: Any = None) -> Path:
    """A Kernel Tuner cache file: block x unroll, time = 1 ms * cost, a runtime and a compile failure, one config
    missing (never measured). The optimum is block=64, unroll=2 (0.25 ms)."""
    params = {"block": [16, 32, 64, 128], "unroll": [1, 2, 4]}
    cache: dict[str, Any] = {}
    for b in params["block"]:
        for u in params["unroll"]:
            if (b, u) == (128, 4):
                continue  # not recorded: infeasible
            cost = 0.25 if (b, u) == (64, 2) else 1.0 + abs(b - 64) / 64 + abs(u - 2) / 4
            entry: dict[str, Any] = {"block": b, "unroll": u, "time": cost,
                                     "times": [cost * (1 + 0.002 * i) for i in range(32)], "compile_time": 100.0}
            if (b, u) == (16, 4):
                entry.update(time="RuntimeFailedConfig", times=None)
            if (b, u) == (128, 1):
                entry.update(time="CompilationFailedConfig", times=None, compile_time=50.0)
            if (b, u) == (32, 4):  # recorded faster than everything, but it fails at launch
                entry.update(time="RuntimeFailedConfig")
            cache[f"{b},{u}"] = entry
    document = {"device_name": "Test GPU 9000", "kernel_name": "tiny_kernel", "problem_size": [1024],
                "tune_params_keys": list(params), "tune_params": params, "objective": "time", "cache": cache}
    if mutate is not None:
        mutate(document)
    path = tmp_path / (name + (".gz" if gz else ""))
    data = json.dumps(document).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_a_recording_loads_as_a_tunable_with_a_reference_and_one_space(tmp_path: Path, gz: bool) -> None:
    rec = farm.replay.load(recording(tmp_path, gz=gz))
    assert rec.device_name == "Test GPU 9000"
    assert isinstance(rec.tunable, farm.TunableSet) and [s.name for s in rec.tunable.spaces] == ["kernel"]
    assert rec.best == ("kernel[block=64,unroll=2]", pytest.approx(0.25))
    # The default reference: the first valid config in parameter order (16,1), the untuned default.
    assert rec.reference == {"block": 16, "unroll": 1}
    assert rec.mean_ms("reference") == pytest.approx(rec.mean_ms("kernel[block=16,unroll=1]"))
    assert rec.mean_ms("kernel[block=16,unroll=4]") == float("inf")  # a recorded failure
    with pytest.raises(KeyError):
        rec.mean_ms("kernel[block=128,unroll=4]")  # never recorded


def test_a_missing_config_is_infeasible_and_a_recorded_failure_is_feasible(tmp_path: Path) -> None:
    rec = farm.replay.load(recording(tmp_path))
    roster = rec.tunable.roster()
    eligible = {roster.names[p]: roster[p].eligible for p in range(1, len(roster))}
    assert eligible["kernel[block=128,unroll=4]"] is False
    assert eligible["kernel[block=16,unroll=4]"] is True and eligible["kernel[block=128,unroll=1]"] is True


def test_reference_picks_another_recorded_valid_config(tmp_path: Path) -> None:
    rec = farm.replay.load(recording(tmp_path), reference={"block": 32, "unroll": 1})
    assert rec.reference == {"block": 32, "unroll": 1}
    with pytest.raises(ConfigError, match="reference"):
        farm.replay.load(recording(tmp_path), reference={"block": 16, "unroll": 4})  # a recorded failure
    with pytest.raises(ConfigError, match="reference"):
        farm.replay.load(recording(tmp_path), reference={"block": 16})


def test_the_client_draws_recorded_times_on_a_seeded_simulated_clock(tmp_path: Path) -> None:
    rec = farm.replay.load(recording(tmp_path))
    key = (64, 2)
    a, b = rec.client(seed=3), rec.client(seed=3)
    draws = [a.run(key) for _ in range(20)]
    assert draws == [b.run(key) for _ in range(20)]  # seeded
    assert set(draws) <= set(rec.configs[key].times)  # drawn from the recorded samples
    assert a.device_seconds == pytest.approx(sum(draws)) and a.clock == a.device_seconds
    assert a.compile_seconds == pytest.approx(0.1)  # charged once per config built
    with pytest.raises(farm.replay.ReplayFailure, match="RuntimeFailedConfig"):
        a.run((16, 4))
    with pytest.raises(farm.replay.ReplayFailure, match="CompilationFailedConfig"):
        a.run((128, 1))
    assert a.compile_seconds == pytest.approx(0.1 + 0.1 + 0.05)


def test_a_replay_fingerprint_names_the_recorded_device_the_backend_and_the_content(tmp_path: Path) -> None:
    one = runtime_environment(farm.replay.load(recording(tmp_path)).client())
    other = runtime_environment(farm.replay.load(recording(tmp_path, "other.json",
                                                           mutate=lambda d: d.update(problem_size=[2048]))).client())
    host = runtime_environment(farm.HostClient(0))
    assert "replay" in one.fingerprint and "Test GPU 9000" in one.fingerprint
    assert len({one.fingerprint, other.fingerprint, host.fingerprint}) == 3


@pytest.mark.parametrize("strategy", ["exhaustive", "random", "bayes"])
def test_a_seeded_replay_search_picks_the_optimum_and_counts_its_cost(tmp_path: Path, strategy: str) -> None:
    rec = farm.replay.load(recording(tmp_path))
    results = []
    for _ in range(2):
        client = rec.client(seed=1)
        tuned = farm.tune(rec.tunable, rec.inputs, device=client,
                          policy=farm.StackPolicy(timing=DEVICE, strategy=strategy, seed=1, budget=60.0))
        results.append((tuned.name, client.device_seconds))
        report = tuned.report
        assert report is not None
        assert tuned.name == rec.best[0]  # 10 feasible configs: every strategy sees them all
        assert report.device_seconds == pytest.approx(client.device_seconds) and report.device_seconds > 0
        assert report.compile_seconds == pytest.approx(client.compile_seconds) and report.compile_seconds > 0
        verdicts = {c.name: c.note for c in report.candidates}
        assert verdicts["kernel[block=32,unroll=4]"].startswith("rejected") and "RuntimeFailedConfig" in verdicts["kernel[block=32,unroll=4]"]
        assert "CompilationFailedConfig" in verdicts["kernel[block=128,unroll=1]"]
    assert results[0] == results[1]  # the same seed, the same search


def test_full_screening_spends_more_device_time_for_the_same_pick(tmp_path: Path) -> None:
    rec = farm.replay.load(recording(tmp_path))
    spent = {}
    for screening in ("race", "full"):
        client = rec.client(seed=0)
        tuned = farm.tune(rec.tunable, rec.inputs, device=client,
                          policy=farm.StackPolicy(timing=DEVICE, screening=screening, budget=60.0))
        assert tuned.name == rec.best[0]
        spent[screening] = client.device_seconds
        if screening == "race":
            dropped = [c for c in tuned.report.candidates if c.note.startswith(TrialVerdict.DROPPED.value)]  # type: ignore[union-attr]
            # Most configs go after a pair or two; close ones (the reference's own config, a tie) take more.
            assert 2 * sum(c.samples <= 2 for c in dropped) >= len(dropped)
    assert spent["race"] < spent["full"]


def test_a_vendored_recording_loads_with_its_failures() -> None:
    rec = farm.replay.load(A100)
    assert rec.device_name == "NVIDIA A100-PCIE-40GB" and len(rec.configs) == 4362
    failures = sorted(r.failure for r in rec.configs.values() if r.failure is not None)
    assert failures.count("runtime") == 155 and failures.count("compile") == 6
    assert rec.best[1] == pytest.approx(0.5536, abs=1e-4)


# -- hostile files --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(tune_params=[]), "tune_params"),
        (lambda d: d["tune_params"].update(block=[]), "tune_params.block"),
        (lambda d: d.update(tune_params_keys=["block"]), "tune_params_keys"),
        (lambda d: d.update(cache=[]), "cache"),
        (lambda d: d["cache"]["16,1"].update(block=17), "cache.16,1.block"),
        (lambda d: d["cache"]["16,1"].update(time=-1.0), "cache.16,1.time"),
        (lambda d: d["cache"]["16,1"].update(time="ExplodedConfig"), "cache.16,1.time"),
        (lambda d: d["cache"]["16,1"].update(times=[1.0, float("inf")]), "cache.16,1.times"),
        (lambda d: d["cache"]["16,1"].update(compile_time="slow"), "cache.16,1.compile_time"),
    ],
)
def test_a_malformed_recording_names_the_file_field_and_value(tmp_path: Path, mutate: Any, field: str) -> None:
    path = recording(tmp_path, mutate=mutate)
    with pytest.raises(ConfigError) as e:
        farm.replay.load(path)
    assert e.value.source == str(path) and e.value.field == field


def test_not_json_not_gzip_not_a_file_and_too_large_are_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a JSON document"):
        farm.replay.load(tmp_path / "bad.json")
    (tmp_path / "bad.json.gz").write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(ConfigError, match="gzip"):
        farm.replay.load(tmp_path / "bad.json.gz")
    with pytest.raises(ConfigError, match="not a regular file"):
        farm.replay.load(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ConfigError, match="not a regular file"):
        farm.replay.load(tmp_path / "fifo")
    with pytest.raises(ConfigError, match="cannot be read"):
        farm.replay.load(tmp_path / "missing.json")
    big = recording(tmp_path)
    with pytest.raises(ConfigError, match="larger than"):
        farm.replay.load(big, limit=100)
    # A small gzip file that decompresses past the limit (a zip bomb) is refused without inflating it all.
    (tmp_path / "bomb.json.gz").write_bytes(gzip.compress(b" " * 10_000_000))
    with pytest.raises(ConfigError, match="decompresses to more"):
        farm.replay.load(tmp_path / "bomb.json.gz", limit=1_000_000)


def test_a_path_outside_the_root_is_refused(tmp_path: Path) -> None:
    inside = tmp_path / "catalog"
    inside.mkdir()
    outside = recording(tmp_path)
    with pytest.raises(ConfigError, match="outside"):
        farm.replay.load("../tiny.json", root=inside)
    (inside / "link.json").symlink_to(outside)
    with pytest.raises(ConfigError, match="outside"):
        farm.replay.load("link.json", root=inside)
    (inside / "own.json").write_bytes(outside.read_bytes())
    assert farm.replay.load("own.json", root=inside).device_name == "Test GPU 9000"
