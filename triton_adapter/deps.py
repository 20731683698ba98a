"""The optional imports: torch and triton load only when a Triton feature is used, with one line on failure."""

from __future__ import annotations

import os
from types import ModuleType

from farm.errors import TuneFailure

INSTALL = ("farm_triton needs torch and triton: `pip install torch` (it brings the triton it was built for); "
           "the project's Triton tier installs them with `python3 tools/dev.py test --triton`")


def import_triton() -> ModuleType:
    """The ``triton`` module; UNAVAILABLE with the install line when it (or torch) is missing."""
    try:
        import torch  # noqa: F401  (triton's launchers take torch tensors)
        import triton
    except ImportError as e:
        raise TuneFailure.unavailable(f"{INSTALL} ({e})") from e
    module: ModuleType = triton
    return module


def import_torch() -> ModuleType:
    """The ``torch`` module; UNAVAILABLE with the install line when it is missing."""
    try:
        import torch
    except ImportError as e:
        raise TuneFailure.unavailable(f"{INSTALL} ({e})") from e
    module: ModuleType = torch
    return module


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``: on the CPU, torch CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")
