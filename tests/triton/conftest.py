"""The Triton tier (``python3 tools/dev.py test --triton``): collected only there (FARM_TRITON_TIER=1), in the
environment with torch and triton. Without them the tier fails: it exists to run these tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TIER = os.environ.get("FARM_TRITON_TIER") == "1"

if not TIER:
    collect_ignore_glob = ["*.py"]  # the main suite: this folder needs torch and triton
else:
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as e:
        pytest.exit(f"the Triton tier needs torch and triton (python3 tools/dev.py test --triton): {e}", returncode=3)
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A farm cache with the embedded farm's decision for farmtriton_add, n=4096 (tuned once per session)."""
    from tier import tune_into

    return tune_into(tmp_path_factory.mktemp("farm"))


@pytest.fixture(autouse=True)
def _unconfigured() -> Iterator[None]:
    """Each test starts with farm_triton unconfigured (farm_triton.configure is process-wide)."""
    from farm_triton import decisions

    decisions._current = decisions._derived = None
    yield
    decisions._current = decisions._derived = None
