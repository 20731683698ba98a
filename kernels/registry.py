"""The operation registry: the builtin operations, entry-point plugins and users' own modules, by name.

Workers and the coordinator call :func:`ensure_loaded` with the ``--kernels`` modules of the command line; it
loads, once each, the builtin operations, every module named by an entry point of group ``farm.kernels``, and the
given modules. Both sides therefore see the same operations and compute the same checksums.

A module of operations either exposes ``OPERATIONS`` (an iterable of :class:`~farm_kernels.operation.Operation`,
registered when the module is loaded; the builtin modules do this) or calls :func:`register` at import. Loading a
module twice, or registering the same Operation object twice, is a no-op; a *different* operation with a taken
name is an error naming both.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Iterable, Sequence
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from farm.errors import ConfigError
from farm_kernels.operation import Operation

ENTRY_POINT_GROUP = "farm.kernels"
BUILTIN_MODULES = ("farm_kernels.matmul", "farm_kernels.softmax", "farm_kernels.reduce_sum", "farm_kernels.transpose", "farm_kernels.bias_gelu")
SOURCE = "kernels registry"


class Registry:
    """Operations by name, and which modules and entry points have been loaded."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # loading a module re-enters through register()
        self._operations: dict[str, Operation] = {}
        self._origins: dict[str, str] = {}
        self._modules: set[str] = set()
        self._builtin = False
        self._entry_points = False

    # -- operations ----------------------------------------------------------------------------------------

    def register(self, op: Operation, origin: str | None = None) -> Operation:
        """Add ``op``; return it. Raises ConfigError naming the operation when the name is taken by another
        operation, or when one of its tunable sets has no reference or no workload signature."""
        if not isinstance(op, Operation):
            raise ConfigError(origin or SOURCE, "operation", op, f"expected a kernels.Operation, got {type(op).__name__}")
        origin = origin or _caller_module()
        for kind in op.devices:
            ts = op.tunable(kind)
            field = "host" if kind == "cpu" else "cuda"
            if ts.stack_reference() is None:
                raise ConfigError(origin, f"{op.name}.{field}", ts.name, f"operation {op.name!r}: its {kind} tunable set has no reference")
            if not ts.has_signature():
                raise ConfigError(origin, f"{op.name}.{field}", ts.name, f"operation {op.name!r}: its {kind} tunable set has no workload signature")
        with self._lock:
            found = self._operations.get(op.name)
            if found is op:
                return op
            if found is not None:
                raise ConfigError(
                    origin, "name", op.name,
                    f"operation {op.name!r} is already registered (from {self._origins[op.name]}); a second operation cannot take its name",
                )
            self._operations[op.name] = op
            self._origins[op.name] = origin
        return op

    def unregister(self, name: str) -> None:
        """Forget an operation (tests, and plugins replacing a development version); unknown names are ignored."""
        with self._lock:
            self._operations.pop(name, None)
            self._origins.pop(name, None)

    def get(self, name: str) -> Operation:
        """The operation called ``name``; ConfigError listing the known names otherwise."""
        with self._lock:
            found = self._operations.get(name)
            if found is None:
                known = ", ".join(sorted(self._operations)) or "none loaded"
                raise ConfigError(SOURCE, "operation", name, f"unknown operation {name!r} (known: {known})")
            return found

    def names(self) -> tuple[str, ...]:
        """Every registered operation name, sorted."""
        with self._lock:
            return tuple(sorted(self._operations))

    def check_workload(
        self,
        operation: str,
        spec: Any,
        source: str = "<workload>",
        *,
        devices: Sequence[str] | str | None = None,
        prefix: str = "",
    ) -> None:
        """ConfigError unless ``operation`` is registered and can build ``spec`` on ``devices`` (see
        :meth:`Operation.check_spec`); the error names the operation and the field."""
        with self._lock:
            found = self._operations.get(operation)
        if found is None:
            known = ", ".join(self.names()) or "none loaded"
            field = f"{prefix}.operation" if prefix else "operation"
            raise ConfigError(source, field, operation, f"unknown operation {operation!r} (known: {known})")
        found.check_spec(spec, source, devices=devices, prefix=prefix)

    def origin(self, name: str) -> str:
        """Where the operation was registered from (a module name)."""
        self.get(name)
        with self._lock:
            return self._origins[name]

    # -- loading -------------------------------------------------------------------------------------------

    def load_module(self, name: str, source: str = "--kernels") -> ModuleType:
        """Import module ``name`` (once) and register its ``OPERATIONS``; ConfigError naming the module when it
        cannot be imported or declares something that is not an Operation."""
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(source, "module", name, "expected a dotted module name such as mypackage.ops")
        name = name.strip()
        with self._lock:
            try:
                module = importlib.import_module(name)
            except ConfigError:
                raise
            except Exception as e:  # an import error or an error raised by the module's own code
                raise ConfigError(source, "module", name, f"cannot import operations module: {type(e).__name__}: {e}"
                                  f"{_import_hint(name, e)}") from e
            if name in self._modules:
                return module
            self._register_declared(module, name, source)
            self._modules.add(name)
            return module

    def _register_declared(self, module: ModuleType, name: str, source: str) -> None:
        declared = getattr(module, "OPERATIONS", ())
        if isinstance(declared, Operation) or not isinstance(declared, Iterable):
            raise ConfigError(source, f"{name}.OPERATIONS", declared, "must be a sequence of kernels.Operation")
        for op in declared:
            if not isinstance(op, Operation):
                raise ConfigError(source, f"{name}.OPERATIONS", op, f"expected a kernels.Operation, got {type(op).__name__}")
            self.register(op, origin=name)

    def load_builtin(self) -> None:
        """Register the builtin operations (idempotent)."""
        with self._lock:
            if self._builtin:
                return
            for name in BUILTIN_MODULES:
                self.load_module(name, source="kernels builtin")
            self._builtin = True

    def load_entry_points(self) -> None:
        """Load every entry point of group ``farm.kernels`` (idempotent). An entry point names a module
        (``myops = "mypackage.ops"``), or an object in one (``"mypackage.ops:OPERATIONS"``): an Operation or an
        iterable of them."""
        with self._lock:
            if self._entry_points:
                return
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                where = f"entry point {ep.name!r} = {ep.value!r} (group {ENTRY_POINT_GROUP})"
                if ":" not in ep.value:
                    self.load_module(ep.value, source=where)
                    continue
                try:
                    target = ep.load()
                except Exception as e:
                    raise ConfigError(where, "value", ep.value, f"cannot load: {type(e).__name__}: {e}") from e
                self._register_object(target, where)
            self._entry_points = True

    def _register_object(self, target: Any, where: str) -> None:
        if isinstance(target, ModuleType):
            self.load_module(target.__name__, source=where)
        elif isinstance(target, Operation):
            self.register(target, origin=where)
        elif isinstance(target, Iterable) and not isinstance(target, (str, bytes)):
            for op in target:
                if not isinstance(op, Operation):
                    raise ConfigError(where, "value", op, f"expected a kernels.Operation, got {type(op).__name__}")
                self.register(op, origin=where)
        else:
            raise ConfigError(where, "value", target, "an entry point must name a module, an Operation or a sequence of them")

    def ensure_loaded(self, extra_modules: Iterable[str] = ()) -> tuple[str, ...]:
        """Load the builtin operations, the entry points and ``extra_modules`` (each once); return every name."""
        if isinstance(extra_modules, str):
            extra_modules = (extra_modules,)
        with self._lock:
            self.load_builtin()
            self.load_entry_points()
            for name in extra_modules:
                self.load_module(name)
        return self.names()


def _caller_module() -> str:
    """The module that called :func:`register` (for messages about duplicates)."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            module = frame.f_globals.get("__name__", "")
            if module != __name__:
                return str(module) or "<unknown>"
            frame = frame.f_back
        return "<unknown>"
    finally:
        del frame


_default = Registry()


def register(op: Operation) -> Operation:
    """Register ``op`` in the process-wide registry (see :meth:`Registry.register`); usable at import time."""
    return _default.register(op, origin=_caller_module())


def unregister(name: str) -> None:
    """Forget an operation (see :meth:`Registry.unregister`)."""
    _default.unregister(name)


def get(name: str) -> Operation:
    """The registered operation ``name`` (see :meth:`Registry.get`)."""
    return _default.get(name)


def names() -> tuple[str, ...]:
    """Every registered operation name, sorted."""
    return _default.names()


def check_workload(
    operation: str, spec: Any, source: str = "<workload>", *, devices: Sequence[str] | str | None = None, prefix: str = ""
) -> None:
    """ConfigError unless ``operation`` is registered and can build ``spec`` (see :meth:`Registry.check_workload`)."""
    _default.check_workload(operation, spec, source, devices=devices, prefix=prefix)


def load_module(name: str) -> ModuleType:
    """Import a module of operations and register its ``OPERATIONS`` (see :meth:`Registry.load_module`)."""
    return _default.load_module(name)


def load_builtin() -> None:
    """Register the builtin operations (idempotent)."""
    _default.load_builtin()


def load_entry_points() -> None:
    """Load the ``farm.kernels`` entry points (idempotent)."""
    _default.load_entry_points()


def ensure_loaded(extra_modules: Iterable[str] = ()) -> tuple[str, ...]:
    """Builtin operations + entry points + ``extra_modules``, each loaded once; returns every operation name."""
    return _default.ensure_loaded(extra_modules)


def _import_hint(name: str, error: Exception) -> str:
    """What to do when the module itself is not found: it must be importable (installed, or its folder on
    PYTHONPATH); the ``farm`` script does not look in the current folder, where ``pkg/`` often is."""
    if not isinstance(error, ModuleNotFoundError) or not error.name or not name.startswith(error.name):
        return ""
    import os
    import sys

    top = name.split(".")[0]
    here = os.getcwd()
    found = os.path.isdir(os.path.join(here, top)) or os.path.exists(os.path.join(here, f"{top}.py"))
    if found and here not in map(os.path.abspath, sys.path):
        return (f" ({top} is in the current folder, which is not on the import path: run with PYTHONPATH=. "
                f"or install the package, e.g. pip install -e .)")
    return " (the module must be importable: install its package, or put the folder holding it on PYTHONPATH)"
