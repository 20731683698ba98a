"""The kernels this process knows by name: what the listener and the hooks need to name a Triton function."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kernel:
    """A named Triton kernel with its config list and tuning key (``keys``: the key's argument names).

    ``reference``: the index of the farm's reference config (its baseline; part of the cache key)."""

    name: str
    fn: Any
    configs: tuple[Any, ...]
    keys: tuple[str, ...]
    arg_names: tuple[str, ...]
    reference: int = 0


_lock = threading.Lock()
_by_function: dict[int, tuple[Any, Kernel]] = {}
_by_name: dict[str, Kernel] = {}


def remember(kernel: Kernel) -> None:
    """Record the name of ``kernel.fn`` (the listener reports a self-tuned function under this name)."""
    with _lock:
        _by_function[id(kernel.fn)] = (kernel.fn, kernel)  # the function is held, so its id stays its own
        _by_name[kernel.name] = kernel


def named(fn: Any) -> Kernel | None:
    """The kernel recorded for the ``@triton.jit`` function ``fn``, or None."""
    with _lock:
        found = _by_function.get(id(fn))
    return found[1] if found is not None and found[0] is fn else None


def by_name(name: str) -> Kernel | None:
    """The kernel last recorded under the operation name ``name``, or None."""
    with _lock:
        return _by_name.get(name)
