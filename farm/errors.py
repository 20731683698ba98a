"""The farm's one error hierarchy, under one root: :class:`FarmError`.

```
FarmError
├── TuneFailure                            a selection, trial or runtime operation failed (``kind``: FailureKind)
├── DeviceBusy                             a device's lock cannot be taken (the reference runs: BUSY)
├── ConfigError                            a configuration file, catalog or variable is malformed
├── ProtocolError (also ValueError)        a wire message does not follow the protocol
├── CorruptRecord                          a stored decision cannot be trusted
├── ArchiveError                           an archive cannot be written or trusted
├── ValidationUnavailable                  the reference's output cannot be validated
├── RestrictionError (also ValueError)     a space's restriction cannot be evaluated for a config
├── ReplayFailure (also RuntimeError)      a replayed config fails as its recording says (farm.replay)
└── CudaToolError                          NVRTC or the cubin reader cannot do their job
    ├── NvrtcUnavailable (also RuntimeError)   libnvrtc cannot be loaded
    ├── NvrtcError (also RuntimeError)         NVRTC rejected a program
    └── CubinError (also ValueError)           bytes that are not a readable cubin
```

Every error pickles (``__reduce__``) and round-trips through JSON: ``error.to_dict()`` and
:func:`error_from_dict`. The errors only the fleet raises live under the same root in ``farm_fleet.errors``.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar


class FailureKind(enum.Enum):
    """Why the controller could not produce a decision."""

    INVALID_INPUT = "invalid_input"
    REJECTED = "rejected"
    UNAVAILABLE = "unavailable"
    DEVICE = "device"
    QUARANTINED = "quarantined"


_KINDS: dict[str, type[FarmError]] = {}


class FarmError(Exception):
    """Raised when the farm (not a single tuning decision) cannot do what was asked; root of farm errors. A
    subclass with more constructor arguments lists them in ``fields`` (JSON values) so that it round-trips."""

    fields: ClassVar[tuple[str, ...]] = ("message",)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        _KINDS[cls.__name__] = cls

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), tuple(getattr(self, f) for f in self.fields))

    def to_dict(self) -> dict[str, Any]:
        """``{"error": class name, <field>: value, ...}``: plain JSON."""
        return {"error": type(self).__name__, **{f: getattr(self, f) for f in self.fields}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FarmError:
        """Rebuild an error written by :meth:`to_dict` (the class named in it, which must be ``cls`` or below)."""
        return error_from_dict(data, cls)


_KINDS["FarmError"] = FarmError


def error_from_dict(data: Any, base: type[FarmError] = FarmError) -> FarmError:
    """Rebuild any farm error from :meth:`FarmError.to_dict`; ProtocolError for an unknown or malformed one."""
    if not isinstance(data, dict) or not isinstance(data.get("error"), str):
        raise ProtocolError(f"an error must be an object with an 'error' class name, got {data!r}")
    cls = _KINDS.get(data["error"])
    if cls is None or not issubclass(cls, base):
        raise ProtocolError(f"unknown error class {data['error']!r} (expected {base.__name__} or a subclass)")
    missing = [f for f in cls.fields if f not in data]
    if missing:
        raise ProtocolError(f"error {data['error']} lacks field {missing[0]!r}")
    return cls(*[data[f] for f in cls.fields])


class TuneFailure(FarmError):
    """Raised when a selection, trial or runtime operation fails; ``kind`` says which class of failure."""

    fields = ("kind", "message")

    def __init__(self, kind: FailureKind | str, message: str) -> None:
        self.kind, self.message = FailureKind(kind), str(message)
        Exception.__init__(self, f"{self.kind.value}: {message}")

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "kind": self.kind.value}

    @classmethod
    def invalid(cls, message: str) -> TuneFailure:
        return cls(FailureKind.INVALID_INPUT, message)

    @classmethod
    def rejected(cls, message: str) -> TuneFailure:
        return cls(FailureKind.REJECTED, message)

    @classmethod
    def unavailable(cls, message: str) -> TuneFailure:
        return cls(FailureKind.UNAVAILABLE, message)

    @classmethod
    def device(cls, message: str) -> TuneFailure:
        return cls(FailureKind.DEVICE, message)


class DeviceBusy(FarmError):
    """Raised when a device's lock cannot be taken: the controller answers BUSY, never quarantines for it."""


class ConfigError(FarmError):
    """Raised when a configuration file, catalog or environment variable is malformed; names where and what."""

    fields = ("source", "field", "value", "problem")

    def __init__(self, source: str, field: str, value: Any, problem: str) -> None:
        super().__init__(f"{source}: field {field!r} = {value!r}: {problem}")
        self.source, self.field, self.value, self.problem = source, field, value, problem

    def to_dict(self) -> dict[str, Any]:
        plain = isinstance(self.value, (str, int, float, bool, type(None)))
        return {**super().to_dict(), "value": self.value if plain else repr(self.value)}


class ProtocolError(FarmError, ValueError):
    """Raised when a message does not follow the protocol (wrong version, missing or mistyped field)."""


class CorruptRecord(FarmError):
    """Raised when a stored record cannot be trusted: unreadable, wrong schema, bad checksum or mismatched key."""


class ArchiveError(FarmError):
    """Raised when an archive cannot be written or trusted; the message names the file, row and field."""


class ValidationUnavailable(FarmError):
    """Raised when the reference's output cannot be validated (UNSUPPORTED) while validation is required."""


class ReplayFailure(FarmError, RuntimeError):
    """Raised when a replayed config fails as its recording says (a candidate's failure: never a winner)."""


class RestrictionError(FarmError, ValueError):
    """Raised when a space's restriction cannot be evaluated for a config (a zero division, a value out of bounds)."""


class CudaToolError(FarmError):
    """Raised when the CUDA build tools the farm checks kernels with (NVRTC, the cubin reader) cannot do their job."""


class NvrtcUnavailable(CudaToolError, RuntimeError):
    """Raised when libnvrtc cannot be found or loaded."""


class NvrtcError(CudaToolError, RuntimeError):
    """Raised when NVRTC rejects a program; the message carries the program's log."""


class CubinError(CudaToolError, ValueError):
    """Raised when bytes are not a cubin the reader understands."""
