"""The group task's own rules, in-process with the real host runtime and the in-memory results store:
idempotency, bounded attempts, device quarantine, fingerprint routing, and batches that stop after a hang."""

from __future__ import annotations

import numpy as np
import pytest

from farm import HostClient, TunableSet, array_signature
from farm.environment import runtime_environment
from farm.policy import StackPolicy
from farm_fleet.protocol import STATUS_FAILED, STATUS_OK, GroupKey, GroupTask, ProtocolError
from farm_fleet.results import MemoryResults
from farm_fleet.settings import Settings
from farm_kernels import registry
from farm_kernels.operation import Operation, dim
from farm_workers.tasks import DeviceQuarantined, WorkerContext, run_group, run_groups

POLICY = StackPolicy(samples=3, warmups=1, budget=5.0).to_dict()


class Interrupt(Exception):
    """Stands in for Celery's SoftTimeLimitExceeded."""


calls = {"n": 0}


def reference(x):
    calls["n"] += 1
    return x * 2.0


def doubled(x):
    return x + x


def interrupted(x):
    raise Interrupt("time limit")


@pytest.fixture(scope="module", autouse=True)
def operation():
    tunable = TunableSet("worker_test_op", signature=array_signature)
    tunable.add(reference, reference=True)
    tunable.add(doubled, group=0)
    tunable.add(interrupted, group=1)
    op = Operation(name="worker_test_op", host=tunable, cuda=None, fields=(dim("n"),), dtypes={"cpu": ("float64",)},
                   make=lambda spec, xp, rng: (xp.asarray(rng.random(spec["n"])),))
    registry.ensure_loaded()
    registry.register(op)
    yield op
    registry.unregister("worker_test_op")


class FailingSync(HostClient):
    """A device whose completion fence fails, as a crashed GPU's would."""

    def sync(self) -> None:
        raise RuntimeError("device lost")


def context(client=None, results=None, **kw) -> WorkerContext:
    return WorkerContext(client=client or HostClient(0), results=results or MemoryResults(), settings=Settings(),
                         worker_id="w0", interrupts=(Interrupt,), **kw)


def task(ctx: WorkerContext, group: str = "g0", names=("doubled",), n: int = 64, **kw) -> dict:
    digest = runtime_environment(ctx.client).digest
    return GroupTask("round", f"p{n}", group, "worker_test_op", "cpu", {"n": n, "dtype": "float64"},
                     tuple((name, "1") for name in names), POLICY, digest, **kw).to_dict()


def test_a_group_result_is_stored_once_and_a_redelivery_returns_it_without_running_trials():
    ctx = context()
    first = run_group(task(ctx), ctx)
    assert first["status"] == STATUS_OK
    before = calls["n"]
    again = run_group(task(ctx), ctx)
    assert again == first
    assert calls["n"] == before
    assert ctx.results.attempt(GroupKey("round", "p64", "g0")) == 2  # only the first delivery counted an attempt


def test_on_redis_a_redelivery_returns_the_stored_result_and_only_the_first_delivery_counts_an_attempt(redis_db):
    from farm_fleet.results import RedisResults

    settings = Settings(prefix="wt")
    ctx = WorkerContext(client=HostClient(0), results=RedisResults(redis_db, settings), settings=settings,
                        worker_id="w0", interrupts=(Interrupt,))
    first = run_group(task(ctx), ctx)
    before = calls["n"]
    assert run_group(task(ctx), ctx) == first and calls["n"] == before
    assert redis_db.get(settings.attempts_key(GroupKey("round", "p64", "g0"))) == "1"
    redis_db.set(settings.attempts_key(GroupKey("round", "p65", "g0")), settings.max_attempts)
    assert "gave up after 3 attempts" in run_group(task(ctx, n=65), ctx)["error"]


def test_past_the_attempt_bound_the_group_is_recorded_failed_without_running():
    ctx = context()
    for _ in range(ctx.settings.max_attempts):
        ctx.results.attempt(GroupKey("round", "p64", "g0"))
    result = run_group(task(ctx), ctx)
    assert result["status"] == STATUS_FAILED
    assert "gave up after 3 attempts" in result["error"]


def test_a_device_failure_quarantines_the_worker_and_sends_the_task_back():
    seen = []
    ctx = context(FailingSync(0), on_quarantine=seen.append)
    with pytest.raises(DeviceQuarantined):
        run_group(task(ctx), ctx)
    assert ctx.quarantined is not None and seen == [ctx.quarantined]
    assert ctx.results.get(GroupKey("round", "p64", "g0")) is None  # nothing stored: another worker will run it
    attempts = ctx.results.attempt(GroupKey("round", "p64", "g0"))
    with pytest.raises(DeviceQuarantined):
        run_group(task(ctx, n=65), ctx)
    assert ctx.results.attempt(GroupKey("round", "p65", "g0")) == 1  # refused before counting an attempt
    assert attempts == 2


def test_a_task_for_another_fingerprint_is_recorded_failed():
    ctx = context()
    message = task(ctx)
    message["fingerprint"] = "0" * 16
    result = run_group(message, ctx)
    assert result["status"] == STATUS_FAILED
    assert "reached a worker of fingerprint" in result["error"]


def test_a_batch_stops_after_a_group_whose_candidate_hit_the_time_limit():
    ctx = context()
    hung = task(ctx, group="g1", names=("interrupted",), n=70)
    later = task(ctx, group="g0", names=("doubled",), n=71)
    batch = run_groups([hung, later], ctx)
    assert len(batch.results) == 1 and batch.unreached == [GroupKey("round", "p71", "g0")]
    (outcome,) = batch.results[0]["outcomes"]
    assert outcome["verdict"] == "rejected" and "time limit" in outcome["note"]
    assert ctx.results.get(GroupKey("round", "p71", "g0")) is None  # left for the coordinator to send again


def test_trial_outputs_are_checked_against_the_reference_on_this_device():
    ctx = context()
    result = run_group(task(ctx, n=33), ctx)
    (outcome,) = result["outcomes"]
    assert outcome["verified"] is True and (outcome["verdict"], outcome["note"]) == ("passed", "")
    assert (outcome["name"], outcome["revision"], outcome["index"]) == ("doubled", "1", 1)
    # samples = 3 is the minimum; an undecided verdict takes more pairs at the looks 7, 11 and 13 (max_samples).
    assert len(outcome["pairs"]) in (3, 7, 11, 13) and outcome["stop"] in ("decided", "max_samples")
    assert outcome["interference"]["pairs"] == len(outcome["pairs"])
    assert outcome["max_abs_error"] == pytest.approx(0.0, abs=1e-12)
    assert np.isfinite(result["trial_seconds"])


def test_a_message_of_another_protocol_version_is_refused_naming_the_field():
    ctx = context()
    message = task(ctx)
    message["protocol"] = 99
    with pytest.raises(ProtocolError, match="protocol version 99"):
        run_group(message, ctx)
    del message["protocol"]
    message = task(ctx)
    del message["spec"]
    with pytest.raises(ProtocolError, match="'spec' is missing"):
        run_group(message, ctx)


def test_a_candidate_the_worker_lacks_or_another_revision_fails_the_group_naming_it():
    ctx = context()
    message = task(ctx, names=("missing",), n=40)
    result = run_group(message, ctx)
    assert result["status"] == STATUS_FAILED and "'missing'" in result["error"]
    message = task(ctx, n=41)
    message["candidates"] = [{"name": "doubled", "revision": "7"}]
    result = run_group(message, ctx)
    assert result["status"] == STATUS_FAILED and "revision '7'" in result["error"]


def test_a_group_spends_only_the_budget_it_carries():
    ctx = context()
    result = run_group(task(ctx, names=("doubled", "interrupted"), n=42, budget=0.0), ctx)
    doubled, interrupted = result["outcomes"]
    assert result["budget_exhausted"] is True
    assert (doubled["verdict"], doubled["note"]) == ("not tried", "budget of 5s exhausted")
    assert interrupted["verdict"] == "not tried" and interrupted["budget_exhausted"] is True
    assert doubled["pairs"] == [] and result["search_seconds"] >= 0.0


def test_a_spec_the_operation_cannot_build_fails_the_group_naming_the_field():
    ctx = context()
    message = task(ctx)
    message["spec"] = {"n": 0, "dtype": "float64"}
    result = run_group(message, ctx)
    assert result["status"] == STATUS_FAILED
    assert "n must be in 1.." in result["error"]


@pytest.mark.servers
def test_a_run_that_ends_without_a_result_releases_its_run_claim(redis_db):
    from farm_fleet.results import RedisResults

    settings = Settings(prefix="t")
    ctx = context(client=FailingSync(0), results=RedisResults(redis_db, settings))
    with pytest.raises(DeviceQuarantined):
        run_group(task(ctx), ctx)
    assert redis_db.get(settings.attempts_key(GroupKey("round", "p64", "g0"))) == "1"
    assert not redis_db.exists(settings.running_key(GroupKey("round", "p64", "g0")))  # the next delivery runs it at once


def test_a_time_limit_outside_the_trials_leaves_that_group_and_the_rest_to_be_sent_again():
    class Waiting(MemoryResults):
        def begin(self, *args):  # as when the time limit hits while waiting on another delivery's run
            raise Interrupt("time limit")

    ctx = context(results=Waiting())
    batch = run_groups([task(ctx, n=80), task(ctx, n=81)], ctx)
    assert batch.results == [] and batch.unreached == [GroupKey("round", "p80", "g0"), GroupKey("round", "p81", "g0")]
