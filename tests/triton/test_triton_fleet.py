"""Misses go to the fleet: a launch the farm never decided, and a kernel a process tuned itself (the listener),
are reported to a real Redis stream in the form ``farm tune --from-fleet`` plans from."""

from __future__ import annotations

from pathlib import Path

from servers import wait_for
from tier import app

import farm_triton
from farm.feedback import stream_key
from farm_coordinator.feedback import plan, read_reports
from farm_fleet.settings import Settings


def planned(client, url: str) -> tuple[list, dict]:
    reports, malformed = read_reports(client, Settings.from_env({}, broker_url=url, redis_url=url))
    assert malformed == []
    return plan(reports, ("triton_ops",))


def test_a_missed_launch_is_reported_with_the_spec_the_farm_tunes_from(tuned: Path, redis_srv) -> None:
    client = redis_srv.client(1)
    client.flushall()
    url = redis_srv.url(1)
    result = app(tuned, 1000, "--on-miss", "first", "--report-to", url)
    assert result["misses"] == 1
    entries, untunable = planned(client, url)
    assert untunable == {}
    assert [(e.operation, e.device_kind, e.spec) for e in entries] == [("farmtriton_add", "cpu", {"n": 1000, "dtype": "float32"})]


def test_a_hit_reports_nothing(tuned: Path, redis_srv) -> None:
    client = redis_srv.client(1)
    client.flushall()
    assert app(tuned, 4096, "--report-to", redis_srv.url(1))["hits"] == 1
    assert client.xlen(stream_key(None)) == 0


def test_a_kernel_a_process_tuned_itself_is_harvested_as_a_miss(redis_srv) -> None:
    import triton
    from triton_ops import CONFIGS, add_kernel

    client = redis_srv.client(1)
    client.flushall()
    url = redis_srv.url(1)
    decisions = farm_triton.configure(report_to=url)
    seen: list[dict] = []
    previous = triton.knobs.autotuning.listener
    triton.knobs.autotuning.listener = lambda **kw: seen.append(kw)
    try:
        listener = farm_triton.harvest()
        # Triton calls it so after its own benchmark (on a GPU; its interpreter cannot call listeners).
        listener(fn=add_kernel, key=(2000, "torch.float32", "torch.float32", "torch.float32"), best_config=CONFIGS[2],
                 configs_timings={c: [1.0] for c in CONFIGS}, duration=0.5, cache_hit=False)
        listener(fn=add_kernel, key=(3000, "torch.float32", "torch.float32", "torch.float32"), best_config=CONFIGS[2],
                 configs_timings={}, duration=None, cache_hit=True)  # Triton's disk cache: not a self-tuned launch
    finally:
        triton.knobs.autotuning.listener = previous
    assert decisions.reporter is not None and decisions.reporter.flush(10.0)
    assert len(seen) == 2  # the listener that was installed before still hears every call
    wait_for(lambda: client.xlen(stream_key(None)) == 1, 10.0, "the harvested report")
    entries, untunable = planned(client, url)
    assert untunable == {}
    assert [(e.operation, e.spec) for e in entries] == [("farmtriton_add", {"n": 2000, "dtype": "float32"})]


def test_without_report_to_the_misses_go_through_the_farm_controllers_reporter(tuned: Path, redis_srv) -> None:
    import torch
    import triton
    from triton_ops import CONFIGS, KEY, NAME, add_kernel, grid

    import farm

    client = redis_srv.client(1)
    client.flushall()
    url = redis_srv.url(1)
    tuner = farm.enable_stack_autotune(farm.StackPolicy(), report_to=url)
    decisions = farm_triton.configure(cache_directory=tuned / "cache")
    assert decisions.reporter is tuner.feedback
    kernel = triton.autotune(configs=CONFIGS, key=KEY,
                             prune_configs_by={"early_config_prune": farm_triton.decided(NAME, on_miss="first")})(add_kernel)
    x = torch.rand(640)
    out = torch.empty_like(x)
    kernel[lambda meta: grid(meta, x, x, out, 640)](x, x, out, 640)
    assert tuner.feedback.flush(10.0)
    entries, untunable = planned(client, url)
    assert untunable == {} and [e.spec for e in entries] == [{"n": 640, "dtype": "float32"}]
