"""A space on the embedded farm: `farm tune` plans every feasible config (exhaustive), the task function
resolves each by its canonical name and calls ``fn(*inputs, **config)``, and the runtime reuses the decision."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from farm_helpers import runtime_select, write_catalog
from servers import farm_env

import farm
from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore

CATALOG = """
[[problems]]
operation = "farmtest_space"
workloads = [{ n = 3000, dtype = "float64" }]
"""


def stored(cache) -> list[DecisionRecord]:
    return [DecisionRecord.from_json(text) for batch in LocalStore(cache).scan() for text, _, _ in batch]


def test_the_embedded_farm_tunes_every_config_of_a_space_and_the_runtime_reuses_its_winner(tmp_path) -> None:
    catalog = write_catalog(tmp_path / "c.toml", CATALOG, policy="samples = 5\nwarmups = 1\nbudget = 30.0\n"
                            "max_relative_mad = 1.0\nstrategy = \"exhaustive\"\n")
    done = subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(catalog), "--cache-dir", str(tmp_path / "cache"),
                           "--kernels", "farm_spaceops"], capture_output=True, text=True, env=farm_env(), cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "1 decisions published" in done.stdout or "1 decision published" in done.stdout, done.stdout
    # Every feasible config was judged: an exhaustive, complete search gets no "evaluated N of M" line.
    assert "evaluated 7 of 8 configs" not in done.stdout, done.stdout

    (record,) = stored(tmp_path / "cache")
    # A complete search: the decision says which values it covered (what a grown space's next search starts from).
    assert (record.meta["winner"], record.meta["covered"], record.meta["incremental"]) == (
        record.name, {"chunked": {"chunk": [7, 256, 1024, 4096], "twice": [False, True]}}, False)
    tried = {c["name"]: c["note"] for c in record.meta["candidates"]}
    feasible = {f"chunked[chunk={c},twice={t}]" for c in (7, 256, 1024, 4096) for t in (False, True)} - {
        "chunked[chunk=7,twice=True]"}
    assert set(tried) == feasible
    assert tried["chunked[chunk=7,twice=False]"].startswith("rejected: wrong output")
    assert record.name in feasible - {"chunked[chunk=7,twice=False]"}
    # The farm's record carries the search's effort as the in-process search's does (docs/spaces.md).
    effort = {k: record.meta[k] for k in ("strategy", "max_configs", "evaluated", "space_size")}
    assert effort == {"strategy": "exhaustive", "max_configs": None, "evaluated": 7, "space_size": 8}

    got = runtime_select(catalog, "farm_spaceops", "farmtest_space", {"n": 3000, "dtype": "float64"}, tmp_path / "cache")
    decision, tuner, inputs = got.decision, got.tuner, got.inputs
    assert (decision.source, decision.name) == (farm.DecisionSource.DISK_CACHE, record.name)
    np.testing.assert_allclose(got.fns[decision.index](*inputs), inputs[0] * 2.0)
    assert tuner.stats().tunes == 0
