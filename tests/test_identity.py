"""Problem identity: the length-delimited encoding, the cache key, and the checks of selection step 1."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
from fakes import candidates, problem
from hypothesis import given
from hypothesis import strategies as st

from farm.errors import FailureKind, TuneFailure
from farm.identity import (
    DEFAULT_CONTEXT,
    MAX_KEY_BYTES,
    CacheKey,
    Candidate,
    OperationKey,
    Problem,
    Scope,
    cache_key,
    fields,
    fits_workspace,
    key_environment,
    manifest,
)
from farm.policy import AccuracyKey, Mode, StackPolicy, Timing, Tolerance

texts = st.text(max_size=12)


def decode(encoded: str) -> list[str]:
    """The inverse of ``fields``, written here so the property does not trust the code under test."""
    data = encoded.encode()
    parts, at = [], 0
    while at < len(data):
        colon = data.index(b":", at)
        length = int(data[at:colon])
        parts.append(data[colon + 1 : colon + 1 + length].decode())
        at = colon + 1 + length
    return parts


@given(st.lists(texts), st.lists(texts))
def test_fields_is_injective_on_lists_of_strings(a: list[str], b: list[str]) -> None:
    assert (fields(a) == fields(b)) == (a == b)


@given(st.lists(st.text()))
def test_fields_decodes_back_to_its_parts_for_any_unicode(parts: list[str]) -> None:
    assert decode(fields(parts)) == parts


@given(st.text(), st.text(), st.text())
def test_moving_a_boundary_between_two_fields_changes_the_encoding(a: str, b: str, c: str) -> None:
    if (a, b + c) != (a + b, c):
        assert fields([a, b + c]) != fields([a + b, c])


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (["ab", "c"], ["a", "bc"]),
        (["1:a"], ["1", "a"]),
        (["", ""], [""]),
        (["é"], ["e\u0301"]),
        (["日本", "語"], ["日", "本語"]),
        (["0:"], ["", ""]),
    ],
)
def test_fields_never_aliases_lookalike_lists(a: list[str], b: list[str]) -> None:
    assert fields(a) != fields(b)


def test_fields_counts_utf8_bytes() -> None:
    assert fields(["é", ""]) == "2:é0:"


# -- the cache key -----------------------------------------------------------------------------------------

BASE_PROBLEM = problem()
BASE_CANDIDATES = candidates("ref", "a", "b")
BASE_POLICY = StackPolicy()
BASE_KEY = cache_key(BASE_PROBLEM, BASE_CANDIDATES, 0, BASE_POLICY)

nonempty = st.text(min_size=1, max_size=20)
problem_changes = st.one_of(
    st.builds(lambda v: {"operation": v}, nonempty),
    st.builds(lambda v: {"environment": v}, nonempty),
    st.builds(lambda v: {"workload": v}, nonempty),
    st.builds(lambda v: {"execution_context": v}, nonempty),
    st.builds(lambda v: {"scope": v}, st.sampled_from(list(Scope))),
)


@given(problem_changes)
def test_the_cache_key_differs_when_any_problem_field_differs(change: dict[str, object]) -> None:
    changed = dataclasses.replace(BASE_PROBLEM, **change)
    if changed != BASE_PROBLEM:
        assert cache_key(changed, BASE_CANDIDATES, 0, BASE_POLICY) != BASE_KEY


def test_the_cache_key_ignores_persistence() -> None:
    assert cache_key(problem(persistent=True), BASE_CANDIDATES, 0, BASE_POLICY) == BASE_KEY


candidate_changes = st.one_of(
    st.builds(lambda v: {"name": v}, nonempty),
    st.builds(lambda v: {"revision": v}, nonempty),
    st.builds(lambda v: {"workspace_bytes": v}, st.none() | st.integers(0, 1 << 40)),
    st.builds(lambda v: {"eligible": v}, st.booleans()),
)


@given(st.integers(1, 2), candidate_changes)
def test_the_cache_key_differs_when_any_candidate_manifest_entry_differs(position: int, change: dict[str, object]) -> None:
    cands = list(BASE_CANDIDATES)
    cands[position] = dataclasses.replace(cands[position], **change)
    if cands == list(BASE_CANDIDATES) or len({c.name for c in cands}) < len(cands):
        return
    assert cache_key(BASE_PROBLEM, cands, 0, BASE_POLICY) != BASE_KEY


def test_the_cache_key_depends_on_candidate_order() -> None:
    swapped = (BASE_CANDIDATES[0], BASE_CANDIDATES[2], BASE_CANDIDATES[1])
    assert cache_key(BASE_PROBLEM, swapped, 0, BASE_POLICY) != BASE_KEY


@given(st.integers(1, 2))
def test_the_cache_key_differs_when_the_reference_differs(reference: int) -> None:
    assert cache_key(BASE_PROBLEM, BASE_CANDIDATES, reference, BASE_POLICY) != BASE_KEY


accuracy_changes = st.one_of(
    st.builds(lambda v: {"timing": v}, st.sampled_from(list(Timing))),
    st.builds(lambda v: {"require_validation": v}, st.booleans()),
    st.builds(
        lambda a, r, m: {"tolerance": Tolerance(a, r, m)},
        st.floats(0, 1, allow_nan=False),
        st.floats(0, 1, allow_nan=False),
        st.integers(1, 1 << 30),
    ),
    st.builds(lambda v: {"workspace_limit": v}, st.none() | st.integers(0, 1 << 40)),
    st.builds(lambda v: {"min_speedup": v}, st.floats(1, 10, allow_nan=False)),
    st.builds(lambda v: {"max_relative_mad": v}, st.floats(0, 10, allow_nan=False)),
)


@given(accuracy_changes)
def test_the_cache_key_differs_when_any_accuracy_setting_differs(change: dict[str, object]) -> None:
    policy = dataclasses.replace(BASE_POLICY, **change)
    if policy == BASE_POLICY:
        return
    cands = candidates("ref", "a", "b", workspace_bytes=0)
    assert cache_key(BASE_PROBLEM, cands, 0, policy) != cache_key(BASE_PROBLEM, cands, 0, BASE_POLICY)


@given(
    st.sampled_from(list(Mode)),
    st.integers(1, 100),
    st.integers(1, 50).map(lambda n: 2 * n + 1),
    st.floats(0.001, 1e6, allow_nan=False),
    st.integers(1, 65536),
)
def test_the_cache_key_is_equal_when_only_the_mode_or_search_effort_differs(
    mode: Mode, warmups: int, samples: int, budget: float, capacity: int
) -> None:
    policy = StackPolicy(mode=mode, warmups=warmups, samples=samples, budget=budget, capacity=capacity)
    assert cache_key(BASE_PROBLEM, BASE_CANDIDATES, 0, policy) == BASE_KEY


def test_the_manifest_lists_name_revision_workspace_and_eligibility_in_order() -> None:
    text = manifest([Candidate("x", "2", 64, False), Candidate("y")])
    assert text == fields([fields(["x", "2", "64", "False"]), fields(["y", "1", "-", "True"])])


# -- selection step 1: bad input -----------------------------------------------------------------------------

BAD_INPUT = [
    ("no candidates", problem(), (), 0, "candidates must not be empty"),
    ("too many candidates", problem(), tuple(Candidate(f"c{i}") for i in range(4097)), 0, "4097"),
    ("reference below range", problem(), candidates(), -1, "reference index -1"),
    ("reference above range", problem(), candidates(), 3, "reference index 3"),
    ("reference is a bool", problem(), candidates(), True, "reference index True"),
    ("empty operation", problem(operation=""), candidates(), 0, "problem.operation"),
    ("empty environment", problem(environment=""), candidates(), 0, "problem.environment"),
    ("empty workload", problem(workload=""), candidates(), 0, "problem.workload"),
    ("empty context", problem(execution_context=""), candidates(), 0, "problem.execution_context"),
    ("scope is text", problem(scope="operator"), candidates(), 0, "problem.scope"),
    ("duplicate names", problem(), candidates("ref", "a", "a"), 0, "candidates[2].name 'a' is a duplicate"),
    ("empty name", problem(), candidates("ref", ""), 0, "candidates[1].name"),
    ("name too long", problem(), candidates("ref", "x" * 4097), 0, "candidates[1].name is longer than 4096"),
    ("empty revision", problem(), candidates("ref", "a", revision=""), 0, "candidates[0].revision"),
    ("negative workspace", problem(), candidates("ref", "a", workspace_bytes=-1), 0, "workspace_bytes"),
    ("ineligible reference", problem(), (Candidate("ref", eligible=False), Candidate("a")), 0, "'ref' is not eligible"),
    ("oversized key", problem(workload="w" * (MAX_KEY_BYTES + 1)), candidates(), 0, "above the limit"),
]


@pytest.mark.parametrize(("case", "prob", "cands", "reference", "named"), BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_is_invalid_input_naming_the_field_and_value(
    case: str, prob: Problem, cands: tuple[Candidate, ...], reference: int, named: str
) -> None:
    with pytest.raises(TuneFailure) as info:
        cache_key(prob, cands, reference, StackPolicy())
    assert info.value.kind is FailureKind.INVALID_INPUT
    assert named in info.value.message


def test_a_reference_that_does_not_fit_the_workspace_limit_is_invalid_input() -> None:
    with pytest.raises(TuneFailure) as info:
        cache_key(problem(), candidates("ref", "a", workspace_bytes=100), 0, StackPolicy(workspace_limit=10))
    assert info.value.kind is FailureKind.INVALID_INPUT
    assert "workspace 100" in info.value.message and "workspace_limit 10" in info.value.message


def test_a_name_of_exactly_4096_bytes_is_accepted() -> None:
    assert cache_key(problem(), candidates("ref", "é" * 2048), 0, StackPolicy())


def test_the_default_execution_context_is_isolated_single_device() -> None:
    assert problem().execution_context == DEFAULT_CONTEXT == "isolated-single-device"


@pytest.mark.parametrize(
    ("workspace", "limit", "fits"),
    [
        (None, None, True),
        (10**12, None, True),
        (None, 100, False),
        (100, 100, True),
        (101, 100, False),
        (0, 0, True),
    ],
)
def test_an_unknown_workspace_estimate_never_fits_an_enabled_limit(workspace: int | None, limit: int | None, fits: bool) -> None:
    assert fits_workspace(Candidate("c", workspace_bytes=workspace), StackPolicy(workspace_limit=limit)) is fits


# -- the structured cache key ----------------------------------------------------------------------------------

# Keys written by farm 0.1.0 before CacheKey existed (commit restructure-base): stored records must stay valid.
OLD_KEYS = (
    (
        dict(problem=Problem(Scope.GRAPH, "op-ü", "env:1", "f32[2,3]", "ctx", True),
             candidates=(Candidate("ref", "1", 0), Candidate("b", "2", 4096, False), Candidate("c:d")), reference=0,
             policy=StackPolicy(min_speedup=1, tolerance=Tolerance(0, 1e-3, 1024), workspace_limit=8192,
                                require_validation=False, timing=Timing.DEVICE)),
        "17:farm-stack-key-v15:graph5:op-ü5:env:18:f32[2,3]3:ctx1:062:17:3:ref1:11:04:True19:1:b1:24:40965:False"
        "17:3:c:d1:11:-4:True135:13:timing=device24:require_validation=False24:tolerance=0.0,0.001,102420:"
        "workspace_limit=819215:min_speedup=1.021:max_relative_mad=0.15",
    ),
    (
        dict(problem=Problem(Scope.OPERATOR, "matmul", "env-A", "f32[64,64]"),
             candidates=(Candidate("ref"), Candidate("a")), reference=1, policy=StackPolicy()),
        "17:farm-stack-key-v18:operator6:matmul5:env-A10:f32[64,64]22:isolated-single-device1:138:17:3:ref1:11:-4:"
        "True15:1:a1:11:-4:True146:17:timing=end_to_end23:require_validation=True31:tolerance=0.0001,0.001,"
        "6710886420:workspace_limit=None16:min_speedup=1.0521:max_relative_mad=0.15",
    ),
)


@pytest.mark.parametrize(("request_", "text"), OLD_KEYS)
def test_the_encoded_key_is_byte_identical_to_keys_written_before(request_: dict, text: str) -> None:
    assert cache_key(**request_) == text
    key = CacheKey.decode(text)
    assert key.encode() == text
    assert key == CacheKey.of(**request_)
    assert (key.environment, key.workload, key.reference) == (
        request_["problem"].environment, request_["problem"].workload, request_["reference"])
    assert key.candidates == tuple(request_["candidates"])
    assert key.accuracy == AccuracyKey.of(request_["policy"])
    assert key_environment(text) == request_["problem"].environment


def test_a_key_part_is_changed_by_name_and_the_rest_is_kept() -> None:
    request_, text = OLD_KEYS[1]
    moved = CacheKey.decode(text).replace(environment="env-B")
    again = cache_key(**{**request_, "problem": replace(request_["problem"], environment="env-B")})
    assert moved.encode() == again


def test_the_accuracy_key_reads_back_its_named_settings() -> None:
    policy = StackPolicy(min_speedup=1.25, max_relative_mad=0.5, workspace_limit=10)
    accuracy = AccuracyKey.decode(policy.accuracy_key())
    assert (accuracy.min_speedup, accuracy.max_relative_mad, accuracy.workspace_limit) == (1.25, 0.5, 10)
    assert accuracy.encode() == policy.accuracy_key()


@pytest.mark.parametrize(
    "text",
    ["", "garbage", fields(["farm-stack-key-v1", "operator"]), OLD_KEYS[1][1].replace("1:138:", "1:x38:"),
     OLD_KEYS[1][1][:-3]],
)
def test_a_malformed_key_is_refused_with_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        CacheKey.decode(text)


def test_an_adapter_operation_key_reads_back_its_parts() -> None:
    op = OperationKey("softmax", "cuda", "abc")
    assert OperationKey.decode(op.encode()) == op
    assert OperationKey.decode("matmul") is None
