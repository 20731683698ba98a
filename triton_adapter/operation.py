"""Triton kernels as farm operations: each config is a candidate, a torch expression or a config the reference.

    import farm_triton
    from farm_kernels import dim

    OPERATIONS = [farm_triton.operation(
        "vector_add", add_kernel,                       # @farm_triton.autotune / @triton.autotune, or a bare @triton.jit
        grid=lambda meta, x, y, out, n: (triton.cdiv(n, meta["BLOCK"]),),
        inputs=lambda spec, device, gen: make_tensors(spec, device, gen),
        outputs=("out_ptr",), reference=lambda x, y, out, n: x + y,
        fields=(dim("n"),), dtypes=("float32",),
    )]

A worker rebuilds the arguments from a workload spec (torch tensors on its device: the CPU under
``TRITON_INTERPRET=1``, the GPU otherwise) and times every config in the farm's paired, fenced trials after
checking its outputs against the reference. A config that fails to compile, runs out of resources or computes
something else is a verdict (REJECTED), never a crash of the worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from farm.arrays import compare_outputs
from farm.errors import ConfigError, TuneFailure
from farm.policy import Tolerance
from farm.tunable import Inputs, TunableSet
from farm_kernels.operation import Operation, SpecField
from farm_triton import identity
from farm_triton.deps import import_torch, import_triton
from farm_triton.registry import Kernel, remember

MakeTensors = Callable[[Mapping[str, Any], str, Any], Sequence[Any]]
Grid = Callable[..., tuple[int, ...]]


def _host_view(value: Any) -> Any:
    """A tensor as an array the farm compares without a copy: NumPy for a CPU tensor, CuPy for a CUDA one."""
    if hasattr(value, "detach") and hasattr(value, "device"):
        if value.device.type == "cpu":
            return value.detach().numpy()
        import cupy

        return cupy.asarray(value.detach())
    return value


def _farm_stream(args: Sequence[Any]) -> Any:
    """On a CUDA worker, torch's stream for the farm client's current CuPy stream (what the trial activated,
    fences and times with its events), so Triton launches where the farm measures; a null context on the CPU."""
    if not any(getattr(getattr(a, "device", None), "type", None) == "cuda" for a in args):
        return contextlib.nullcontext()
    import cupy

    torch = import_torch()
    return torch.cuda.stream(torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr))


class Launch:
    """One config of a kernel as a farm candidate: launches the kernel with the config's meta-parameters and
    launch options and returns the output arguments. (A class: its source is its code identity.)"""

    def __init__(self, kernel: Any, config: Any, grid: Grid, names: Sequence[str], outputs: Sequence[int]) -> None:
        self.kernel = identity.jit_function(kernel)
        self.options = dict(config.all_kwargs())
        self.grid = grid
        self.names = tuple(names)
        self.outputs = tuple(outputs)
        self.pre_hook = config.pre_hook

    def __call__(self, *args: Any) -> Any:
        grid = self.grid(self.options, *args)
        with _farm_stream(args):
            if self.pre_hook is not None:  # as Triton's autotuner calls it: the arguments by name and the options
                self.pre_hook({**dict(zip(self.names, args, strict=False)), **self.options})
            self.kernel[grid](*args, **self.options)
        return _outputs(args, self.outputs)


class Expression:
    """A torch expression as the reference: called with the kernel's arguments, returns the expected outputs
    (one tensor or a tuple, in the order of ``outputs``)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        with _farm_stream(args):
            out = self.fn(*args)
        if isinstance(out, (tuple, list)):
            return tuple(_host_view(o) for o in out)
        return _host_view(out)


def _outputs(args: Sequence[Any], positions: Sequence[int]) -> Any:
    views = tuple(_host_view(args[i]) for i in positions)
    return views[0] if len(views) == 1 else views


class TritonSet(TunableSet):
    """A tunable set whose checksum is the Triton identity (:func:`farm_triton.identity.checksum`), which an
    application computes from its own kernel and configs without knowing the farm's reference."""

    def __init__(self, kernel: Kernel, **kw: Any) -> None:
        super().__init__(kernel.name, **kw)
        self.kernel = kernel

    def checksum(self) -> str:
        return identity.checksum(self.kernel.name, self.kernel.fn, self.kernel.configs)


def _clone(*args: Any) -> Inputs:
    with _farm_stream(args):
        return tuple(a.clone() if hasattr(a, "clone") and hasattr(a, "dtype") else a for a in args)


def operation(
    name: str,
    kernel: Any,
    *,
    inputs: MakeTensors,
    grid: Grid,
    outputs: Sequence[str],
    reference: Callable[..., Any] | int,
    baseline_config: int = 0,
    fields: Sequence[SpecField] = (),
    dtypes: Sequence[str] = ("float32",),
    configs: Sequence[Any] | None = None,
    key: Sequence[str] | None = None,
    tolerance: Tolerance | None = None,
    description: str = "",
) -> Operation:
    """A farm operation tuning ``kernel``'s configs; register it from a ``--kernels`` module (``OPERATIONS``).

    - ``kernel``: an autotuned kernel (``@farm_triton.autotune`` or ``@triton.autotune``: its configs and key
      are used) or a ``@triton.jit`` function with ``configs`` and ``key`` given here.
    - ``inputs(spec, device, generator)``: the kernel's positional arguments (every argument but the configs'
      meta-parameters) for a validated workload spec: torch tensors on ``device`` ("cpu" or "cuda") drawn with
      the seeded torch ``generator``, and scalars. Fresh tensors on every call.
    - ``grid(meta, *args)``: the launch grid for a config's meta-parameters.
    - ``outputs``: the names of the arguments the kernel writes (what is validated).
    - ``reference``: the index of a config declared correct, the farm's baseline every config is validated and
      timed against; or a torch expression ``fn(*args) -> outputs``: then config ``baseline_config`` is the
      baseline and is checked against the expression once per workload (a mismatch fails the workload,
      REJECTED). Applications name the reference config too (``decided(name, reference=...)``, default 0).
    - ``fields`` / ``dtypes``: the workload spec (``dtype`` and ``seed`` are implicit); by default a spec
      should name the key's arguments, which is what a miss report carries.
    """
    triton = import_triton()
    where = f"triton operation {name!r}"
    found_configs = list(configs if configs is not None else getattr(kernel, "configs", None) or [])
    keys = list(key if key is not None else getattr(kernel, "keys", None) or [])
    if not found_configs:
        raise ConfigError(where, "configs", configs, "needs a config list: an autotuned kernel, or configs=[...]")
    for c in found_configs:
        if not isinstance(c, triton.Config):
            raise ConfigError(where, "configs", c, "every config must be a triton.Config")
    jit = identity.jit_function(kernel)
    meta = {k for c in found_configs for k in c.kwargs}
    names = [n for n in jit.arg_names if n not in meta]
    missing = [o for o in outputs if o not in names]
    if missing or not outputs:
        raise ConfigError(where, "outputs", list(outputs), f"must name arguments of the kernel ({', '.join(names)})")
    positions = [names.index(o) for o in outputs]
    expression = callable(reference)
    first = baseline_config if expression else reference
    if isinstance(first, bool) or not isinstance(first, int) or not 0 <= first < len(found_configs):
        raise ConfigError(where, "reference", reference,
                          f"must be a torch expression or the index of one of the {len(found_configs)} configs")
    spec = Kernel(name, jit, tuple(found_configs), tuple(keys), tuple(jit.arg_names), first)
    remember(spec)

    def signature(*args: Any) -> str:
        return identity.workload(identity.tuning_key(keys, jit.arg_names, dict(zip(names, args, strict=False))))

    tunable = TritonSet(spec, signature=signature, generate=_clone,
                        tolerance=(lambda *args: tolerance) if tolerance is not None else None)
    baseline = Launch(jit, found_configs[first], grid, names, positions)
    tunable.add(baseline, name=identity.candidates(found_configs, first)[0].name, reference=True)
    for i, config in enumerate(found_configs):
        if i != first:  # the reference config is candidate 0 (identity.candidates)
            tunable.add(Launch(jit, config, grid, names, positions), name=identity.config_name(i, config))
    check = Expression(reference) if not isinstance(reference, int) else None

    def make(values: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> Sequence[Any]:
        torch = import_torch()
        device = "cpu" if xp is np else "cuda"
        generator = torch.Generator(device=device)
        generator.manual_seed(int(values["seed"]))
        args = tuple(inputs(values, device, generator))
        if device == "cuda":  # built on torch's stream: complete before the farm's stream uses them
            torch.cuda.synchronize()
        if check is not None:  # the reference config against the torch expression, once per workload
            expected = check(*_clone(*args))
            problem = compare_outputs(expected, baseline(*_clone(*args)), tolerance or Tolerance()).problem
            if problem is not None:
                raise TuneFailure.rejected(f"{name}: the reference config{first} disagrees with the torch reference: {problem}")
        return args

    def spec_of(args: tuple[Any, ...]) -> Mapping[str, Any] | None:
        return spec_from(keys, dict(zip(names, args, strict=False)))

    kinds = tuple(dtypes)
    return Operation(name=name, host=tunable, cuda=tunable, fields=tuple(fields), dtypes={"cpu": kinds, "cuda": kinds},
                     make=make, spec_of=spec_of, description=description or f"Triton kernel {jit.__name__}")


def spec_from(keys: Sequence[str], named: Mapping[str, Any]) -> dict[str, Any] | None:
    """The workload spec a miss report carries: the key arguments' values and the first tensor's dtype (torch's
    name without ``torch.``), or None when a key value is not a plain scalar."""
    spec: dict[str, Any] = {}
    for k in keys:
        value = named.get(k)
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            return None
        spec[k] = value
    dtype = next((v.dtype for v in named.values() if hasattr(v, "dtype")), None)
    if dtype is not None:
        spec["dtype"] = str(dtype).removeprefix("torch.")
    return spec


def spec_from_key(keys: Sequence[str], key: tuple[Any, ...]) -> dict[str, Any] | None:
    """The same spec as :func:`spec_from`, read from Triton's tuning key (key values, then dtype strings)."""
    if len(key) < len(keys):
        return None
    spec = spec_from(keys, dict(zip(keys, key, strict=False)))
    if spec is not None and len(key) > len(keys):
        spec["dtype"] = str(key[len(keys)]).removeprefix("torch.")
    return spec
