"""CUDA kernel spaces: one ``.cu`` source whose tuning parameters are compile-time constants (NVRTC ``-D`` defines).

A :class:`KernelSpace` says, for one config of a tuning space (``farm.space.Space``), which program variant to
compile (the base program's text with ``-DNAME=value`` options added), which entry points it holds and the
launch (block, dynamic shared memory) each config gets. The space's candidate function launches
:meth:`KernelSpace.kernel`; the compile stage (:mod:`farm_kernels.cuda.compile`) uses the same description to
compile every feasible config ahead of the GPU and to prune by resources. The description is attached to the
space's function as ``fn.kernel_space`` (:func:`kernel_space_of` finds it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from farm.identity import fields
from farm_kernels.cuda import CudaKernel, CudaProgram
from farm_kernels.cuda.compile import ATTRIBUTE, load_module

Config = Mapping[str, Any]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Launch:
    """What a config's kernels are launched with: the block and the dynamic shared memory in bytes."""

    block: tuple[int, int, int]
    shared_mem: int = 0


@dataclass(eq=False)
class KernelSpace:
    """The compile-time side of a CUDA tuning space.

    ``defines(config)`` maps a config to its ``-D`` defines; ``launch(config)`` to its :class:`Launch`; ``base`` is
    the kernel family (entry points ``{base}_{f16|f32|f64}`` for ``dtypes``) that the defines instantiate.
    """

    program: CudaProgram
    base: str
    dtypes: tuple[str, ...]
    defines: Callable[[Config], Mapping[str, int | str]]
    launch: Callable[[Config], Launch]
    _variants: dict[tuple[str, ...], CudaProgram] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def options(self, config: Config) -> tuple[str, ...]:
        """The base program's options plus the config's defines, in a stable order."""
        defines = self.defines(config)
        return (*self.program.options, *(f"-D{name}={defines[name]}" for name in sorted(defines)))

    def variant(self, config: Config) -> CudaProgram:
        """The program compiled for ``config`` (one object per distinct option list, so a device loads each
        variant once)."""
        options = self.options(config)
        with self._lock:
            found = self._variants.get(options)
            if found is None:
                found = self._variants[options] = CudaProgram(self.program.filename, options, text=self.program.text,
                                                              loader=load_module)
            return found

    def kernel(self, config: Config) -> CudaKernel:
        """The kernel family of ``config``'s variant."""
        return self.variant(config).kernel(self.base, self.dtypes)

    def entry_names(self, config: Config) -> tuple[str, ...]:
        names: tuple[str, ...] = self.kernel(config).names()
        return names

    def identity(self) -> str:
        """Code identity of the whole space (source text, base options, kernel family; the values are in the
        space's descriptor)."""
        return fields([self.program.filename, self.program.text, " ".join(self.program.options), self.base, "defines"])


def row_block_space(program: CudaProgram, base: str, dtypes: tuple[str, ...], define: str) -> KernelSpace:
    """A space of one parameter, ``threads`` (one block of that many threads per row or output), passed to the
    source as ``-D{define}=threads``."""
    return KernelSpace(program, base, dtypes, defines=lambda c: {define: c["threads"]},
                       launch=lambda c: Launch((c["threads"], 1, 1)))


BLOCK_THREADS = [32, 64, 128, 256, 512, 1024]


def attach(fn: F, space: KernelSpace) -> F:
    """Mark ``fn`` (a space's candidate function) as launching ``space``'s kernels."""
    setattr(fn, ATTRIBUTE, space)
    return fn


def kernel_space_of(fn: Any) -> KernelSpace | None:
    """The :class:`KernelSpace` a space function launches, None for a host or plain function."""
    found = getattr(fn, ATTRIBUTE, None)
    return found if isinstance(found, KernelSpace) else None
