"""What names a Triton kernel's decision: the tuning key Triton itself uses, the candidates, and the checksum.

Both sides compute these from the same three things, so that the farm's decision is found by the application:
the kernel (its ``JITFunction``), its config list and the argument values of a launch. The checksum (the
operation's code identity, inside the cache key) hashes what makes a Triton timing stale: the Triton version, the
backend (target, ptxas version, or the interpreter), the kernel's source (``JITFunction.cache_key``) and every
config (meta-parameters, ``num_warps``, ``num_stages``, ``num_ctas``, ``maxnreg``). A decision for another Triton
build therefore has another key and is never served. The reference a farm validates with is not in it: it decides
which configs are correct, not how fast they are.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from farm.encoding import fields
from farm.identity import Candidate
from farm_triton.deps import import_triton, interpreted

IDENTITY_VERSION = "farm-triton-v1"
REFERENCE = "reference"


def jit_function(kernel: Any) -> Any:
    """The ``@triton.jit`` function under autotuners and heuristics (their ``.fn`` chain)."""
    fn = kernel
    for _ in range(16):
        if hasattr(fn, "arg_names") and not hasattr(fn, "configs") and not hasattr(fn, "values"):
            return fn
        inner = getattr(fn, "fn", None)
        if inner is None:
            break
        fn = inner
    return fn


def kernel_identity(kernel: Any) -> str:
    """The kernel's code identity: ``JITFunction.cache_key`` (its source and the sources it calls), or under the
    interpreter, which has none, a hash of the Python source."""
    fn = jit_function(kernel)
    key = getattr(fn, "cache_key", None)
    if isinstance(key, str) and key:
        return key
    base = getattr(fn, "fn", fn)
    try:
        text = inspect.getsource(base)
    except (OSError, TypeError):
        text = getattr(fn, "src", None) or repr(getattr(base, "__code__", base))
    name = getattr(base, "__qualname__", getattr(base, "__name__", "kernel"))
    return "source:" + hashlib.sha256(f"{name}\0{text}".encode()).hexdigest()


@functools.cache
def backend_identity() -> str:
    """Triton's version and the backend it compiles for: the active target and backend hash (ptxas version
    included for NVIDIA), or ``interpreter`` under ``TRITON_INTERPRET=1``. Probed once per process."""
    triton = import_triton()
    if interpreted():
        return fields([triton.__version__, "interpreter"])
    try:
        from triton.compiler.compiler import make_backend
        from triton.runtime import driver

        target = driver.active.get_current_target()
        backend = make_backend(target).hash()  # the compiler's own cache identity: ptxas version, arch
    except Exception as e:  # no driver: nothing can be compiled, so nothing can be decided either
        return fields([triton.__version__, f"no-backend:{type(e).__name__}"])
    return fields([triton.__version__, str(target), str(backend)])


def config_text(config: Any) -> str:
    """A config as Triton prints it (every meta-parameter and launch option), the same in every process."""
    return str(config)


def config_name(index: int, config: Any) -> str:
    """The candidate name of the ``index``-th config (the index keeps duplicated configs apart)."""
    return f"config{index}: {config_text(config)}"


def checksum(name: str, kernel: Any, configs: Sequence[Any]) -> str:
    """The operation's code identity for ``kernel`` with ``configs`` (see the module docstring)."""
    parts = [IDENTITY_VERSION, name, backend_identity(), kernel_identity(kernel), *map(config_text, configs)]
    return hashlib.sha256(fields(parts).encode()).hexdigest()


def candidates(configs: Sequence[Any], reference: int = 0) -> list[Candidate]:
    """The candidate list of a Triton operation: the reference config first (the farm's baseline, named with its
    index so that another choice of reference is another key), then every other config in order (the
    reference's own entry would only be timed against itself)."""
    first = Candidate(f"{REFERENCE}: config{reference}")
    return [first, *(Candidate(config_name(i, c)) for i, c in enumerate(configs) if i != reference)]


def served(index: int, configs: Sequence[Any], reference: int = 0) -> Any:
    """The config a decision's candidate ``index`` (in :func:`candidates`) stands for."""
    others = [c for i, c in enumerate(configs) if i != reference]
    return configs[reference] if index == 0 else others[index - 1]


def tuning_key(keys: Sequence[str], arg_names: Sequence[str], named: Mapping[str, Any]) -> tuple[Any, ...]:
    """Triton's own autotuning key for a launch: the values of the ``key`` arguments, then the dtype of every
    argument that has one (``Autotuner.run``)."""
    args = {k: named[k] for k in arg_names if k in named}
    key: list[Any] = [args[k] for k in keys if k in args]
    key.extend(str(v.dtype) for v in args.values() if hasattr(v, "dtype"))
    return tuple(key)


def workload(key: tuple[Any, ...]) -> str:
    """The exact workload signature of a tuning key (the part of the cache key that varies per launch)."""
    return fields(["triton-key", *(f"{type(v).__name__}:{v}" for v in key)])
