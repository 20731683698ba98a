"""Nearest decisions end to end through the runtime adapter (issue 27): ``try_execute_stack`` on a host client,
the borrowed winner validated against the reference on the live inputs (real output comparison), a local cache
as the tier."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import farm
from farm.adapter import stack_request
from farm.policy import Mode
from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore

POLICY = farm.StackPolicy(mode=Mode.CACHE_ONLY, warmups=1, samples=3)


def scale_set(nearest: bool = True) -> farm.TunableSet:
    """Doubling, with a candidate that is right only for fewer than 100 rows (its winner does not transfer)."""
    ts = farm.TunableSet("double", signature=farm.array_signature, nearest=nearest)

    @ts.reference
    def reference(x):
        return x * 2.0

    @ts.candidate
    def small_only(x):
        return x + x if x.shape[0] < 100 else x * 3.0

    return ts


def rows(n: int) -> np.ndarray:
    return np.arange(n * 8, dtype=np.float32).reshape(n, 8)


def store_winner(cache: Path, tuner: farm.StackTuner, client: farm.HostClient, ts: farm.TunableSet,
                 n: int) -> str:
    """Put a decision for ``n`` rows naming ``small_only`` into the local cache, as an earlier tune would have."""
    problem, cands, _ = stack_request("double", "cpu", client, ts, (rows(n),))
    key = tuner.request(problem, cands, 0, device=client.device_id).key
    store = LocalStore(cache, 64)
    store.put(DecisionRecord(key, 1, 0, "small_only", True, 0.5, time.time()))
    store.close()
    return problem.workload


@pytest.fixture
def client() -> farm.HostClient:
    return farm.HostClient(0)


def test_an_unseen_workload_runs_the_validated_nearest_winner_and_stores_nothing(tmp_path: Path, client) -> None:
    tuner = farm.enable_stack_autotune(POLICY, cache_directory=tmp_path)
    ts = scale_set()
    store_winner(tmp_path, tuner, client, ts, 16)
    out = farm.try_execute_stack("double", "cpu", client, ts, rows(40))
    np.testing.assert_array_equal(out, rows(40) * 2.0)
    assert (tuner.stats().nearest_hits, tuner.stats().nearest_refused) == (1, 0)
    problem, cands, _ = stack_request("double", "cpu", client, ts, (rows(40),))
    live = tuner.request(problem, cands, 0, device=client.device_id).key
    assert LocalStore(tmp_path).get(live) is None  # borrowed, never the exact key's record
    farm.try_execute_stack("double", "cpu", client, ts, rows(40))
    assert tuner.stats().nearest_hits == 2


def test_a_nearest_winner_wrong_on_the_live_workload_falls_back_to_the_reference(tmp_path: Path, client) -> None:
    tuner = farm.enable_stack_autotune(POLICY, cache_directory=tmp_path)
    ts = scale_set()
    store_winner(tmp_path, tuner, client, ts, 64)
    for _ in range(2):
        out = farm.try_execute_stack("double", "cpu", client, ts, rows(128))  # small_only is wrong here
        np.testing.assert_array_equal(out, rows(128) * 2.0)
    assert (tuner.stats().nearest_hits, tuner.stats().nearest_refused) == (0, 1)  # refused once, remembered


def test_an_operation_that_refuses_nearest_decisions_gets_the_reference(tmp_path: Path, client) -> None:
    tuner = farm.enable_stack_autotune(POLICY, cache_directory=tmp_path)
    ts = scale_set(nearest=False)
    store_winner(tmp_path, tuner, client, ts, 16)
    np.testing.assert_array_equal(farm.try_execute_stack("double", "cpu", client, ts, rows(40)), rows(40) * 2.0)
    assert tuner.stats().nearest_hits == 0 and tuner.stats().misses == 1
