"""A real Triton kernel, tuned by the embedded farm under Triton's interpreter, then served to an unmodified
``@triton.autotune`` kernel in another process with no benchmark (tests/triton/app_add.py fails on one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore
from farm_triton import identity

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
# Lenient on noise: two engineers' builds share these cores, and the fast configs win by 10x or more.
POLICY = """
[policy]
samples = 5
max_relative_mad = 5.0
"""
CATALOG = POLICY + """
[[problems]]
operation = "farmtriton_add"
workloads = [{ n = 4096, dtype = "float32" }]
"""


def env() -> dict[str, str]:
    return dict(os.environ, TRITON_INTERPRET="1", PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join([str(HERE), str(TESTS), os.environ.get("PYTHONPATH", "")]))


def farm_tune(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(tmp_path / "c.toml"), "--kernels", "triton_ops",
                           "--cache-dir", str(tmp_path / "cache"), *extra],
                          capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=600)


def app(tmp_path: Path, n: int, *extra: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, str(HERE / "app_add.py"), str(tmp_path / "policy.toml"), str(tmp_path / "cache"),
                           str(n), *extra], capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A farm cache with the embedded farm's decision for n=4096."""
    tmp_path = tmp_path_factory.mktemp("farm")
    (tmp_path / "c.toml").write_text(CATALOG)
    (tmp_path / "policy.toml").write_text(POLICY)  # the application's: the farm's policy, no problems
    done = farm_tune(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 decisions published" in done.stdout
    return tmp_path


def records(tmp_path: Path) -> list[DecisionRecord]:
    return [DecisionRecord.from_json(text) for batch in LocalStore(tmp_path / "cache").scan() for text, _, _ in batch]


def test_the_embedded_farm_tunes_the_triton_kernel_and_a_config_that_cannot_compile_is_a_verdict(tuned: Path) -> None:
    (record,) = records(tuned)
    assert record.name.startswith("config2") or record.name.startswith("config3"), record.name
    notes = {c["name"].split(":")[0]: c["note"] for c in record.meta["candidates"]}
    assert "rejected" in notes["config1"] and "power of 2" in notes["config1"]


def test_an_unmodified_autotuned_kernel_gets_the_farms_config_and_triton_runs_no_benchmark(tuned: Path) -> None:
    from triton_ops import CONFIGS

    (record,) = records(tuned)
    decided = identity.served(int(record.index), CONFIGS)
    result = app(tuned, 4096)
    assert result == {"config": str(decided), "correct": True, "hits": 1, "misses": 0}


def test_a_miss_runs_the_first_config_without_a_benchmark_when_asked(tuned: Path) -> None:
    from triton_ops import CONFIGS

    result = app(tuned, 1000, "--on-miss", "first")  # n=1000 was never tuned
    assert result == {"config": str(CONFIGS[0]), "correct": True, "hits": 0, "misses": 1}
