"""The one rule for serving a stored decision (``farm.decisions.refusal``, ``validate_stored``), and its three
callers: the engine's stored tiers, nearest borrowing and the Triton adapter (whose lookup needs no torch)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fakes import FakeRunner, candidates, problem

from farm.decisions import Decision, DecisionRecord, DecisionSource, Refusal, refusal, validate_stored
from farm.engine import StackTuner
from farm.errors import DeviceBusy, FailureKind, TuneFailure
from farm.identity import Candidate, cache_key
from farm.policy import StackPolicy
from farm.runner import Validation
from farm.stores.local import LocalStore
from farm.stores.memory import MemoryStore

NOW = 1_000_000.0
POLICY = StackPolicy(ttl=100.0)
C = candidates("ref", "a", "b")


def record(index: int = 1, name: str = "a", *, reference: int = 0, verified: bool = True, created: float = NOW - 10,
           key: str = "k") -> DecisionRecord:
    return DecisionRecord(key, index, reference, name, verified, 0.5, created)


@pytest.mark.parametrize(("stored", "cands", "policy", "banned", "expected"), [
    (record(), C, POLICY, (), None),
    (record(0, "ref"), C, POLICY, (), None),  # the reference itself
    (record(created=NOW - 101), C, POLICY, (), Refusal.STALE),  # older than the ttl
    (record(created=NOW + 1), C, POLICY, (), Refusal.STALE),  # dated in the future
    (record(reference=1), C, POLICY, (), Refusal.MISMATCH),  # another reference
    (record(3, "c"), C, POLICY, (), Refusal.MISMATCH),  # no candidate of that index
    (record(1, "b"), C, POLICY, (), Refusal.MISMATCH),  # that index names another candidate
    (record(verified=False), C, POLICY, (), Refusal.UNVERIFIED),
    (record(verified=False), C, StackPolicy(ttl=100.0, require_validation=False), (), None),
    (record(), C, POLICY, {("k", "a")}, Refusal.BANNED),
    (record(), C, POLICY, {("other key", "a")}, None),  # a ban is per key
    (record(), (Candidate("ref"), Candidate("a", eligible=False)), POLICY, (), Refusal.INELIGIBLE),
    (record(), (Candidate("ref"), Candidate("a", workspace_bytes=2048)), StackPolicy(ttl=100.0, workspace_limit=1024),
     (), Refusal.INELIGIBLE),
])
def test_a_stored_decision_is_served_only_when_fresh_matching_verified_unbanned_and_eligible(
        stored, cands, policy, banned, expected) -> None:
    assert refusal(stored, "k", cands, 0, policy, banned, NOW) is expected


def test_only_a_stale_or_mismatched_record_warns() -> None:
    assert {r for r in Refusal if r.warns} == {Refusal.STALE, Refusal.MISMATCH}


@pytest.mark.parametrize(("verdict", "policy", "expected"), [
    (Validation.PASSED, POLICY, Validation.PASSED),
    (Validation.UNSUPPORTED, POLICY, None),  # require_validation: an unchecked winner is not served
    (Validation.UNSUPPORTED, StackPolicy(require_validation=False), Validation.UNSUPPORTED),
    (TuneFailure.rejected("wrong output"), POLICY, None),
    (ValueError("boom"), POLICY, None),  # any error is a refusal, never the caller's error
])
def test_a_stored_winner_is_validated_once_and_a_failed_check_is_a_refusal(verdict, policy, expected) -> None:
    runner = FakeRunner(verdicts={1: verdict})
    assert validate_stored(runner, 0, 1, policy) is expected
    assert runner.validated() == [(0, 1)]


@pytest.mark.parametrize("error", [TuneFailure(FailureKind.DEVICE, "lost"), DeviceBusy("lock held")])
def test_a_device_failure_or_a_busy_device_during_the_check_propagates(error) -> None:
    with pytest.raises(type(error)):
        validate_stored(FakeRunner(verdicts={1: error}), 0, 1, POLICY)


def test_the_reference_needs_no_validation() -> None:
    runner = FakeRunner()
    assert validate_stored(runner, 0, 0, POLICY) is Validation.PASSED and runner.calls == []


def test_the_engine_does_not_serve_a_stored_winner_it_banned_for_the_key() -> None:
    store = MemoryStore(16)
    persistent = problem(persistent=True)
    tuner = StackTuner(POLICY, fleet=[store])
    key = tuner.request(persistent, C, 0).key
    store.put(record(key=key, created=time.time()))
    served = tuner.select(persistent, C, 0, FakeRunner())
    assert served.source is DecisionSource.FLEET_CACHE and served.name == "a"
    tuner.invalidate(served, ban_candidate=True)
    assert tuner.banned() == {(key, "a")}
    again = tuner.select(persistent, C, 0, FakeRunner({0: 1.0, 1: 0.5, 2: 2.0}))
    assert again.source is DecisionSource.TUNED and again.name != "a"  # searched, without the banned winner


def test_a_busy_device_while_checking_a_stored_winner_is_busy_and_keeps_the_record(tmp_path: Path) -> None:
    persistent = problem(persistent=True)
    tuner = StackTuner(POLICY, cache_directory=tmp_path)
    key = tuner.request(persistent, C, 0).key
    LocalStore(tmp_path).put(record(key=key, created=time.time()))
    busy = tuner.select(persistent, C, 0, FakeRunner(verdicts={1: DeviceBusy("lock held")}))
    assert busy.source is DecisionSource.BUSY and busy.name == "ref"
    assert LocalStore(tmp_path).get(key) is not None  # not a verdict: the record stays for the next call
    assert tuner.select(persistent, C, 0, FakeRunner()).source is DecisionSource.DISK_CACHE


# -- the Triton adapter: the same rule, read with read_record ---------------------------------------------------


def triton_store(tmp_path: Path, *records: DecisionRecord) -> Path:
    store = LocalStore(tmp_path)
    for r in records:
        store.put(r)
    return tmp_path


def triton_request() -> tuple[StackPolicy, object, str, list[Candidate]]:
    from farm_triton import identity

    cands = identity.candidates(["c0", "c1", "c2"])  # the reference config first: reference 0 in every key
    target = problem(persistent=True)
    return POLICY, target, cache_key(target, cands, 0, POLICY), cands


def test_the_triton_adapter_serves_a_fresh_verified_decision_read_with_read_record(tmp_path: Path) -> None:
    from farm_triton.decisions import Decisions

    policy, target, key, cands = triton_request()
    decisions = Decisions(policy, cache_directory=triton_store(tmp_path, record(2, cands[2].name, key=key,
                                                                                created=time.time())))
    found = decisions.stored(target, key, cands)
    assert found is not None and found[0].index == 2 and isinstance(found[1], LocalStore)


def test_the_triton_adapter_refuses_a_decision_with_another_reference(tmp_path: Path) -> None:
    from farm_triton.decisions import Decisions

    policy, target, key, cands = triton_request()
    stored = record(2, cands[2].name, reference=1, key=key, created=time.time())
    decisions = Decisions(policy, cache_directory=triton_store(tmp_path, stored))
    assert decisions.stored(target, key, cands) is None


def test_the_triton_adapter_refuses_a_winner_the_controller_banned(tmp_path: Path) -> None:
    from farm_triton.decisions import Decisions

    policy, target, key, cands = triton_request()
    decisions = Decisions(policy, cache_directory=triton_store(tmp_path, record(2, cands[2].name, key=key,
                                                                                created=time.time())))
    tuner = StackTuner(policy)
    decisions.tuner = tuner
    assert decisions.stored(target, key, cands) is not None
    tuner.invalidate(Decision(2, 0, cands[2].name, DecisionSource.FLEET_CACHE, True, 0.5, key), ban_candidate=True)
    assert decisions.stored(target, key, cands) is None
