"""Shared by the compile-stage tests: skip when libnvrtc (the nvidia-cuda-nvrtc-cu12 wheel) cannot be loaded."""

from __future__ import annotations

import pytest

from farm_kernels.cuda import nvrtc


def skip_without_nvrtc() -> None:
    try:
        nvrtc.load()
    except nvrtc.NvrtcUnavailable as e:
        pytest.skip(str(e))
