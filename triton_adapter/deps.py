"""The optional imports: torch and triton load only when a Triton feature is used, with one line on failure."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from farm.errors import TuneFailure

INSTALL = ("farm_triton needs torch and triton: `pip install torch` (it brings the triton it was built for); "
           "the project's Triton tier installs them with `python3 tools/dev.py test --triton`")


def _require(*names: str) -> ModuleType:
    """The last of ``names``, each imported in order; UNAVAILABLE with the install line when one is missing."""
    module: ModuleType | None = None
    try:
        for name in names:
            module = importlib.import_module(name)
    except ImportError as e:
        raise TuneFailure.unavailable(f"{INSTALL} ({e})") from e
    assert module is not None
    return module


def import_triton() -> ModuleType:
    """The ``triton`` module (torch first: triton's launchers take torch tensors)."""
    return _require("torch", "triton")


def import_torch() -> ModuleType:
    """The ``torch`` module."""
    return _require("torch")


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``: on the CPU, torch CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")
