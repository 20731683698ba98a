"""Fleet misses across regimes (farm/stores/regimes.py): pure tables, and the Redis tier against a real
redis-server. The end-to-end recipe with a real worker is tests/test_fleet_recipe.py."""

from __future__ import annotations

import json
import logging

import pytest

from farm.encoding import fields
from farm.identity import CacheKey, Candidate, OperationKey
from farm.policy import AccuracyKey, StackPolicy
from farm.stores.regimes import RegimeCheck, advice, forget_warnings, split_regime


def fingerprint(regime: str, device: str = "x86_64; Xeon; 2 logical cores; numpy 2.4", extra: str = "") -> str:
    options = "; ".join(o for o in (regime, extra) if o)
    return fields(["host-numpy", "cpu", device, "Linux 6", "CPython 3.11", "0.1.0", "", options])


ONE = fingerprint("cpus=1; blas=1 (openblas SkylakeX); openmp=1")
TWO = fingerprint("cpus=2; blas=2 (openblas SkylakeX); openmp=2")
OTHER_MODEL = fingerprint("cpus=1; blas=1 (openblas SkylakeX); openmp=1", device="aarch64; Graviton; 2 logical cores")


def key(environment: str, operation: str = "softmax", workload: str = "rows=64") -> str:
    op = OperationKey(operation, "cpu", "abc").encode()
    return CacheKey("operator", op, environment, workload, "default", 0, (Candidate("ref"), Candidate("fast")),
                    AccuracyKey.of(StackPolicy())).encode()


@pytest.fixture(autouse=True)
def _fresh_warnings():
    forget_warnings()
    yield
    forget_warnings()


def test_a_fingerprint_splits_into_its_device_class_and_its_regime():
    cases = [
        (ONE, "cpus=1; blas=1 (openblas SkylakeX); openmp=1"),
        (TWO, "cpus=2; blas=2 (openblas SkylakeX); openmp=2"),
        (fingerprint("cpus=2; blas=2", extra="MKL_CBWR=AVX2"), "cpus=2; blas=2"),
    ]
    for text, regime in cases:
        split = split_regime(text)
        assert split is not None and split[1] == regime
    assert split_regime(ONE)[0] == split_regime(TWO)[0]
    assert split_regime(ONE)[0] != split_regime(OTHER_MODEL)[0]
    assert split_regime(fingerprint("cpus=2", extra="MKL_CBWR=AVX2"))[0] != split_regime(TWO)[0]
    assert split_regime(fingerprint("", extra="allocator=pool")) is None  # no host regime (a CUDA fingerprint)
    assert split_regime("not a fingerprint") is None


def test_the_advice_names_the_workers_cpu_set_and_the_applications_core_count():
    text = advice("cpus=2; blas=2; openmp=2", "cpus=1; blas=1; openmp=1")
    assert "taskset -c 0 python app.py" in text and "--cores 2" in text
    assert "taskset -c 0-3 " in advice("cpus=2; blas=2", "cpus=4; blas=4") and "--cores 2" in text
    assert "docs/deployment.md" in advice("blas=2", "blas=1")


def check(tier: dict[str, dict[str, str]]) -> RegimeCheck:
    """A RegimeCheck over an in-memory tier: digest -> {cache key: record JSON}."""
    texts = {"d-one": ONE, "d-two": TWO, "d-model": OTHER_MODEL}
    return RegimeCheck("the test tier", lambda: {d: texts[d] for d in tier},
                       lambda digest, k: k in tier[digest], lambda digest: iter(tier[digest].values()))


def test_a_miss_warns_once_when_another_regime_of_the_device_class_decided_the_operation(caplog):
    record = json.dumps({"cache_key": key(ONE, workload="rows=1000")})
    cases = [
        # (tier, the key that missed, warns)
        ({"d-two": {}, "d-one": {key(ONE): "{}"}}, key(TWO), True),  # the exact problem, in the workers' regime
        ({"d-two": {}, "d-one": {"x": record}}, key(TWO), True),  # another workload of the same operation
        ({"d-two": {}, "d-one": {"x": record}}, key(TWO, operation="matmul"), False),  # another operation
        ({"d-two": {}, "d-model": {key(OTHER_MODEL): "{}"}}, key(TWO), False),  # another device class
        ({"d-two": {}}, key(TWO), False),  # nothing elsewhere
    ]
    for tier, missed, warns in cases:
        forget_warnings()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="farm.fleet"):
            assert check(tier).missed(missed, "d-two") is warns, (tier, missed)
        assert bool([r for r in caplog.records if "fleet miss across regimes" in r.message]) is warns
    forget_warnings()
    tier = {"d-two": {}, "d-one": {key(ONE): "{}"}}
    first, second = check(tier), check(tier)
    with caplog.at_level(logging.WARNING, logger="farm.fleet"):
        assert first.missed(key(TWO), "d-two")
        assert not first.missed(key(TWO, workload="rows=2"), "d-two") and not second.missed(key(TWO), "d-two")
    message = next(r.message for r in caplog.records if "fleet miss across regimes" in r.message)
    assert "`cpus=1; blas=1 (openblas SkylakeX); openmp=1`" in message and "`cpus=2; blas=2" in message
    assert "softmax" in message and "the test tier" in message


def test_the_redis_tier_warns_on_a_miss_when_its_other_regime_holds_the_problem(redis_db, caplog):
    from farm.environment import fingerprint_digest
    from farm.stores.base import DecisionRecord
    from farm.stores.redis import KeyLayout, RedisDecisions

    layout = KeyLayout(prefix="regimehint")
    tier = RedisDecisions(client=redis_db, settings=layout)
    tier.put(DecisionRecord(key(ONE), 1, 0, "fast", True, 0.5, 0.0, {}))
    redis_db.hset(layout.fingerprints_key, mapping={fingerprint_digest(ONE): ONE, fingerprint_digest(TWO): TWO})
    with caplog.at_level(logging.WARNING, logger="farm.fleet"):
        assert tier.get(key(TWO)) is None
        assert tier.get(key(ONE)) is not None
    (line,) = [r.message for r in caplog.records if "fleet miss across regimes" in r.message]
    assert "the fleet Redis" in line and fingerprint_digest(ONE)[:8] in line
