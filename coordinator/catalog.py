"""Catalogs: which operations and workloads to tune, and with which policy (TOML, see docs/catalog.md).

Loading validates everything before anything is enqueued: an error names the file, the problem and the field.
"""

from __future__ import annotations

import contextlib
import math
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from farm.decisions import canonical_json
from farm.errors import ConfigError, TuneFailure
from farm.jsontypes import JSONObject
from farm.policy import StackPolicy
from farm_coordinator.weights import apply_table, parse_weight

TOP_LEVEL = {"policy", "problems", "weights"}
PROBLEM_FIELDS = {"operation", "devices", "workloads"}
RECORDED_FIELDS = {"recording", "weight"}
WEIGHT_FIELD = "weight"
"""A workload's weight in the catalog: beside its spec's fields, never part of the spec (nor the problem id)."""
DEVICE_KINDS = ("cpu", "cuda")
RUN_BUDGET = "run_budget"
"""The [policy] field of the run's budget in device seconds: the run's, never part of a problem's policy."""


@dataclass(frozen=True)
class Workload:
    """One (operation, workload spec) of the catalog; ``where`` locates it in the file for messages. ``spec`` is
    the spec as written (labels, reports); :attr:`normalized` is it with every default filled in."""

    operation: str
    devices: tuple[str, ...]
    spec: JSONObject
    where: str
    filled: JSONObject | None = field(default=None, compare=False, repr=False)
    """The normalized spec, when the maker has it (a catalog normalizes every workload once, at load)."""
    fingerprint: str = ""
    """Planned only on this fingerprint digest (a recorded problem: its recording's workers); empty: any."""
    weight: float = field(default=1.0, compare=False)
    """How much fleet time the problem is worth per hour, relative to the catalog's other problems: its calls per
    hour times its seconds per call at the reference when known (so a budget goes where the fleet saves the most),
    1.0 when nothing says. Finite and > 0. Not part of the problem's identity: no id or cache key depends on it."""

    @cached_property
    def normalized(self) -> JSONObject:
        """The spec with every default filled in: what identifies the problem (``seed = 0`` spelled out or left
        out is one problem) and what its group tasks carry to the workers. A workload made without it (by hand,
        from a fleet report) is normalized here, once."""
        if self.filled is not None:
            return self.filled
        from farm_kernels import registry

        return registry.get(self.operation).normalize(self.spec, self.where)


@dataclass(frozen=True)
class Catalog:
    path: str
    policy: StackPolicy
    workloads: tuple[Workload, ...]
    kernels: tuple[str, ...] = ()
    run_budget: float | None = None
    """Device seconds the whole run may spend (``[policy] run_budget``, ``farm tune --budget-device-seconds``;
    ``farm_coordinator.runbudget``); None: no limit but each problem's own ``budget``."""


def workload_label(operation: str, spec: Any) -> str:
    """The one way every command writes a workload: the operation's own label (``m=64 n=64 k=64 float32``),
    or ``key=value`` pairs in the spec's order for an operation this process does not know."""
    from farm_kernels import registry

    if not isinstance(spec, dict):
        return str(spec)
    from farm_kernels import recorded

    replayed = recorded.label(operation, spec)
    if replayed is not None:
        return replayed
    with contextlib.suppress(Exception):  # a broken plugin must not stop a listing
        registry.ensure_loaded()
    if operation in registry.names():
        with contextlib.suppress(Exception):
            label: str = registry.get(operation).label(spec)
            return label
    # As Operation.label writes it: text values (dtype, layout choices) bare, after the sizes.
    sizes = [f"{k}={v}" for k, v in spec.items() if not isinstance(v, str)]
    return " ".join(sizes + [v for v in spec.values() if isinstance(v, str)])


def load_catalog(path: Path | str, kernels: tuple[str, ...] = (), *, policy_only: bool = False,
                 weights: bool = True) -> Catalog:
    """Parse and validate a catalog file; ConfigError names file, problem and field of the first problem.
    ``policy_only``: a file without ``problems`` is valid (``farm tune --from-fleet`` takes only its policy).
    ``weights=False``: leave the ``[weights]`` file unread (``farm catalog weights`` writes it)."""
    from farm_kernels import registry

    source = str(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ConfigError(source, "<file>", source, "no such file") from e
    except UnicodeDecodeError as e:
        raise ConfigError(source, "<file>", None, f"not UTF-8 text (byte {e.start} is 0x{e.object[e.start]:02x}): "
                                                  f"a catalog is a TOML file") from e
    except OSError as e:
        raise ConfigError(source, "<file>", source, f"cannot read: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, "<toml>", None, f"not valid TOML: {e}") from e
    registry.ensure_loaded(kernels)
    unknown = sorted(set(data) - TOP_LEVEL)
    if unknown:
        raise ConfigError(source, unknown[0], data[unknown[0]], f"unknown top-level key (expected {sorted(TOP_LEVEL)})")
    policy_table = data.get("policy", {})
    if not isinstance(policy_table, dict):
        raise ConfigError(source, "policy", policy_table, "must be a table")
    run_budget = parse_run_budget(policy_table.get(RUN_BUDGET), source, f"policy.{RUN_BUDGET}")
    policy_table = {k: v for k, v in policy_table.items() if k != RUN_BUDGET}  # the run's, not each problem's
    try:
        policy = StackPolicy.from_dict(policy_table)
    except TuneFailure as e:
        raise ConfigError(source, "policy", policy_table, e.message) from e
    except (TypeError, ValueError, OverflowError) as e:  # a value no policy field can hold (found by fuzzing)
        raise ConfigError(source, "policy", policy_table, f"invalid value: {e}") from e
    problems = data.get("problems")
    if policy_only and problems is None:
        return Catalog(source, policy, (), kernels, run_budget)
    if not isinstance(problems, list) or not problems:
        raise ConfigError(source, "problems", problems, "must be a non-empty array of tables ([[problems]])")
    workloads: list[Workload] = []
    seen: dict[tuple[str, str, str], str] = {}
    explicit: set[str] = set()  # the workloads with their own weight field
    for i, problem in enumerate(problems):
        where = f"problems[{i}]"
        if not isinstance(problem, dict):
            raise ConfigError(source, where, problem, "must be a table")
        if "recording" in problem:
            workloads.append(_recorded(problem, source, where, seen))
            if WEIGHT_FIELD in problem:
                explicit.add(where)
            continue
        extra = sorted(set(problem) - PROBLEM_FIELDS)
        if extra:
            raise ConfigError(source, f"{where}.{extra[0]}", problem[extra[0]], f"unknown field (expected {sorted(PROBLEM_FIELDS)})")
        name = problem.get("operation")
        if not isinstance(name, str) or not name:
            raise ConfigError(source, f"{where}.operation", name, "must be an operation name")
        if name not in registry.names():
            raise ConfigError(source, f"{where}.operation", name, f"unknown operation (known: {', '.join(sorted(registry.names()))})")
        operation = registry.get(name)
        devices = problem.get("devices")
        if devices is not None:
            if not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices):
                raise ConfigError(source, f"{where}.devices", devices, "must be a non-empty list of device kinds")
            for d in devices:
                if d not in operation.devices:
                    raise ConfigError(source, f"{where}.devices", d, f"{name} supports {list(operation.devices)}")
        specs = problem.get("workloads")
        if not isinstance(specs, list) or not specs:
            raise ConfigError(source, f"{where}.workloads", specs, "must be a non-empty array of tables")
        for j, spec in enumerate(specs):
            at = f"{where}.workloads[{j}]"
            if not isinstance(spec, dict):
                raise ConfigError(source, at, spec, "must be a table")
            weight = 1.0
            if WEIGHT_FIELD in spec:
                weight = parse_weight(spec[WEIGHT_FIELD], source, f"{at}.{WEIGHT_FIELD}")
                explicit.add(at)
                spec = {k: v for k, v in spec.items() if k != WEIGHT_FIELD}
            # Without explicit devices, a workload runs on every kind that accepts its dtype.
            kinds = tuple(devices) if devices is not None else operation.devices_for(spec) or operation.devices
            # Duplicates are found on the spec with every default filled in: `seed = 0` spelled out is the same
            # workload (and the same cache key) as `seed` left out.
            try:
                normalized = operation.normalize(spec, source, devices=kinds, prefix=at)
            except (TypeError, ValueError, OverflowError) as e:  # found by fuzzing: values of unexpected types
                raise ConfigError(source, at, spec, f"invalid workload: {type(e).__name__}: {e}") from e
            for kind in kinds:
                identity = (name, canonical_json(normalized), kind)
                if identity in seen:
                    raise ConfigError(source, at, spec, f"duplicates {seen[identity]} on {kind}")
                seen[identity] = at
            workloads.append(Workload(name, kinds, dict(spec), at, filled=normalized, weight=weight))
    if "weights" in data and weights:  # [weights] file = "...": imported weights (farm catalog weights)
        workloads = apply_table(data["weights"], source, workloads, explicit)
    return Catalog(source, policy, tuple(workloads), tuple(kernels), run_budget)


def _recorded(problem: dict[str, Any], source: str, where: str, seen: dict[tuple[str, str, str], str]) -> Workload:
    """A problem naming a recording (``farm_kernels.recorded``): its space on its recording's workers only."""
    from farm_kernels import recorded

    extra = sorted(set(problem) - RECORDED_FIELDS)
    if extra:
        raise ConfigError(source, f"{where}.{extra[0]}", problem[extra[0]],
                          f"a recorded problem has only {sorted(RECORDED_FIELDS)}")
    recording = recorded.load_for_catalog(problem["recording"], source, f"{where}.recording")
    name, spec = recorded.add(recording), recorded.spec_of(recording)
    identity = (name, canonical_json(spec), recorded.KIND)
    if identity in seen:
        raise ConfigError(source, f"{where}.recording", problem["recording"], f"duplicates {seen[identity]}")
    seen[identity] = where
    weight = parse_weight(problem[WEIGHT_FIELD], source, f"{where}.{WEIGHT_FIELD}") if WEIGHT_FIELD in problem else 1.0
    return Workload(name, (recorded.KIND,), {"recording": problem["recording"]}, where, filled=spec,
                    fingerprint=recorded.fingerprint_of(recording), weight=weight)


def parse_run_budget(value: Any, source: str, where: str) -> float | None:
    """``[policy] run_budget``: the device seconds the whole run may spend, a finite number > 0; None when the
    catalog gives none. Anything else is a ConfigError naming ``source``, ``where`` and the value."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(source, where, value, "must be a number of device seconds > 0")
    return float(value)
