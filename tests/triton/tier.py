"""Helpers of the Triton tier: the embedded farm and the application, each in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
# Lenient on noise: other builds share these cores, and the fast configs win by 10x or more.
POLICY = """
[policy]
samples = 5
max_relative_mad = 5.0
"""
# A fleet's workers stop a group task past FARM_VISIBILITY_TIMEOUT (tests: 15 s): a smaller budget per problem
# (not part of the cache key, so the applications' POLICY still matches).
FLEET_POLICY = POLICY + "budget = 3.0\n"
CATALOG = POLICY + """
[[problems]]
operation = "farmtriton_add"
workloads = [{ n = 4096, dtype = "float32" }]
"""


def env(interpret: bool = True) -> dict[str, str]:
    environ = dict(os.environ, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join([str(HERE), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    if interpret:
        environ["TRITON_INTERPRET"] = "1"
    else:
        environ.pop("TRITON_INTERPRET", None)
    return environ


def farm_tune(directory: Path, *extra: str, interpret: bool = True) -> subprocess.CompletedProcess[str]:
    """``farm tune c.toml`` (the embedded farm) into ``directory/cache``."""
    return subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(directory / "c.toml"), "--kernels", "triton_ops",
                           "--cache-dir", str(directory / "cache"), *extra],
                          capture_output=True, text=True, env=env(interpret), cwd=directory, timeout=600)


def app(directory: Path, n: int, *extra: str, interpret: bool = True,
        environ: dict[str, str] | None = None) -> dict[str, object]:
    """tests/triton/app_add.py for ``n`` elements against ``directory/cache``: its JSON line."""
    done = subprocess.run([sys.executable, str(HERE / "app_add.py"), str(directory / "policy.toml"),
                           str(directory / "cache"), str(n), *extra],
                          capture_output=True, text=True, env={**env(interpret), **(environ or {})}, cwd=directory,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def tune_into(directory: Path, *extra: str, interpret: bool = True) -> Path:
    """A farm cache with the embedded farm's decision for n=4096."""
    (directory / "c.toml").write_text(CATALOG)
    (directory / "policy.toml").write_text(POLICY)  # the application's: the farm's policy, no problems
    done = farm_tune(directory, *extra, interpret=interpret)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 decisions published" in done.stdout, done.stdout
    return directory


def records(directory: Path) -> list[DecisionRecord]:
    return [DecisionRecord.from_json(text) for batch in LocalStore(directory / "cache").scan() for text, _, _ in batch]
