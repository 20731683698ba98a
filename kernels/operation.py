"""Operations: a named computation, its tunable sets per device kind, and the workload specs that rebuild its inputs.

An :class:`Operation` is what the farm tunes. It pairs a host (NumPy) and/or a CUDA (CuPy) :class:`~farm.TunableSet`
with a workload-spec schema: a flat JSON/TOML table such as ``{"m": 64, "n": 64, "k": 64, "dtype": "float32"}``
from which :meth:`Operation.build` makes fresh, deterministic inputs on a client, so a worker can rebuild a
workload from a task message. :meth:`Operation.check_spec` validates a spec without any client (the coordinator
checks a whole catalog before it enqueues anything).

Every spec has two implicit fields besides the operation's own: ``dtype`` (required; the choices depend on the
device kind) and ``seed`` (optional integer, default 0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from farm.codetext import code_text
from farm.errors import ConfigError, TuneFailure
from farm.identity import fields
from farm.runtimes.base import ComputeClient
from farm.tunable import TunableSet

MAX_DIM = 1 << 24  # one long axis is fine; max_elements bounds the memory
MAX_ELEMENTS = 1 << 26  # 256 MiB of float32 per array: far above any tuning workload, far below a host's memory


class _Required:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class SpecField:
    """One field of a workload spec: an integer (with bounds) or a string (with choices).

    ``default`` is :data:`REQUIRED` for a field that must be given.
    """

    name: str
    kind: type
    default: Any = REQUIRED
    choices: tuple[Any, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    help: str = ""

    def __post_init__(self) -> None:
        if self.kind not in (int, str):
            raise TypeError(f"spec field {self.name!r}: kind must be int or str, got {self.kind!r}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not valid for this field, or None."""
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                return f"{self.name} must be an integer, got {type(value).__name__}"
            low = "-inf" if self.minimum is None else str(self.minimum)
            high = "inf" if self.maximum is None else str(self.maximum)
            if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
                return f"{self.name} must be in {low}..{high}"
        elif not isinstance(value, str):
            return f"{self.name} must be a string, got {type(value).__name__}"
        if self.choices and value not in self.choices:
            return f"{self.name} must be one of {', '.join(map(str, self.choices))}"
        return None

    def describe(self) -> str:
        """One line for documentation and error messages."""
        if self.choices:
            kind = " | ".join(map(str, self.choices))
        elif self.kind is int:
            kind = f"integer {self.minimum if self.minimum is not None else ''}..{self.maximum if self.maximum is not None else ''}"
        else:
            kind = "string"
        default = "required" if self.required else f"default {self.default!r}"
        return f"{self.name}: {kind} ({default}){': ' + self.help if self.help else ''}"


def dim(name: str, help: str = "") -> SpecField:
    """A positive array dimension (1..16777216; the operation's ``max_elements`` bounds the total)."""
    return SpecField(name, int, minimum=1, maximum=MAX_DIM, help=help)


def choice(name: str, choices: Sequence[str], default: Any = REQUIRED, help: str = "") -> SpecField:
    """A string field with fixed choices."""
    return SpecField(name, str, default=default, choices=tuple(choices), help=help)


SEED = SpecField("seed", int, default=0, minimum=0, maximum=(1 << 63) - 1, help="random seed of the input values")


def code_identity(*helpers: Callable[..., Any], **params: Any) -> str:
    """Extra code identity for a candidate (``TunableSet.add(identity=...)``).

    The core hashes the candidate function's own source; a candidate built by a factory, or one that calls shared
    helpers, also depends on the factory's parameters and on the helpers' source. Pass both here so that changing
    either changes the set's checksum, hence the cache key.
    """
    parts = [code_text(h) for h in helpers]
    parts.extend(f"{key}={value!r}" for key, value in sorted(params.items()))
    return fields(parts)


MakeInputs = Callable[[Mapping[str, Any], Any, np.random.Generator], Sequence[Any]]


@dataclass(frozen=True, eq=False)
class Operation:
    """A tunable operation: its candidate sets per device kind and its workload-spec schema.

    - ``name``: what ``try_execute_stack(name, ...)`` is called with; a name containing "fusion" is tuned with
      scope GRAPH by the core.
    - ``host`` / ``cuda``: the :class:`~farm.TunableSet` for device kind "cpu" / "cuda", or None. A CUDA set must
      be constructible without CuPy (import it inside the candidates).
    - ``fields``: the operation's own spec fields; ``dtype`` and ``seed`` are added implicitly.
    - ``dtypes``: the dtype names each supported device kind accepts, e.g. ``{"cpu": ("float32", "float64")}``.
    - ``make(spec, xp, rng)``: the inputs for a validated spec (defaults filled in), built with array module
      ``xp`` (numpy or cupy) from values drawn with ``rng`` (a NumPy generator seeded with the spec's seed, so
      host and device inputs hold the same values). It must return fresh arrays on every call.
    - ``elements(spec)``: optional size of the largest array the spec allocates, checked against ``max_elements``.
    - ``spec_of(inputs)``: optional inverse of ``make``: the spec (without ``seed``) of live inputs, or None when
      they match no spec (see :meth:`spec_from_inputs`). The fleet's feedback reports it for a missed workload.

    Operations compare by identity: registering the same object twice is a no-op, another object with the same
    name is a duplicate.
    """

    name: str
    host: TunableSet | None
    cuda: TunableSet | None
    fields: tuple[SpecField, ...]
    dtypes: Mapping[str, tuple[str, ...]]
    make: MakeInputs
    elements: Callable[[Mapping[str, Any]], int] | None = None
    max_elements: int = MAX_ELEMENTS
    description: str = ""
    spec_of: Callable[[tuple[Any, ...]], Mapping[str, Any] | None] | None = None
    _all_fields: tuple[SpecField, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        where = f"operation {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(where, "name", self.name, "an operation needs a non-empty string name")
        for kind, tunable in (("host", self.host), ("cuda", self.cuda)):
            if tunable is not None and not isinstance(tunable, TunableSet):
                raise ConfigError(where, kind, tunable, f"{self.name}: {kind} must be a farm.TunableSet or None")
        if not self.devices:
            raise ConfigError(where, "host/cuda", None, f"{self.name} has neither a host nor a CUDA tunable set")
        if not isinstance(self.dtypes, Mapping):
            raise ConfigError(where, "dtypes", self.dtypes, f"{self.name}: dtypes must map device kinds to dtype names")
        dtypes: dict[str, tuple[str, ...]] = {}
        for kind, listed in self.dtypes.items():
            if isinstance(listed, str) or not isinstance(listed, Sequence) or not listed:
                raise ConfigError(where, f"dtypes.{kind}", listed, f"{self.name}: expected a non-empty sequence of dtype names")
            for dtype_name in listed:
                try:
                    np.dtype(dtype_name)
                except TypeError as e:
                    raise ConfigError(where, f"dtypes.{kind}", dtype_name, f"{self.name}: not a NumPy dtype name") from e
            dtypes[str(kind)] = tuple(str(d) for d in listed)
        if set(dtypes) != set(self.devices):
            raise ConfigError(
                where, "dtypes", sorted(dtypes), f"{self.name}: dtypes must list exactly its device kinds {list(self.devices)}"
            )
        own = tuple(self.fields)
        for f in own:
            if not isinstance(f, SpecField):
                raise ConfigError(where, "fields", f, f"{self.name}: spec fields must be kernels.SpecField")
        names = [f.name for f in own]
        reserved = {"dtype", "seed"} & set(names)
        if reserved:
            raise ConfigError(where, "fields", sorted(reserved), f"{self.name}: dtype and seed are implicit spec fields")
        if len(set(names)) != len(names):
            raise ConfigError(where, "fields", names, f"{self.name}: spec field names must be unique")
        # No choices on the field itself: normalize() checks dtypes per device kind, and says so.
        per_kind = "; ".join(f"{kind}: {', '.join(dtypes[kind])}" for kind in self.devices)
        dtype = SpecField("dtype", str, help=f"element type ({per_kind})")
        object.__setattr__(self, "dtypes", dtypes)
        object.__setattr__(self, "fields", own)
        object.__setattr__(self, "_all_fields", (*own, dtype, SEED))
        for kind in self.devices:  # the core's runtime finds the inverse of build through the tunable set
            self.tunable(kind).spec_from_inputs = self._spec_for(kind)

    # -- devices -------------------------------------------------------------------------------------------

    @property
    def devices(self) -> tuple[str, ...]:
        """The device kinds this operation has candidates for ("cpu", "cuda")."""
        return tuple(kind for kind, ts in (("cpu", self.host), ("cuda", self.cuda)) if ts is not None)

    @property
    def spec_fields(self) -> tuple[SpecField, ...]:
        """Every spec field, the implicit ``dtype`` and ``seed`` last."""
        return self._all_fields

    def tunable(self, device_kind: str) -> TunableSet:
        """The tunable set for ``device_kind``; ConfigError naming the operation when it has none."""
        ts = self.host if device_kind == "cpu" else self.cuda if device_kind == "cuda" else None
        if ts is None:
            raise ConfigError(
                f"operation {self.name!r}", "device", device_kind,
                f"{self.name} has no candidates for device kind {device_kind!r} (supported: {', '.join(self.devices)})",
            )
        return ts

    def devices_for(self, spec: Mapping[str, Any]) -> tuple[str, ...]:
        """The device kinds that accept this spec's dtype (the spec is otherwise not validated here)."""
        dtype = spec.get("dtype") if isinstance(spec, Mapping) else None
        return tuple(kind for kind in self.devices if dtype in self.dtypes[kind])

    # -- specs ---------------------------------------------------------------------------------------------

    def normalize(
        self,
        spec: Mapping[str, Any],
        source: str = "<workload>",
        *,
        devices: Sequence[str] | str | None = None,
        prefix: str = "",
    ) -> dict[str, Any]:
        """Validate ``spec`` and return it with every default filled in.

        ``devices``: the device kinds the workload will run on; the dtype must be supported on each. Without
        ``devices`` the dtype must be supported on at least one kind (:meth:`devices_for` says which). ``prefix`` is prepended to field names in errors (e.g.
        ``"problems[0].workloads[1]"``). Raises :class:`~farm.errors.ConfigError` naming the operation and field.
        """

        def at(name: str) -> str:
            return f"{prefix}.{name}" if prefix else name

        if not isinstance(spec, Mapping):
            raise ConfigError(source, prefix or "workload", spec, f"a {self.name} workload must be a table of fields")
        known = {f.name: f for f in self._all_fields}
        for key in spec:
            if key not in known:
                raise ConfigError(
                    source, at(str(key)), spec[key],
                    f"{self.name} has no workload field {key!r} (fields: {', '.join(known)})",
                )
        values: dict[str, Any] = {}
        for f in self._all_fields:
            if f.name not in spec:
                if f.required:
                    raise ConfigError(source, at(f.name), None, f"{self.name} needs workload field {f.describe()}")
                values[f.name] = f.default
                continue
            value = spec[f.name]
            problem = f.problem(value)
            if problem is not None:
                raise ConfigError(source, at(f.name), value, f"{self.name}: {problem}")
            values[f.name] = value
        dtype = values["dtype"]
        if devices is None:
            if not self.devices_for(values):
                listed = "; ".join(f"{kind}: {', '.join(self.dtypes[kind])}" for kind in self.devices)
                raise ConfigError(source, at("dtype"), dtype, f"{self.name} does not support dtype {dtype} ({listed})")
        else:
            for kind in self._device_kinds(devices, source, at("devices")):
                supported = self.dtypes[kind]
                if dtype not in supported:
                    raise ConfigError(
                        source, at("dtype"), dtype, f"{self.name} does not support dtype {dtype} on {kind} ({', '.join(supported)})"
                    )
        if self.elements is not None:
            count = int(self.elements(values))
            if count > self.max_elements:
                raise ConfigError(
                    source, prefix or "workload", dict(spec),
                    f"{self.name} workload allocates {count} elements in one array, above the limit of {self.max_elements}",
                )
        return values

    def check_spec(
        self,
        spec: Mapping[str, Any],
        source: str = "<workload>",
        *,
        devices: Sequence[str] | str | None = None,
        prefix: str = "",
    ) -> None:
        """Raise ConfigError (naming the operation and the field) unless :meth:`build` can build ``spec`` on every
        device kind in ``devices`` (default: on at least one of the operation's kinds). Pure: no client, no
        allocation."""
        self.normalize(spec, source, devices=devices, prefix=prefix)

    def _device_kinds(self, devices: Sequence[str] | str | None, source: str, where: str) -> tuple[str, ...]:
        if devices is None:
            return self.devices
        kinds = (devices,) if isinstance(devices, str) else tuple(devices)
        for kind in kinds:
            if kind not in self.devices:
                raise ConfigError(source, where, kind, f"{self.name} supports device kinds {', '.join(self.devices)}")
        return kinds

    def label(self, spec: Mapping[str, Any]) -> str:
        """A short human description of a spec: every field given, in schema order (``m=64 n=64 k=64 float32``)."""
        parts = []
        for f in self._all_fields:
            if f.name not in spec:
                continue
            value = spec[f.name]
            if f.kind is str and (f.choices or f.name == "dtype"):
                parts.append(str(value))
            else:
                parts.append(f"{f.name}={value}")
        return " ".join(parts)

    # -- inputs --------------------------------------------------------------------------------------------

    def build(self, spec: Mapping[str, Any], client: ComputeClient, source: str = "<workload>") -> tuple[Any, ...]:
        """Fresh inputs for ``spec`` on ``client``: NumPy arrays on a host client, CuPy arrays on a CUDA client
        (allocated on its device and stream, completed before returning). The values depend only on the spec and
        its ``seed`` (default 0). Raises ConfigError for an invalid spec or an unsupported device kind."""
        kind = client.device_kind
        self.tunable(kind)
        values = self.normalize(spec, source, devices=kind)
        rng = np.random.default_rng(values["seed"])
        if kind == "cpu":
            return tuple(self.make(values, np, rng))
        if kind == "cuda":
            from farm.runtimes.cuda import import_cupy

            cupy = import_cupy()
            with client.activate():
                inputs = tuple(self.make(values, cupy, rng))
            client.sync()
            return inputs
        raise TuneFailure.invalid(f"{self.name}: cannot build inputs on device kind {kind!r}")

    # -- the inverse of build ---------------------------------------------------------------------------------

    def _spec_for(self, kind: str) -> Callable[[Sequence[Any]], dict[str, Any] | None]:
        return lambda inputs: self.spec_from_inputs(inputs, kind)

    def spec_from_inputs(self, inputs: Sequence[Any], device_kind: str | None = None) -> dict[str, Any] | None:
        """The normalized workload spec whose :meth:`build` makes inputs like ``inputs`` (same shapes, dtype and
        layout; ``seed`` left out), or None: the operation has no ``spec_of``, or the inputs match no valid spec
        (a view with other strides, a dtype ``device_kind`` does not take). Never raises."""
        if self.spec_of is None:
            return None
        try:
            spec = self.spec_of(tuple(inputs))
            if spec is None:
                return None
            values = self.normalize(spec, devices=device_kind)
        except Exception:  # an inverse that cannot read these inputs reports by signature only
            return None
        values.pop("seed", None)
        return values
