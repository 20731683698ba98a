"""The controller's policy: every knob of SEMANTICS.md with its default and valid range."""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field

from farm.encoding import fields, split_fields
from farm.errors import FarmError, TuneFailure
from farm.trustedkeys import parse_public_key


class Mode(enum.Enum):
    """What a miss does: search (EXPLORE), fall back to the reference (CACHE_ONLY), or never tune (DISABLED)."""

    EXPLORE = "explore"
    CACHE_ONLY = "cache_only"
    DISABLED = "disabled"


class Timing(enum.Enum):
    """What a sample measures: wall clock of the whole call, or the device's own profile of the work."""

    END_TO_END = "end_to_end"
    DEVICE = "device"


class MemoryEviction(enum.Enum):
    """Which in-memory record goes when the capacity is reached."""

    FIFO = "fifo"
    LRU = "lru"


@dataclass(frozen=True)
class Tolerance:
    """Output comparison limits: ``|actual - expected| <= absolute + relative * |expected|``. Validation is
    UNSUPPORTED (not attempted) when reference and candidate outputs together exceed ``max_bytes``."""

    absolute: float = 1e-4
    relative: float = 1e-3
    max_bytes: int = 64 << 20

    def validate(self, where: str = "tolerance") -> None:
        for name, value in (("absolute", self.absolute), ("relative", self.relative)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise TuneFailure.invalid(f"{where}.{name} must be finite and >= 0, got {value!r}")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes <= 0:
            raise TuneFailure.invalid(f"{where}.max_bytes must be a positive integer, got {self.max_bytes!r}")

    def to_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, float | int]) -> Tolerance:
        return cls(float(data["absolute"]), float(data["relative"]), int(data["max_bytes"]))


DAY = 86400.0
STRATEGIES = ("exhaustive", "random", "bayes", "local")
SCREENINGS = ("race", "full")


@dataclass(frozen=True)
class AccuracyKey:
    """The accuracy part of a cache key, with named parts: the policy settings that change what a decision means.
    :meth:`encode` gives the text stored in cache keys; ``tolerance`` is (absolute, relative, max_bytes)."""

    timing: str
    require_validation: bool
    tolerance: tuple[float, float, int]
    workspace_limit: int | None
    min_speedup: float
    max_relative_mad: float

    @classmethod
    def of(cls, policy: StackPolicy) -> AccuracyKey:
        t = policy.tolerance
        # float(): a setting written as 1 or 1.0 (TOML, JSON) means the same thing and must name the same key.
        return cls(policy.timing.value, policy.require_validation,
                   (float(t.absolute), float(t.relative), int(t.max_bytes)), policy.workspace_limit,
                   float(policy.min_speedup), float(policy.max_relative_mad))

    def encode(self) -> str:
        a, r, m = self.tolerance
        return fields(["timing=" + self.timing, f"require_validation={self.require_validation}",
                       f"tolerance={a!r},{r!r},{m}", f"workspace_limit={self.workspace_limit}",
                       f"min_speedup={self.min_speedup!r}", f"max_relative_mad={self.max_relative_mad!r}"])

    @classmethod
    def decode(cls, text: str) -> AccuracyKey:
        """Read an encoded accuracy key; ValueError names the part that is missing or malformed."""
        parts: dict[str, str] = {}
        for part in split_fields(text):
            name, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"accuracy key part {part!r} is not name=value")
            parts[name] = value
        names = tuple(f.name for f in dataclasses.fields(cls))
        if tuple(parts) != names:
            raise ValueError(f"accuracy key has parts {list(parts)}, expected {list(names)}")
        try:
            a, r, m = parts["tolerance"].split(",")
            limit = parts["workspace_limit"]
            key = cls(parts["timing"], parts["require_validation"] == "True", (float(a), float(r), int(m)),
                      None if limit == "None" else int(limit), float(parts["min_speedup"]),
                      float(parts["max_relative_mad"]))
        except ValueError as e:
            raise ValueError(f"accuracy key {text!r} is malformed: {e}") from e
        if key.encode() != text:
            raise ValueError(f"accuracy key {text!r} is not in canonical form")
        return key


@dataclass(frozen=True)
class StackPolicy:
    """How the controller searches, validates, caches and invalidates (durations in float seconds).

    :meth:`validate` (the controller calls it) raises INVALID_INPUT naming an out-of-range field and value.
    Each field's meaning, default and range: docs/contract.md ("Policy"), docs/catalog.md ("[policy]"),
    docs/decisions.md. Only the :class:`AccuracyKey` fields change what a decision means (the cache key's).
    """

    mode: Mode = Mode.EXPLORE
    timing: Timing = Timing.END_TO_END
    require_validation: bool = True
    tolerance: Tolerance = field(default_factory=Tolerance)
    warmups: int = 2
    samples: int = 7
    max_samples: int | None = None
    max_candidates: int = 32
    budget: float = 30.0
    min_speedup: float = 1.05
    max_relative_mad: float = 0.15
    workspace_limit: int | None = None
    capacity: int = 1024
    ttl: float = 7 * DAY
    max_parallel_tunes: int = 1
    regression_pairs: int = 7
    regression_ratio: float = 1.15
    max_disturbed: float = 0.5
    require_confirmation: bool = False
    strategy: str = "exhaustive"
    max_configs: int | None = None
    seed: int = 0
    screening: str = "race"
    nearest: bool = True
    max_distance: float = 3.0
    trusted_keys: tuple[str, ...] = ()

    def validate(self) -> StackPolicy:
        """Check every field's range; return self so it chains."""

        def bad(name: str, rule: str) -> TuneFailure:
            return TuneFailure.invalid(f"policy.{name} {rule}, got {getattr(self, name)!r}")

        def integer(name: str, low: int, high: int, odd: bool = False) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise bad(name, f"must be an integer in {low}..{high}")
            if odd and value % 2 == 0:
                raise bad(name, f"must be odd in {low}..{high}")

        def real(name: str, minimum: float, strict: bool = False) -> None:
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and (value > minimum if strict else value >= minimum)
            if not ok:
                raise bad(name, f"must be finite and {'>' if strict else '>='} {minimum}")

        kinds = (("mode", Mode), ("timing", Timing), ("require_validation", bool),
                 ("require_confirmation", bool), ("nearest", bool), ("tolerance", Tolerance))
        for name, kind in kinds:
            if not isinstance(getattr(self, name), kind):
                raise bad(name, f"must be a {kind.__name__}")
        self.tolerance.validate("policy.tolerance")
        if not (isinstance(self.trusted_keys, tuple) and all(isinstance(k, str) for k in self.trusted_keys)):
            raise bad("trusted_keys", "must be a tuple of public key lines")
        for i, line in enumerate(self.trusted_keys):
            try:
                parse_public_key(line, f"policy.trusted_keys[{i}]")
            except FarmError as e:
                raise TuneFailure.invalid(str(e)) from None
        integer("warmups", 1, 100)
        integer("samples", 3, 101, odd=True)
        if self.max_samples is not None:
            integer("max_samples", self.samples, 1001, odd=True)
        integer("max_candidates", 1, 4096)
        real("budget", 0.0, strict=True)
        real("min_speedup", 1.0)
        real("max_relative_mad", 0.0)
        limit = self.workspace_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise bad("workspace_limit", "must be None or an integer >= 0")
        integer("capacity", 1, 65536)
        real("ttl", 0.0, strict=True)
        integer("max_parallel_tunes", 1, 256)
        integer("regression_pairs", 3, 101, odd=True)
        real("regression_ratio", 1.0, strict=True)
        real("max_disturbed", 0.0)
        if self.max_disturbed > 1.0:
            raise bad("max_disturbed", "must be a fraction in 0..1")
        if self.strategy not in STRATEGIES:
            raise bad("strategy", f"must be one of {', '.join(STRATEGIES)}")
        if self.max_configs is not None:
            integer("max_configs", 1, 1 << 40)
        integer("seed", 0, (1 << 63) - 1)
        if self.screening not in SCREENINGS:
            raise bad("screening", f"must be one of {', '.join(SCREENINGS)}")
        real("max_distance", 0.0)
        return self

    @property
    def sample_limit(self) -> int:
        """The most pairs one candidate may take: ``max_samples``, else ``4 * samples + 1`` capped at 101."""
        if self.max_samples is not None:
            return self.max_samples
        return max(self.samples, min(4 * self.samples + 1, 101))

    def accuracy_key(self) -> str:
        """The encoded :class:`AccuracyKey` (not the mode: an EXPLORE cache serves CACHE_ONLY deployments)."""
        return AccuracyKey.of(self).encode()

    def replace(self, **changes: object) -> StackPolicy:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "mode": self.mode.value, "timing": self.timing.value}

    @classmethod
    def from_dict(cls, data: dict[str, object], where: str = "policy") -> StackPolicy:
        """Build a policy from JSON-like data; unknown fields or wrong values name the field."""
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TuneFailure.invalid(f"{where}: unknown field {unknown[0]!r}")
        values: dict[str, object] = dict(data)
        try:
            if isinstance(values.get("trusted_keys"), list):
                values["trusted_keys"] = tuple(values["trusted_keys"])  # type: ignore[arg-type]
            for name, kind in (("mode", Mode), ("timing", Timing)):
                if name in values:
                    values[name] = kind(values[name])
            tol = values.get("tolerance", {})  # absent: the default Tolerance()
            if not isinstance(tol, dict):
                raise TuneFailure.invalid(f"{where}.tolerance must be a table, got {tol!r}")
            values["tolerance"] = Tolerance(**tol)
        except (ValueError, TypeError) as e:
            raise TuneFailure.invalid(f"{where}: {e}") from e
        return cls(**values).validate()  # type: ignore[arg-type]
