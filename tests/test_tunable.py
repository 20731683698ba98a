"""Tunable sets: registration, the reference, the search plan, fresh trial inputs and the checksum."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pytest

from farm.arrays import array_signature
from farm.errors import FailureKind, TuneFailure
from farm.identity import Candidate
from farm.policy import Tolerance
from farm.tunable import TunableSet


def double(x: np.ndarray) -> np.ndarray:
    return x * 2


def twice(x: np.ndarray) -> np.ndarray:
    return x + x


def shifted(x: np.ndarray) -> np.ndarray:
    return np.add(x, x)


def make_set() -> TunableSet:
    s = TunableSet("double", signature=array_signature)
    s.add(double, reference=True)
    s.add(twice, group=1, revision="3", workspace_bytes=64)
    s.add(shifted, group=0, identity="launch=128")
    return s


def test_decorators_register_the_reference_and_candidates_with_options() -> None:
    s = TunableSet("op", signature=array_signature)

    @s.reference
    def ref(x: np.ndarray) -> np.ndarray:
        return x

    @s.candidate(group=2, revision="7")
    def fast(x: np.ndarray) -> np.ndarray:
        return x

    @s.candidate
    def plain(x: np.ndarray) -> np.ndarray:
        return x

    assert [i.name for i in s.implementations] == ["ref", "fast", "plain"]
    assert s.stack_reference() == 0
    assert (s[1].group, s[1].revision) == (2, "7")
    assert fast is s[1].fn  # the decorator returns the function unchanged


@pytest.mark.parametrize(
    ("register", "says"),
    [
        (lambda s: s.add(double, name="twice"), "'twice' is a duplicate"),
        (lambda s: s.add(lambda x: x, name="other", reference=True), "reference is already 'double'"),
        (lambda s: s.add(lambda x: x, name="g", group=True), "group must be an integer"),
        (lambda s: s.add(functools.partial(double)), "needs a name"),
    ],
)
def test_bad_registrations_are_invalid_input(register: Callable[[TunableSet], object], says: str) -> None:
    s = make_set()
    with pytest.raises(TuneFailure) as info:
        register(s)
    assert info.value.kind is FailureKind.INVALID_INPUT
    assert says in info.value.message


def test_a_set_needs_a_name() -> None:
    with pytest.raises(TuneFailure) as info:
        TunableSet("", signature=array_signature)
    assert info.value.kind is FailureKind.INVALID_INPUT


def test_the_search_order_is_the_reference_then_every_eligible_group_in_order() -> None:
    s = make_set()
    s.add(lambda x: x, name="late", group=5)
    s.add(lambda x: x, name="off", group=0, eligible=False)
    s.add(lambda x: x, name="early", group=-1)
    names = [s[i].name for i in s.search_order()]
    assert names == ["double", "early", "shifted", "twice", "late"]
    assert [[s[i].name for i in batch] for batch in s.plan()] == [["early"], ["double", "shifted"], ["twice"], ["late"]]


def test_a_set_without_a_reference_has_no_search_order() -> None:
    s = TunableSet("op", signature=array_signature)
    s.add(double)
    assert s.stack_reference() is None
    with pytest.raises(TuneFailure) as info:
        s.search_order()
    assert info.value.kind is FailureKind.INVALID_INPUT and "no explicit reference" in info.value.message


def test_an_implementation_describes_itself_as_a_candidate() -> None:
    assert make_set()[1].candidate() == Candidate("twice", "3", 64, True)


def test_the_workload_is_the_signature_of_the_inputs() -> None:
    x = np.zeros((2, 3), np.float32)
    assert make_set().stack_workload((x,)) == array_signature(x)


@pytest.mark.parametrize(
    ("signature", "says"),
    [(None, "no exact workload signature"), (lambda *a: "", "non-empty string"), (lambda *a: 5, "non-empty string")],
)
def test_a_missing_or_empty_signature_is_invalid_input(signature: Callable[..., object] | None, says: str) -> None:
    s = TunableSet("op", signature=signature)
    s.add(double, reference=True)
    assert s.has_signature() is (signature is not None)
    with pytest.raises(TuneFailure) as info:
        s.stack_workload((np.ones(2),))
    assert info.value.kind is FailureKind.INVALID_INPUT and says in info.value.message


def test_the_memo_key_separates_what_the_signature_separates() -> None:
    s = make_set()
    a, b = np.ones((2, 3)), np.ones((3, 2))
    assert s.generate_key((a,)) == s.generate_key((np.zeros((2, 3)),))
    assert s.generate_key((a,)) != s.generate_key((b,))
    custom = TunableSet("op", signature=lambda x: "w", key=lambda x: ("custom", x.shape))
    assert custom.generate_key((a,)) == ("custom", (2, 3))


def test_generated_inputs_are_fresh_copies_every_time() -> None:
    x = np.arange(6.0)
    s = make_set()
    first, second = s.generate_inputs((x, 3)), s.generate_inputs((x, 3))
    first[0][:] = -1
    assert np.array_equal(second[0], np.arange(6.0)) and np.array_equal(x, np.arange(6.0))
    assert first[1] == 3


def test_a_custom_generator_builds_the_trial_inputs() -> None:
    s = TunableSet("op", signature=array_signature, generate=lambda x: (np.full_like(x, 7.0),))
    (fresh,) = s.generate_inputs((np.zeros(3),))
    assert np.array_equal(fresh, np.full(3, 7.0))


def test_a_per_workload_tolerance_replaces_the_policys() -> None:
    loose = Tolerance(absolute=0.5)
    s = TunableSet("op", signature=array_signature, tolerance=lambda x: loose if x.dtype == np.float16 else None)
    assert s.tolerance_for((np.ones(2, np.float16),), Tolerance()) == loose
    assert s.tolerance_for((np.ones(2),), Tolerance()) == Tolerance()
    assert make_set().tolerance_for((np.ones(2),), Tolerance(0.25)) == Tolerance(0.25)


def checksum_of(**options: object) -> str:
    """The checksum of a two-candidate set whose second candidate takes ``options``."""
    s = TunableSet("double", signature=array_signature)
    s.add(double, reference=True)
    fn = options.pop("fn", twice)
    s.add(fn, name="twice", **{"group": 1, "revision": "3", **options})  # type: ignore[arg-type]
    return s.checksum()


@pytest.mark.parametrize(
    "options",
    [{"revision": "4"}, {"identity": "launch=256"}, {"fn": shifted}, {"eligible": False}, {"workspace_bytes": 128}, {"group": 2}],
    ids=lambda o: next(iter(o)),
)
def test_the_checksum_changes_when_the_manifest_or_code_changes(options: dict[str, object]) -> None:
    assert checksum_of(**options) != checksum_of()


def test_the_checksum_changes_when_a_candidate_is_added() -> None:
    s = make_set()
    before = s.checksum()
    s.add(lambda x: x, name="new")
    assert s.checksum() != before


def test_the_checksum_is_stable_for_the_same_definition() -> None:
    assert make_set().checksum() == make_set().checksum()


def test_the_checksum_covers_the_tolerance_function() -> None:
    a = TunableSet("op", signature=array_signature, tolerance=lambda x: None)
    b = TunableSet("op", signature=array_signature, tolerance=lambda x: Tolerance(0.5))
    assert a.checksum() != b.checksum()


def test_registering_a_candidate_clears_prepared_requests() -> None:
    s = make_set()
    s.prepared["memo"] = object()
    s.add(lambda x: x, name="another")
    assert s.prepared == {}


def test_an_input_the_signature_cannot_describe_is_invalid_input_naming_the_set():
    from farm import FailureKind, TunableSet, TuneFailure, array_signature

    ts = TunableSet("sig_test", signature=array_signature)
    ts.add(lambda x: x, name="ref", reference=True)
    with pytest.raises(TuneFailure) as error:
        ts.stack_workload(({"not": "an array"},))
    assert error.value.kind is FailureKind.INVALID_INPUT
    assert "sig_test" in error.value.message and "dict" in error.value.message
