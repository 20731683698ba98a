"""A real Triton kernel, tuned by the embedded farm under Triton's interpreter, then served to an unmodified
``@triton.autotune`` kernel in another process with no benchmark (tests/triton/app_add.py fails on one)."""

from __future__ import annotations

from pathlib import Path

from tier import app, records

from farm_triton import identity


def test_the_embedded_farm_tunes_the_triton_kernel_and_a_config_that_cannot_compile_is_a_verdict(tuned: Path) -> None:
    (record,) = records(tuned)
    assert record.name.startswith(("config2", "config3")), record.meta["candidates"]
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
