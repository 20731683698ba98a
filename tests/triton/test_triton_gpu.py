"""The Triton tier on a device (``python3 tools/dev.py test --triton -m gpu``, and the gpu-check's triton part):
the same kernel compiled for the GPU, tuned by the embedded farm on ``cuda:0`` with real timings, then served to
an unmodified ``@triton.autotune`` kernel in another process with no benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest
from tier import app, records, tune_into

from farm_triton import identity

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tuned_on_gpu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    return tune_into(tmp_path_factory.mktemp("gpu"), "--device", "cuda:0", interpret=False)


def test_on_a_gpu_the_farms_config_is_served_with_no_benchmark(tuned_on_gpu: Path) -> None:
    from triton_ops import CONFIGS

    (record,) = records(tuned_on_gpu)
    assert not record.name.startswith("config1")  # 48 is no power of two: it cannot compile there either
    result = app(tuned_on_gpu, 4096, "--device", "cuda", interpret=False)
    assert result == {"config": str(identity.served(int(record.index), CONFIGS)), "correct": True, "hits": 1, "misses": 0}
