"""A space on the real farm: a private redis-server, one `farm worker` process, and the coordinator. The task's
candidates travel as canonical config names over JSON; the worker resolves each and calls ``fn(*inputs, **config)``."""

from __future__ import annotations

import pytest
from farm_helpers import fleet, write_catalog
from servers import start_worker, wait_worker_ready

from farm_coordinator.catalog import load_catalog
from farm_coordinator.run import tune

pytestmark = pytest.mark.servers

SPACE = """
[[problems]]
operation = "farmtest_space"
workloads = [{ n = 2500, dtype = "float64" }]
"""


def test_a_worker_process_judges_every_feasible_config_of_a_space_by_its_canonical_name(redis_srv, tmp_path) -> None:
    catalog = write_catalog(tmp_path / "c.toml", SPACE, policy="samples = 5\nwarmups = 1\nbudget = 2.0\n"
                            "max_relative_mad = 1.0\n")
    with fleet(redis_srv, tmp_path / "fleet", ()) as f:
        worker = start_worker("cpu:0", f.broker, f.results_url, f.directory, f.env, kernels=("farm_spaceops",))
        f.workers.append(worker)
        wait_worker_ready(worker, f.client(), f.settings.prefix)
        summary = tune(load_catalog(catalog, ("farm_spaceops",)), f.coordinator(), f.settings)
    assert summary.published == 1
    record = summary.aggregates[0].record
    assert record is not None
    notes = {c["name"]: c["note"] for c in record.meta["candidates"]}
    assert set(notes) == {"chunked[chunk=7,twice=False]", "chunked[chunk=256,twice=False]",
                          "chunked[chunk=256,twice=True]", "chunked[chunk=1024,twice=False]",
                          "chunked[chunk=1024,twice=True]", "chunked[chunk=4096,twice=False]",
                          "chunked[chunk=4096,twice=True]"}
    assert notes["chunked[chunk=7,twice=False]"].startswith("rejected: wrong output")
    assert record.name.startswith("chunked[chunk=") and record.name != "chunked[chunk=7,twice=False]"
    assert "chunked[chunk=" in record.cache_key and "where chunk >= 256 or not twice" in record.cache_key
