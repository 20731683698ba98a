"""Arrays: exact workload signatures, layout-preserving isolated clones, and output validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.lib.stride_tricks import as_strided

from farm.arrays import OutputCheck, array_key, array_signature, clone, compare_outputs
from farm.policy import Tolerance

TOL = Tolerance(absolute=1e-4, relative=1e-3)
BASE = np.arange(120, dtype=np.float64)


# -- signatures ------------------------------------------------------------------------------------------------

SAME_SIGNATURE_NEVER = [
    ("shape", np.zeros((4, 6)), np.zeros((6, 4))),
    ("dtype", np.zeros(8, np.float32), np.zeros(8, np.float64)),
    ("byte order", np.zeros(8, "<f4"), np.zeros(8, ">f4")),
    ("strides", np.zeros((4, 6)), np.zeros((6, 4)).T),
    ("a strided view", BASE[:10], BASE[::2][:10]),
    ("whole and partial element strides", BASE[:4], as_strided(BASE, (4,), (12,))),
    ("scalar type", 1, 1.0),
    ("scalar value", 3, 4),
    ("bool and int", True, 1),
    ("array and scalar", np.array(1.0), 1.0),
]


@pytest.mark.parametrize(("case", "a", "b"), SAME_SIGNATURE_NEVER, ids=[c[0] for c in SAME_SIGNATURE_NEVER])
def test_two_workloads_that_differ_never_share_a_signature(case: str, a: object, b: object) -> None:
    assert array_signature(a) != array_signature(b)


def test_a_signature_names_dtype_shape_and_element_strides() -> None:
    assert array_signature(np.zeros((2, 3), np.float32), 5, "mode", None) == "numpy:<f4(2, 3)s(3, 1);int=5;str='mode';NoneType=None"


def test_equal_workloads_share_a_signature_whatever_their_values() -> None:
    assert array_signature(np.zeros((3, 3)), 2) == array_signature(np.ones((3, 3)), 2)


def test_a_signature_refuses_an_argument_it_cannot_describe_exactly() -> None:
    with pytest.raises(TypeError, match="dict"):
        array_signature({"a": 1})


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
arrays = st.builds(
    lambda shape, dtype, order, step: np.zeros(shape, dtype, order=order)[..., ::step],
    shapes,
    st.sampled_from([np.float32, np.float64, np.int32, np.complex64]),
    st.sampled_from(["C", "F"]),
    st.integers(1, 2),
)
arguments = st.lists(st.one_of(arrays, st.integers(-3, 3), st.booleans(), st.sampled_from([0.5, 1.0, "x"])), max_size=3)


@given(arguments, arguments)
def test_the_cheap_key_separates_every_pair_of_workloads_the_signature_separates(a: list[object], b: list[object]) -> None:
    if array_signature(*a) != array_signature(*b):
        assert array_key(*a) != array_key(*b)
    else:
        assert array_key(*a) == array_key(*b)


# -- clones ------------------------------------------------------------------------------------------------------

VIEWS = [
    ("C-contiguous", BASE.reshape(10, 12)),
    ("F-contiguous", np.asfortranarray(BASE.reshape(10, 12))),
    ("sliced rows", BASE.reshape(10, 12)[2:7]),
    ("every other column", BASE.reshape(10, 12)[:, ::2]),
    ("transposed slice", BASE.reshape(10, 12)[1:, 3:].T),
    ("reversed", BASE[::-3]),
    ("broadcast", np.broadcast_to(BASE[:12], (5, 12))),
    ("as_strided windows", as_strided(BASE, (20, 5), (48, 8))),
    ("as_strided gaps", as_strided(BASE, (10,), (80,))),
    ("as_strided reversed gaps", as_strided(BASE[100:], (6, 3), (-80, 16))),
    ("empty", BASE[5:5]),
    ("zero-dimensional", np.array(3.5)),
]


@pytest.mark.parametrize(("case", "view"), VIEWS, ids=[v[0] for v in VIEWS])
def test_a_clone_has_the_same_values_dtype_shape_and_strides_in_fresh_memory(case: str, view: np.ndarray) -> None:
    copy = clone(view)
    assert np.array_equal(copy, view)
    assert (copy.dtype, copy.shape) == (view.dtype, view.shape)
    assert copy.strides == view.strides or view.size == 0  # an empty array has no layout to keep
    assert not np.shares_memory(copy, BASE)


def test_writing_to_a_clone_never_touches_the_original() -> None:
    original = BASE.reshape(10, 12)[:, ::3].copy()[:, ::1]
    snapshot = original.copy()
    copy = clone(original)
    copy[...] = -1.0
    assert np.array_equal(original, snapshot)


def test_clone_recurses_into_tuples_and_lists_and_keeps_scalars() -> None:
    x = np.ones(3)
    cloned = clone((x, [x, 2], "s"))
    assert isinstance(cloned, tuple) and isinstance(cloned[1], list)
    assert cloned[0] is not x and cloned[1][0] is not x and cloned[0] is not cloned[1][0]
    assert cloned[1][1] == 2 and cloned[2] == "s"


# -- output validation -------------------------------------------------------------------------------------------


def check(expected: object, actual: object, tolerance: Tolerance = TOL) -> OutputCheck:
    return compare_outputs(expected, actual, tolerance)


def test_equal_outputs_pass_with_zero_error() -> None:
    result = check(np.ones(4), np.ones(4))
    assert result.passed and (result.max_abs_error, result.max_rel_error) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("expected", "actual", "passes"),
    [
        (0.0, 1e-4, True),  # exactly the absolute tolerance
        (0.0, 1.01e-4, False),
        (1000.0, 1000.0 + 1e-4 + 1.0, True),  # absolute + relative * |expected|
        (1000.0, 1000.0 + 1e-4 + 1.001, False),
        (-5.0, -5.0 - 0.004, True),
    ],
)
def test_values_pass_within_absolute_plus_relative_tolerance(expected: float, actual: float, passes: bool) -> None:
    assert check(np.array([expected]), np.array([actual])).passed is passes


@pytest.mark.parametrize(
    ("case", "expected", "actual", "says"),
    [
        ("NaN", np.ones(3), np.array([1.0, math.nan, 1.0]), "NaN or Inf"),
        ("Inf", np.ones(3), np.array([1.0, math.inf, 1.0]), "NaN or Inf"),
        ("NaN in the reference", np.array([math.nan]), np.array([1.0]), "reference output contains NaN"),
        ("complex NaN", np.ones(2, np.complex64), np.array([1, complex(1, math.nan)], np.complex64), "NaN or Inf"),
        ("wrong shape", np.ones((2, 3)), np.ones((3, 2)), "shape (3, 2) != reference shape (2, 3)"),
        ("wrong dtype", np.ones(3), np.ones(3, np.float32), "dtype float32 != reference dtype float64"),
        ("not an array", np.ones(3), None, "expected an array"),
        ("wrong values", np.ones(3), np.array([1.0, 2.0, 1.0]), "values differ beyond tolerance"),
        ("tuple too short", (np.ones(2), np.ones(2)), (np.ones(2),), "expected a sequence of 2"),
        ("tuple expected", (np.ones(2),), np.ones(2), "expected a sequence of 1"),
        ("second leaf wrong", (np.ones(2), np.ones(2)), (np.ones(2), np.zeros(2)), "output[1]"),
        ("integers differ", np.arange(4), np.arange(4) + 1, "values differ"),
    ],
)
def test_a_wrong_output_is_a_problem_never_unsupported(case: str, expected: object, actual: object, says: str) -> None:
    result = check(expected, actual)
    assert result.supported is True
    assert result.problem is not None and says in result.problem
    assert not result.passed


def test_tuples_of_arrays_pass_and_report_the_worst_leaf() -> None:
    result = check((np.ones(2), np.full(2, 10.0)), (np.ones(2), np.full(2, 10.005)))
    assert result.passed and result.max_abs_error == pytest.approx(0.005)


def test_empty_outputs_of_equal_shape_pass() -> None:
    assert check(np.ones((0, 3)), np.ones((0, 3))).passed


def test_a_readback_above_max_bytes_is_unsupported_rather_than_compared() -> None:
    big = np.zeros(64)  # 512 bytes each, 1024 together
    result = check(big, big + 1.0, Tolerance(max_bytes=1023))
    assert (result.supported, result.problem, result.passed) == (False, None, False)
    assert check(big, big, Tolerance(max_bytes=1024)).passed


def test_a_wrong_output_below_max_bytes_is_still_wrong() -> None:
    result = check(np.zeros(4), np.ones(4), Tolerance(max_bytes=64))
    assert result.supported and result.problem is not None
