"""Interference probes: involuntary context switches per pair on the host, NVML throttle reasons on CUDA."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

import farm.interference
import farm.runtimes.cuda
from farm.interference import (
    THROTTLE_MASK,
    Interference,
    Probe,
    _nvml_probe,
    involuntary_switches,
    nvml_throttle_probe,
)


def test_a_probe_counts_pairs_and_marks_throttled_ones_disturbed() -> None:
    answers = iter([False, True, False])
    probe = Probe(lambda: next(answers))
    for _ in range(3):
        probe.begin()
        probe.end()
    result = probe.result([1.0, 1.0, 2.0])
    assert (result.pairs, result.throttled) == (3, 1)
    assert result.disturbed >= 1 and result.reference_spread == 0.0


def test_a_probe_that_fails_is_dropped_without_failing_the_trial() -> None:
    def broken() -> bool:
        raise RuntimeError("NVML went away")

    probe = Probe(broken)
    probe.begin()
    probe.end()
    assert probe.throttle is None and probe.result([1.0]).throttled == 0


@pytest.mark.parametrize(("disturbed", "limit", "exceeds"), [(5, 0.5, True), (3, 0.5, False), (0, 0.0, False), (1, 0.0, True)])
def test_the_limit_is_a_fraction_of_disturbed_pairs(disturbed: int, limit: float, exceeds: bool) -> None:
    assert Interference(7, disturbed, disturbed, 0, 0.0).exceeds(limit) is exceeds


def test_a_host_client_has_no_throttle_probe() -> None:
    assert nvml_throttle_probe(SimpleNamespace(device_kind="cpu", index=0)) is None


def test_a_cuda_client_reads_nvml_throttle_reasons_where_nvml_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    reasons = [0x1, 0x20]  # idle (ignored), then SW thermal slowdown
    fake = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByPciBusId=lambda bus: ("handle", bus),
        nvmlDeviceGetCurrentClocksEventReasons=lambda handle: reasons[0],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    cupy = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(deviceGetPCIBusId=lambda i: f"0000:0{i}:00.0")))
    monkeypatch.setattr(farm.runtimes.cuda, "import_cupy", lambda: cupy)
    _nvml_probe.cache_clear()
    try:
        probe = nvml_throttle_probe(SimpleNamespace(device_kind="cuda", index=3))
        assert probe is not None and probe() is False
        reasons[0] = 0x20
        assert probe() is True and THROTTLE_MASK & 0x20
    finally:
        _nvml_probe.cache_clear()


def test_without_nvml_a_cuda_client_has_no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    _nvml_probe.cache_clear()
    try:
        assert nvml_throttle_probe(SimpleNamespace(device_kind="cuda", index=0)) is None
    finally:
        _nvml_probe.cache_clear()


def test_the_real_counter_reads_this_process_s_involuntary_switches() -> None:
    import resource

    before = involuntary_switches()
    assert isinstance(before, int) and before <= resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
    assert involuntary_switches() >= before


def test_a_pair_during_which_the_process_was_switched_out_is_disturbed(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([10, 10, 10, 13, 13, 13])  # begin/end of three pairs: the second saw three switches
    monkeypatch.setattr(farm.interference, "_switches", lambda: next(readings))
    probe = Probe()
    for _ in range(3):
        probe.begin()
        probe.end()
    result = probe.result([1.0, 1.0, 1.0])
    assert (result.pairs, result.disturbed, result.switches, result.throttled) == (3, 1, 3, 0)
