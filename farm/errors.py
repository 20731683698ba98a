"""The farm's one error vocabulary.

`TuneFailure` carries the controller's failure kinds (the seed's vocabulary). Farm-level errors derive from
`FarmError`. Every error here can be rebuilt from its arguments (``__reduce__``, for libraries that copy
exceptions across processes) and round-trips through JSON (``to_dict``/``from_dict``), which is what our own
protocols use.
"""

from __future__ import annotations

import enum
from typing import Any


class FailureKind(enum.Enum):
    """Why the controller could not produce a decision."""

    INVALID_INPUT = "invalid_input"
    REJECTED = "rejected"
    UNAVAILABLE = "unavailable"
    DEVICE = "device"
    QUARANTINED = "quarantined"


class FarmError(Exception):
    """Raised when the farm (not a single tuning decision) cannot do what was asked; root of farm errors."""


class TuneFailure(FarmError):
    """Raised when a selection, trial or runtime operation fails; ``kind`` says which class of failure."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(f"{kind.value}: {message}")
        self.kind = kind
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.message))

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind.value, "message": self.message}

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> TuneFailure:
        return cls(FailureKind(data["kind"]), data["message"])

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
    """Raised when a device's lock cannot be taken (unusable lock folder, another user's lock file): the
    controller falls back to the reference (BUSY) and never quarantines the device for it."""


class ConfigError(FarmError):
    """Raised when a configuration file, catalog or environment variable is malformed; names where and what."""

    def __init__(self, source: str, field: str, value: Any, problem: str) -> None:
        super().__init__(f"{source}: field {field!r} = {value!r}: {problem}")
        self.source = source
        self.field = field
        self.value = value
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.source, self.field, self.value, self.problem))
