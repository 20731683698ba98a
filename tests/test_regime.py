"""The execution regime in the identity, without servers: the host regime (CPU set, BLAS and OpenMP pools), the
worker's --cores, the CUDA fingerprint assembled from fakes (no GPU needed), and the presence record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from farm.errors import ConfigError
from farm.runtimes.cuda import compiler_text, driver_text, mig_profile, properties_text
from farm.runtimes.host import HostRegime, regime_from
from farm_fleet import presence
from farm_workers.worker import format_cpus, parse_cores

OPENBLAS = {"user_api": "blas", "internal_api": "openblas", "num_threads": 4, "architecture": "Haswell"}
GOMP = {"user_api": "openmp", "internal_api": "openmp", "num_threads": 2}


# -- the host regime ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpus", "pools", "environ", "expected"),
    [
        (4, [OPENBLAS, GOMP], {}, HostRegime(4, 4, 2, ("openblas Haswell",))),
        (4, [OPENBLAS], {}, HostRegime(4, 4, 4, ("openblas Haswell",))),  # OpenMP not loaded: it would start 4
        (4, [OPENBLAS], {"OMP_NUM_THREADS": "3,1"}, HostRegime(4, 4, 3, ("openblas Haswell",))),
        (2, [OPENBLAS, {**OPENBLAS, "num_threads": 1}], {}, HostRegime(2, 4, 2, ("openblas Haswell",))),
        (1, [], {"OMP_NUM_THREADS": "junk"}, HostRegime(1, 0, 1, ())),
    ],
)
def test_the_regime_is_the_cpu_set_size_and_the_largest_pool_of_each_kind(cpus, pools, environ, expected):
    assert regime_from(cpus, pools, environ) == expected


def test_the_regime_text_names_cores_pools_and_blas_core_types():
    assert HostRegime(2, 2, 1, ("openblas Haswell",)).text() == "cpus=2; blas=2 (openblas Haswell); openmp=1"
    assert HostRegime(1, 0, 1).text() == "cpus=1; blas=0; openmp=1"


def run_python(code: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


PROBE = """
import json, os
from farm.environment import runtime_environment
from farm.runtimes.host import HostClient, host_regime
def probe():
    return {"fingerprint": runtime_environment(HostClient(0)).fingerprint, "regime": host_regime().to_dict()}
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_pinning_after_numpy_loaded_keeps_its_pool_until_the_threads_are_limited():
    # The measured bug: a process pinned after NumPy started its BLAS pool keeps two threads on one core. Its
    # fingerprint now says so, and limit_threads brings it to the regime of an application started on one core.
    answer = run_python(PROBE + """
from farm.environment import clear_environment_memo
from farm.runtimes.host import limit_threads
os.sched_setaffinity(0, {0})
before = probe()
limit_threads(1)
after = probe()
print(json.dumps({"before": before, "after": after, "env": os.environ["OPENBLAS_NUM_THREADS"]}))
""")
    application = run_python("import os\nos.sched_setaffinity(0, {0})\n" + PROBE + "print(json.dumps(probe()))")
    assert answer["before"]["regime"]["cpus"] == 1 and answer["before"]["regime"]["blas"] == 2
    assert answer["before"]["fingerprint"] != application["fingerprint"]
    assert answer["after"]["regime"]["blas"] == 1 and answer["env"] == "1"
    assert answer["after"]["fingerprint"] == application["fingerprint"]


def test_an_application_limiting_its_pools_with_threadpoolctl_gets_another_fingerprint():
    answer = run_python(PROBE + """
from threadpoolctl import threadpool_limits
first = probe()
with threadpool_limits(limits=1):
    inside = probe()
print(json.dumps({"first": first, "inside": inside, "again": probe()}))
""")
    assert answer["inside"]["regime"]["blas"] == 1
    assert answer["again"] == answer["first"]
    if answer["first"]["regime"]["blas"] > 1:
        assert answer["inside"]["fingerprint"] != answer["first"]["fingerprint"]


# -- --cores -----------------------------------------------------------------------------------------------------

ALL = frozenset(range(8))


@pytest.mark.parametrize(
    ("spec", "index", "expected"),
    [
        (None, 3, {3}),
        ("2", 0, {0, 1}),
        ("2", 1, {2, 3}),
        ("4", 1, {4, 5, 6, 7}),
        ("0-3", 5, {0, 1, 2, 3}),
        ("0,2,4-5", 0, {0, 2, 4, 5}),
        ("6-6", 0, {6}),
        ("1", 7, {7}),
    ],
)
def test_cores_are_a_count_of_the_devices_block_or_a_cpu_list(spec, index, expected):
    assert parse_cores(spec, index, ALL) == expected


@pytest.mark.parametrize(
    ("spec", "index", "reason"),
    [
        ("0", 0, "at least 1"),
        ("3", 2, "positions 6..8"),
        ("0-9", 0, "8-9 is not available"),
        ("5-2", 0, "runs backwards"),
        ("a-b", 0, "CPU list"),
        ("1,,2", 0, "CPU list"),
        (None, 9, "9 is not available"),
    ],
)
def test_impossible_cores_are_refused_naming_the_option_and_value(spec, index, reason):
    with pytest.raises(ConfigError) as error:
        parse_cores(spec, index, ALL)
    assert "--cores" in str(error.value) and reason in str(error.value)


def test_cpu_lists_print_as_ranges():
    assert format_cpus([5, 0, 1, 2]) == "0-2,5"
    assert format_cpus({3}) == "3"
    assert format_cpus([]) == ""


# -- the CUDA fingerprint from fakes ----------------------------------------------------------------------------

PROPS = {"name": b"NVIDIA H200", "major": 9, "minor": 0, "multiProcessorCount": 132,
         "totalGlobalMem": 150_000_000_000, "clockRate": 1_980_000, "computeMode": 3}


def fake_cupy(driver: Any = 12040, nvrtc: Any = (12, 4)) -> Any:
    def fail() -> None:
        raise RuntimeError("no driver")

    runtime = SimpleNamespace(driverGetVersion=(lambda: driver) if driver else fail, runtimeGetVersion=lambda: 12030)
    nvrtc_module = SimpleNamespace(getVersion=(lambda: nvrtc) if nvrtc else fail)
    return SimpleNamespace(__version__="13.3.0", cuda=SimpleNamespace(runtime=runtime, nvrtc=nvrtc_module))


class FakeNvml:
    def __init__(self, mig: bool, names: dict[str, str] | None = None, broken: bool = False) -> None:
        self.mig, self.names, self.broken, self.shut = mig, names or {}, broken, False

    def nvmlInit(self) -> None:
        if self.broken:
            raise RuntimeError("NVML: driver not loaded")

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> str:
        return bus

    def nvmlDeviceGetMigMode(self, handle: str) -> tuple[int, int]:
        return (1, 1) if self.mig else (0, 0)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return self.names[handle].encode()


def test_the_cuda_properties_name_model_capability_compute_mode_and_mig_profile():
    text = properties_text(PROPS, "mig off")
    assert text.startswith("NVIDIA H200; sm_90; 132 SMs; 150000000000 bytes")
    assert text.endswith("compute mode exclusive-process; mig off")
    assert "compute mode default" in properties_text({**PROPS, "computeMode": 0}, "mig off")
    assert "compute mode unknown" in properties_text({k: v for k, v in PROPS.items() if k != "computeMode"}, "x")


def test_the_cuda_driver_and_compiler_name_driver_runtime_nvrtc_and_cupy():
    assert driver_text(fake_cupy()) == "cuda driver 12040; runtime 12030"
    assert driver_text(fake_cupy(driver=None)) is None
    assert compiler_text(fake_cupy()) == "cupy 13.3.0; nvrtc 12.4"
    assert compiler_text(fake_cupy(nvrtc=None)) == "cupy 13.3.0; nvrtc unknown"


def test_the_mig_profile_comes_from_nvml_for_the_visible_instance(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-aaa,MIG-bbb")
    nvml = FakeNvml(mig=True, names={"MIG-aaa": "NVIDIA H200 MIG 1g.18gb", "MIG-bbb": "NVIDIA H200 MIG 3g.71gb"})
    assert mig_profile("0000:01:00.0", 0, nvml) == "mig 1g.18gb"
    assert mig_profile("0000:01:00.0", 1, nvml) == "mig 3g.71gb" and nvml.shut
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert mig_profile("0000:01:00.0", 0, nvml) == "mig on"
    assert mig_profile("0000:01:00.0", 0, FakeNvml(mig=False)) == "mig off"
    assert mig_profile("0000:01:00.0", 0, FakeNvml(mig=False, broken=True)) == "mig unknown"


def test_the_cuda_runtime_imports_without_a_gpu():
    answer = run_python("import json, farm.runtimes.cuda as c; print(json.dumps({'count': c.device_count()}))")
    assert answer["count"] >= 0


# -- presence ----------------------------------------------------------------------------------------------------


def test_a_worker_record_carries_its_regime_and_reads_older_records_without_one():
    info = presence.WorkerInfo("w", "h", "cpu:0", "cpu", "d" * 16, "EPYC", "0.1", presence.HEALTHY, 1, 0.0, "q",
                               cores="0-1,4", blas_threads=3, openmp_threads=3)
    again = presence.WorkerInfo.from_fields(info.to_fields())
    assert again == info
    assert again.regime() == "cores 0-1,4 (3); blas 3; openmp 3"
    old = {k: v for k, v in info.to_fields().items() if k not in ("cores", "blas_threads", "openmp_threads")}
    assert presence.WorkerInfo.from_fields(old).regime() == "unpinned; blas ?; openmp ?"
