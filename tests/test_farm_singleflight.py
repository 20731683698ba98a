"""Resume and single flight with real processes: a coordinator SIGKILLed mid-run and started again finishes
only what is missing; two coordinators on one catalog run every group once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from farm_helpers import fleet, write_catalog
from servers import wait_for

from farm.stores.redis import RedisDecisions

pytestmark = pytest.mark.servers

SLOW = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 120000, dtype = "float64" }, { n = 120001, dtype = "float64" },
             { n = 120002, dtype = "float64" }, { n = 120003, dtype = "float64" }]
"""
GROUPS = 8  # 4 problems x 2 priority groups


def coordinator(f, catalog) -> subprocess.Popen[str]:
    env = dict(f.env, FARM_LEASE_TTL="2")
    return subprocess.Popen(
        [sys.executable, "-m", "farm_cli", "tune", str(catalog), "--broker", f.broker, "--redis", f.results_url,
         "--kernels", "farm_testops", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def executions(f) -> dict[str, int]:
    """How many times each group's trials started (the worker counts an attempt before running them)."""
    client = f.client()
    return {k: int(client.get(k)) for k in client.scan_iter(f"{f.settings.prefix}:attempts:*")
            if not k.endswith(":confirm")}


def decisions(f) -> list:
    store = RedisDecisions(client=f.client(), settings=f.settings)
    return [r for digest in store.fingerprints() for r in store.records(digest)]


def test_a_coordinator_killed_mid_run_and_restarted_does_not_repeat_finished_groups(redis_srv, tmp_path):
    with fleet(redis_srv, tmp_path / "fleet", ("cpu:0", "cpu:1")) as f:
        catalog = write_catalog(tmp_path / "c.toml", SLOW)
        first = coordinator(f, catalog)
        client = f.client()
        wait_for(lambda: len(list(client.scan_iter(f"{f.settings.prefix}:result:*"))) >= 2, 120,
                 "two group results from the first coordinator")
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=30)
        before = len(decisions(f))
        assert before < 4, "the first coordinator finished before it was killed; the test proves nothing"

        second = coordinator(f, catalog)
        out, err = second.communicate(timeout=240)
        assert second.returncode == 0, err
        assert len(decisions(f)) == 4
        counts = executions(f)
        assert len(counts) == GROUPS
        assert set(counts.values()) == {1}, counts


def test_two_coordinators_on_one_catalog_run_every_group_once(redis_srv, tmp_path):
    with fleet(redis_srv, tmp_path / "fleet", ("cpu:0", "cpu:1")) as f:
        catalog = write_catalog(tmp_path / "c.toml", SLOW)
        a, b = coordinator(f, catalog), coordinator(f, catalog)
        for process in (a, b):
            _, err = process.communicate(timeout=240)
            assert process.returncode == 0, err
        assert len(decisions(f)) == 4
        counts = executions(f)
        assert len(counts) == GROUPS
        assert set(counts.values()) == {1}, counts
        assert len(f.client().xrange(f.settings.events_key)) == 4  # each decision published once
