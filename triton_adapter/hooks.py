"""The two ways in: ``farm_triton.decided(name)`` for an existing ``@triton.autotune`` kernel and
``farm_triton.autotune(...)`` that keeps Triton's own signature.

Both give Triton's autotuner one config when the farm decided this launch, so Triton runs no benchmark (its
``Autotuner.run`` uses a single pruned config as it is) and every process and rank runs the same config. On a miss
they leave Triton's own autotuning (or, with ``on_miss="first"``, the first config and no benchmark) and report
the miss to the fleet.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from farm.errors import TuneFailure
from farm_triton import identity
from farm_triton.decisions import current
from farm_triton.deps import import_triton
from farm_triton.registry import Kernel, by_name, remember

log = logging.getLogger("farm_triton")
Prune = Callable[..., list[Any]]
ON_MISS = (None, "first")


class Decided:
    """An ``early_config_prune`` hook serving the farm's decision for the kernel ``name``.

    Triton calls it as ``fn(configs, named_args, **kwargs)`` once per new tuning key. It names the kernel by the
    autotuner :func:`autotune` bound it to, else an operation of this name loaded in the process, else the
    calling autotuner. ``reference``: the index of the config the farm used as its reference (default 0, as
    :func:`farm_triton.operation`; it is part of the cache key). ``then``: the application's own pruning, applied
    on a miss. A lookup that fails (no environment probe, a broken tier) is a logged miss: the adapter never
    fails a launch that Triton alone would run."""

    def __init__(self, name: str, on_miss: str | None = None, reference: int = 0,
                 then: Prune | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise TuneFailure.invalid(f"farm_triton.decided: name must be a non-empty string, got {name!r}")
        if isinstance(reference, bool) or not isinstance(reference, int) or reference < 0:
            raise TuneFailure.invalid(f"farm_triton.decided({name!r}): reference must be a config index, got {reference!r}")
        if on_miss not in ON_MISS:
            raise TuneFailure.invalid(f"farm_triton.decided({name!r}): on_miss must be None or 'first', got {on_miss!r}")
        self.name, self.on_miss, self.reference, self.then = name, on_miss, reference, then
        self.autotuner: Any = None
        self._kernels: dict[int, tuple[Any, Kernel]] = {}
        self._lock = threading.Lock()

    def __call__(self, configs: Sequence[Any], named_args: dict[str, Any], **kwargs: Any) -> list[Any]:
        kernel = self._kernel(configs, sys._getframe(1))
        named = {**named_args, **kwargs}
        decisions = current()
        try:
            found = decisions.lookup(kernel, named)
        except Exception as e:
            log.warning("farm_triton: no farm decision for %s (%s: %s): Triton's own choice", self.name, type(e).__name__, e)
            found = None
        if found is not None and found.index is not None:
            return [identity.served(found.index, configs, self.reference)]
        if found is not None:
            decisions.report_miss(kernel, found, named)
        if self.on_miss == "first":
            return [configs[0]]
        return list(self.then(configs, named_args, **kwargs)) if self.then is not None else list(configs)

    def _kernel(self, configs: Sequence[Any], frame: Any) -> Kernel:
        with self._lock:
            known = self._kernels.get(id(configs))
        if known is not None and known[0] is configs:
            return known[1]
        kernel = self._bound(configs) or self._registered(configs) or self._from_caller(configs, frame)
        if not 0 <= self.reference < len(configs):
            raise TuneFailure.invalid(f"farm_triton.decided({self.name!r}): no config {self.reference} to be the reference")
        remember(kernel)
        with self._lock:
            self._kernels[id(configs)] = (configs, kernel)  # the list is held, so its id stays its own
        return kernel

    def _kernel_of(self, tuner: Any, configs: Sequence[Any]) -> Kernel:
        jit = identity.jit_function(tuner.fn)
        return Kernel(self.name, jit, tuple(configs), tuple(tuner.keys), tuple(jit.arg_names), self.reference)

    def _bound(self, configs: Sequence[Any]) -> Kernel | None:
        return self._kernel_of(self.autotuner, configs) if self.autotuner is not None else None

    def _registered(self, configs: Sequence[Any]) -> Kernel | None:
        """The operation of this name, when this process loaded it with the same configs (no frame needed)."""
        known = by_name(self.name)
        if known is None or list(map(identity.config_text, known.configs)) != list(map(identity.config_text, configs)):
            return None
        return Kernel(self.name, known.fn, tuple(configs), known.keys, known.arg_names, self.reference)

    def _from_caller(self, configs: Sequence[Any], frame: Any) -> Kernel:
        """The kernel of the autotuner calling the hook: Triton's ``Autotuner.prune_configs`` (its ``self``) or
        torch's ``do_prune_configs`` under ``torch.compile`` (its ``autotuner``)."""
        found = frame.f_locals if frame is not None else {}
        tuner = next((t for t in (found.get("self"), found.get("autotuner"))
                      if t is not None and hasattr(t, "keys") and hasattr(t, "fn")), None)
        if tuner is None:
            raise TuneFailure.invalid(f"farm_triton.decided({self.name!r}) must be an early_config_prune of "
                                      "@triton.autotune (prune_configs_by={'early_config_prune': ...})")
        return self._kernel_of(tuner, configs)


def decided(name: str, *, on_miss: str | None = None, reference: int = 0) -> Decided:
    """The ``early_config_prune`` hook for an existing kernel::

        @triton.autotune(configs, key=["n"], prune_configs_by={"early_config_prune": farm_triton.decided("add")})
        @triton.jit
        def add_kernel(...): ...

    ``name`` is the operation name the farm tuned the kernel under (:func:`farm_triton.operation`)."""
    return Decided(name, on_miss, reference)


def autotune(configs: Sequence[Any], key: Sequence[str], *, name: str | None = None, on_miss: str | None = None,
             reference: int = 0, prune_configs_by: dict[str, Any] | None = None,
             **options: Any) -> Callable[[Any], Any]:
    """``@triton.autotune`` with the farm's decisions: the same arguments as Triton's (``configs``, ``key``,
    ``prune_configs_by``, ``reset_to_zero``, ``restore_value``, hooks, ``do_bench``...), plus ``name`` (the
    operation name; default: the kernel function's name), ``on_miss`` and ``reference`` (see :class:`Decided`).
    An ``early_config_prune`` given in ``prune_configs_by`` runs on a miss."""
    triton = import_triton()
    if on_miss not in ON_MISS:
        raise TuneFailure.invalid(f"farm_triton.autotune: on_miss must be None or 'first', got {on_miss!r}")
    pruning = dict(prune_configs_by or {})
    then = pruning.pop("early_config_prune", None)

    def wrap(fn: Any) -> Any:
        hook = Decided(name or identity.jit_function(fn).__name__, on_miss, reference, then)
        tuner = triton.autotune(configs=list(configs), key=list(key),
                                prune_configs_by={**pruning, "early_config_prune": hook}, **options)(fn)
        tuner.__class__ = _settled_class(tuner.__class__)  # the same object and state; a faster launch once settled
        hook.autotuner = tuner
        return tuner

    return wrap


@functools.cache
def _settled_class(base: Any) -> Any:
    """``base`` (Triton's ``Autotuner``) whose launches of a key it has settled go straight to the kernel.

    Triton's ``Autotuner.run`` reads its knobs (environment-backed settings) and copies the arguments on every
    launch, even for a key whose config it cached long ago. Here a launch computes the key exactly as Triton does
    (the ``key`` arguments, then the dtype of each argument that has one, in Triton's argument order), and when
    Triton's own cache holds a config for it without a ``pre_hook``, launches that config. Everything else (a new
    key: the farm's decision through ``early_config_prune``, or Triton's tuning on a miss; a config with a
    pre-hook) is Triton's ``run``."""

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(self.configs) > 1:
            names = self.arg_names
            given = dict(zip(names, args, strict=False))
            for k, v in kwargs.items():
                if k in names:
                    given[k] = v
            key = (*(given[k] for k in self.keys if k in given),
                   *(_dtype_text(v.dtype) for v in given.values() if hasattr(v, "dtype")))
            settled = self.cache.get(key)
            if settled is not None and settled.pre_hook is None:
                self.best_config = settled
                return self.fn.run(*args, **kwargs, **_launch_options(settled))
        return base.run(self, *args, **kwargs)

    return type(f"Farm{base.__name__}", (base,), {"run": run, "__module__": __name__, "__doc__": base.__doc__})


_DTYPES: dict[Any, str] = {}


def _dtype_text(dtype: Any) -> str:
    """``str(dtype)``, memoized (a launch's key names each tensor argument's dtype)."""
    text = _DTYPES.get(dtype)
    if text is None:
        text = _DTYPES[dtype] = str(dtype)
    return text


_OPTIONS: dict[int, tuple[Any, dict[str, Any]]] = {}


def _launch_options(config: Any) -> dict[str, Any]:
    """``config.all_kwargs()``, computed once per config (the config is held, so its id stays its own)."""
    known = _OPTIONS.get(id(config))
    if known is None or known[0] is not config:
        known = _OPTIONS[id(config)] = (config, config.all_kwargs())
    return known[1]
