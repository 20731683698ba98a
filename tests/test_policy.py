"""The policy: SEMANTICS.md's defaults and valid ranges, and the accuracy key that names a decision."""

from __future__ import annotations

import dataclasses
import math

import pytest

from farm.errors import FailureKind, TuneFailure
from farm.policy import DAY, Mode, StackPolicy, Timing, Tolerance


@pytest.mark.parametrize(
    ("field", "default"),
    [
        ("mode", Mode.EXPLORE),
        ("timing", Timing.END_TO_END),
        ("require_validation", True),
        ("tolerance", Tolerance(1e-4, 1e-3, 64 << 20)),
        ("warmups", 2),
        ("samples", 7),
        ("max_candidates", 32),
        ("budget", 30.0),
        ("min_speedup", 1.05),
        ("max_relative_mad", 0.15),
        ("workspace_limit", None),
        ("capacity", 1024),
        ("ttl", 7 * 86400.0),
        ("max_parallel_tunes", 1),
        ("regression_pairs", 7),
        ("regression_ratio", 1.15),
    ],
)
def test_every_policy_default_matches_the_semantics_table(field: str, default: object) -> None:
    assert getattr(StackPolicy(), field) == default


def test_the_tolerance_defaults_are_abs_1e_4_rel_1e_3_and_64_mib() -> None:
    assert (Tolerance().absolute, Tolerance().relative, Tolerance().max_bytes) == (1e-4, 1e-3, 64 * 1024 * 1024)


def test_the_default_policy_is_valid_and_validate_returns_it() -> None:
    policy = StackPolicy()
    assert policy.validate() is policy


def test_a_week_is_seven_days_of_seconds() -> None:
    assert StackPolicy().ttl == DAY * 7


OUT_OF_RANGE = [
    ("mode", "explore"),
    ("timing", "device"),
    ("require_validation", 1),
    ("tolerance", 1e-4),
    ("warmups", 0),
    ("warmups", 101),
    ("warmups", 2.0),
    ("warmups", True),
    ("samples", 1),
    ("samples", 4),
    ("samples", 103),
    ("samples", 7.0),
    ("max_candidates", 0),
    ("max_candidates", 4097),
    ("budget", 0.0),
    ("budget", -1.0),
    ("budget", math.inf),
    ("budget", math.nan),
    ("budget", "30"),
    ("min_speedup", 0.99),
    ("min_speedup", math.inf),
    ("min_speedup", math.nan),
    ("max_relative_mad", -0.01),
    ("max_relative_mad", math.nan),
    ("max_relative_mad", math.inf),
    ("workspace_limit", -1),
    ("workspace_limit", 1.5),
    ("workspace_limit", True),
    ("capacity", 0),
    ("capacity", 65537),
    ("ttl", 0.0),
    ("ttl", -5.0),
    ("ttl", math.inf),
    ("max_parallel_tunes", 0),
    ("max_parallel_tunes", 257),
    ("regression_pairs", 2),
    ("regression_pairs", 8),
    ("regression_pairs", 103),
    ("regression_ratio", 1.0),
    ("regression_ratio", 0.5),
    ("regression_ratio", math.nan),
]


@pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE)
def test_an_out_of_range_field_is_invalid_input_naming_the_field_and_value(field: str, value: object) -> None:
    policy = dataclasses.replace(StackPolicy(), **{field: value})
    with pytest.raises(TuneFailure) as info:
        policy.validate()
    assert info.value.kind is FailureKind.INVALID_INPUT
    assert f"policy.{field}" in info.value.message
    assert repr(value) in info.value.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("absolute", -1e-9),
        ("absolute", math.nan),
        ("absolute", math.inf),
        ("absolute", True),
        ("relative", -0.5),
        ("relative", math.inf),
        ("relative", "0.1"),
        ("max_bytes", 0),
        ("max_bytes", -1),
        ("max_bytes", 1.5),
        ("max_bytes", True),
    ],
)
def test_an_out_of_range_tolerance_is_invalid_input_naming_the_field_and_value(field: str, value: object) -> None:
    policy = StackPolicy(tolerance=dataclasses.replace(Tolerance(), **{field: value}))
    with pytest.raises(TuneFailure) as info:
        policy.validate()
    assert info.value.kind is FailureKind.INVALID_INPUT
    assert f"policy.tolerance.{field}" in info.value.message
    assert repr(value) in info.value.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("warmups", 1),
        ("warmups", 100),
        ("samples", 3),
        ("samples", 101),
        ("max_candidates", 1),
        ("max_candidates", 4096),
        ("budget", 1e-9),
        ("min_speedup", 1.0),
        ("min_speedup", 1),
        ("max_relative_mad", 0.0),
        ("workspace_limit", 0),
        ("capacity", 1),
        ("capacity", 65536),
        ("max_parallel_tunes", 256),
        ("regression_pairs", 3),
        ("regression_pairs", 101),
        ("regression_ratio", 1.0001),
        ("require_validation", False),
        ("mode", Mode.DISABLED),
        ("timing", Timing.DEVICE),
        ("tolerance", Tolerance(0.0, 0.0, 1)),
    ],
)
def test_a_value_on_the_boundary_of_its_range_is_accepted(field: str, value: object) -> None:
    policy = dataclasses.replace(StackPolicy(), **{field: value})
    assert policy.validate() is policy


def test_the_accuracy_key_is_the_same_for_every_mode() -> None:
    keys = {StackPolicy(mode=mode).accuracy_key() for mode in Mode}
    assert len(keys) == 1


@pytest.mark.parametrize(
    "changes",
    [
        {"timing": Timing.DEVICE},
        {"require_validation": False},
        {"tolerance": Tolerance(absolute=2e-4)},
        {"tolerance": Tolerance(relative=2e-3)},
        {"tolerance": Tolerance(max_bytes=1 << 20)},
        {"workspace_limit": 0},
        {"workspace_limit": 1 << 30},
        {"min_speedup": 1.1},
        {"max_relative_mad": 0.2},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_the_accuracy_key_changes_with_each_accuracy_field(changes: dict[str, object]) -> None:
    assert StackPolicy(**changes).accuracy_key() != StackPolicy().accuracy_key()  # type: ignore[arg-type]


def test_the_accuracy_key_is_the_same_for_an_integer_and_the_equal_float() -> None:
    written_as_ints = StackPolicy(min_speedup=2, max_relative_mad=0, tolerance=Tolerance(0, 1, 64))
    written_as_floats = StackPolicy(min_speedup=2.0, max_relative_mad=0.0, tolerance=Tolerance(0.0, 1.0, 64))
    assert written_as_ints.accuracy_key() == written_as_floats.accuracy_key()


def test_a_policy_round_trips_through_its_dict() -> None:
    policy = StackPolicy(mode=Mode.CACHE_ONLY, timing=Timing.DEVICE, tolerance=Tolerance(0.5, 0.25, 99), workspace_limit=7)
    assert StackPolicy.from_dict(policy.to_dict()) == policy


def test_from_dict_rejects_an_unknown_field_by_name() -> None:
    with pytest.raises(TuneFailure) as info:
        StackPolicy.from_dict({"sampels": 7})
    assert info.value.kind is FailureKind.INVALID_INPUT
    assert "'sampels'" in info.value.message


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"mode": "fast"}, "fast"),
        ({"timing": "cpu"}, "cpu"),
        ({"tolerance": 3}, "tolerance"),
        ({"tolerance": {"absolute": 1.0, "typo": 2}}, "typo"),
        ({"samples": 8}, "policy.samples"),
    ],
)
def test_from_dict_rejects_a_bad_value_with_invalid_input_naming_it(data: dict[str, object], named: str) -> None:
    with pytest.raises(TuneFailure) as info:
        StackPolicy.from_dict(data)
    assert info.value.kind is FailureKind.INVALID_INPUT
    assert named in info.value.message


def test_a_tolerance_round_trips_through_its_dict() -> None:
    tolerance = Tolerance(0.125, 0.5, 4096)
    assert Tolerance.from_dict(tolerance.to_dict()) == tolerance


def test_replace_returns_a_changed_copy() -> None:
    policy = StackPolicy()
    changed = policy.replace(samples=9)
    assert (changed.samples, policy.samples) == (9, 7)
