"""Fleet bans (coordinator/bans.py): when a reported regression is confirmed, the rule that bans; the Redis store on
a private redis-server; and planning, where a banned candidate becomes SKIPPED for its problem only. The whole loop
with real processes is tests/test_feedback.py::test_a_regression_the_farm_confirms_bans_the_old_winner_for_that_key.
"""

from __future__ import annotations

import pytest

from farm.errors import CorruptRecord
from farm.policy import StackPolicy
from farm.trials import TrialVerdict
from farm_coordinator.bans import RedisBans, new_ban, regressed_there_too
from farm_coordinator.catalog import Catalog, Workload
from farm_coordinator.plan import Target, expand
from farm_fleet.settings import Settings
from farm_kernels import registry

POLICY = StackPolicy()  # regression_ratio 1.15


@pytest.mark.parametrize(("measured", "banned"), [
    ({"name": "a", "ratio": 1.5, "verified": True}, "regressed on the farm too: 1.50x"),
    ({"name": "a", "ratio": 1.16, "verified": True}, "regressed on the farm too: 1.16x"),
    ({"name": "a", "ratio": 1.15, "verified": True}, None),  # at the threshold: not above it
    ({"name": "a", "ratio": 1.05, "verified": True}, None),  # no longer a win, but no regression: the host's own
    ({"name": "a", "ratio": 0.5, "verified": True}, None),  # still fast on the farm
    ({"name": "a", "ratio": None, "verified": None, "note": "not tried: budget"}, None),  # no evidence
    ({"name": "a", "ratio": None, "verified": False, "note": "wrong output"}, "failed its re-measure on the farm (wrong output)"),
])
def test_a_reported_regression_is_confirmed_by_a_failure_or_a_ratio_above_regression_ratio(measured, banned):
    reason = regressed_there_too(measured, POLICY)
    assert (reason is None) == (banned is None)
    if banned is not None:
        assert reason is not None and reason.startswith(banned)


def test_bans_are_stored_per_problem_and_candidate_merged_listed_and_lifted(redis_db):
    bans = RedisBans(redis_db, Settings(prefix="bantest"))
    assert bans.banned("d1") == {}
    bans.ban("d1", "p1", new_ban("fast", "regressed on the farm too: 2.00x", "run-1", 2.0))
    bans.ban("d1", "p1", new_ban("faster", "failed its re-measure", "run-2", None))
    bans.ban("d2", "p1", new_ban("other", "x", "run-3", 1.5))
    assert bans.banned("d1") == {"p1": {"fast", "faster"}}
    assert bans.banned("d2") == {"p1": {"other"}}  # per fingerprint
    rows = bans.all(["d1", "d2"])
    assert [(d, p, b.candidate, b.run) for d, p, b in rows] == [
        ("d1", "p1", "fast", "run-1"), ("d1", "p1", "faster", "run-2"), ("d2", "p1", "other", "run-3")]
    assert rows[0][2].ratio == 2.0 and rows[0][2].reason.startswith("regressed")
    assert bans.lift("d1", "p1", "fast") == 1
    assert bans.banned("d1") == {"p1": {"faster"}}
    assert bans.lift("d1", "p1", "nothing") == 0
    assert bans.lift("d1", "p1") == 1
    assert bans.banned("d1") == {} and not redis_db.exists("bantest:bans:d1")


def test_a_corrupt_ban_entry_is_an_error_naming_the_key_and_field(redis_db):
    bans = RedisBans(redis_db, Settings(prefix="bantest"))
    redis_db.hset("bantest:bans:d1", "p1", "not json")
    with pytest.raises(CorruptRecord, match="bantest:bans:d1 field p1"):
        bans.banned("d1")
    redis_db.hset("bantest:bans:d1", "p1", '["a list"]')
    with pytest.raises(CorruptRecord, match="must be an object"):
        bans.banned("d1")


def test_planning_skips_a_banned_candidate_for_its_problem_only():
    registry.ensure_loaded()
    catalog = Catalog("bans.toml", StackPolicy(samples=3, warmups=1),
                      (Workload("softmax", ("cpu",), {"rows": 8, "cols": 16, "dtype": "float32"}, "w0"),
                       Workload("softmax", ("cpu",), {"rows": 16, "cols": 16, "dtype": "float32"}, "w1")))
    target = Target("digest", "fingerprint", "cpu", ("w",))
    plain = expand(catalog, [target], "run")
    names = [name for t in plain[0].tasks for name, _ in t.candidates]
    victim = names[-1]
    problems = expand(catalog, [target], "run", {"digest": {plain[0].problem_id: {victim}}})
    assert [p.problem_id for p in problems] == [p.problem_id for p in plain]
    assert victim not in [name for t in problems[0].tasks for name, _ in t.candidates]
    (skip,) = [o for o in problems[0].skipped if o.name == victim]
    assert skip.verdict is TrialVerdict.SKIPPED and "banned for this key" in skip.note
    assert victim in [name for t in problems[1].tasks for name, _ in t.candidates]  # another workload may choose it
    other = Target("other", "fingerprint 2", "cpu", ("w",))  # another fingerprint's problem has another id
    assert victim in [name for t in expand(catalog, [other], "run", {"digest": {plain[0].problem_id: {victim}}})[0].tasks
                      for name, _ in t.candidates]


def test_a_spec_with_its_defaults_spelled_out_is_the_same_problem():
    registry.ensure_loaded()
    spec = {"rows": 8, "cols": 16, "dtype": "float32"}
    target = Target("digest", "fingerprint", "cpu")
    catalog = Catalog("a.toml", StackPolicy(), (Workload("softmax", ("cpu",), spec, "w0"),
                                                Workload("softmax", ("cpu",), {**spec, "seed": 0}, "w1")))
    first, second = expand(catalog, [target], "run")
    assert first.problem_id == second.problem_id
