"""Tuning spaces: canonical names, mixed-radix configs never materialized, the key naming the space, and a
space tuned in-process on a real host client (each config called as ``fn(*inputs, **config)``)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import farm
from farm.adapter import stack_request
from farm.errors import FailureKind, TuneFailure
from farm.identity import CacheKey, OperationKey
from farm.space import Space


def scale_set(block: list[int] | None = None, restrict: object = "block * unroll <= 256") -> farm.TunableSet:
    blocked = farm.TunableSet("scale", signature=farm.array_signature)

    @blocked.reference
    def reference(x):
        return x * 2.0

    @blocked.candidate(group=1)
    def doubled(x):
        return x + x

    @blocked.space(group=0, block=block or [16, 32, 64, 128], unroll=[1, 2, 4, 8], restrict=restrict)
    def tiled(x, *, block, unroll):
        return x * 2.0 if block != 16 else x * 3.0  # block=16 is a wrong-output trap

    return blocked


def test_a_config_is_named_canonically_in_declaration_order_and_the_name_parses_back() -> None:
    space = Space("tiled", lambda x, **k: x, {"block": [16, 32], "unroll": [1, 2], "layout": ["row", "a,b]"],
                                              "scale": [0.5, 1], "vector": [False, True]})
    config = {"block": 32, "unroll": 2, "layout": "a,b]", "scale": 0.5, "vector": True}
    name = space.config_name(config)
    assert name == 'tiled[block=32,unroll=2,layout="a,b]",scale=0.5,vector=True]'
    assert space.parse(name) == config
    assert space.config(space.rank(config)) == config
    assert space.config_name({"block": 16, "unroll": 1, "layout": "row", "scale": 1, "vector": False}) == \
        "tiled[block=16,unroll=1,layout=row,scale=1,vector=False]"
    for bad in ("tiled[block=48,unroll=2]", "other[block=32]", "tiled[unroll=2,block=32]", "tiled[block=32"):
        assert space.parse(bad) is None


def test_every_rank_maps_to_a_distinct_config_first_parameter_most_significant() -> None:
    space = Space("s", lambda x, **k: x, {"a": [1, 2, 3], "b": ["x", "y"]})
    configs = [space.config(r) for r in range(space.size)]
    assert configs[:3] == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}]
    assert [space.rank(c) for c in configs] == list(range(6))
    with pytest.raises(IndexError):
        space.config(6)


@pytest.mark.parametrize("params, restrict, message", [
    ({"block": []}, None, "non-empty list"),
    ({"block": [1, 1]}, None, "lists 1 twice"),
    ({"block": [1, None]}, None, "not an int, float, bool or str"),
    ({"block": [1.0, float("nan")]}, None, "not an int, float, bool or str"),
    ({"2x": [1]}, None, "not an identifier"),
    ({"block": [1]}, "warp > 1", "'warp', which is not a parameter"),
    ({"block": [1]}, "block.bit_length() > 1", "calls something other"),
    ({"block": [1]}, 42, "neither an expression nor a callable"),
])
def test_a_bad_space_is_invalid_input_naming_the_space(params: dict, restrict: object, message: str) -> None:
    with pytest.raises(TuneFailure) as caught:
        Space("tiled", lambda x, **k: x, params, restrict)  # type: ignore[arg-type]
    assert caught.value.kind is FailureKind.INVALID_INPUT
    assert "space 'tiled'" in caught.value.message and message in caught.value.message


def test_restrictions_may_be_expressions_callables_or_a_list_of_both() -> None:
    space = Space("s", lambda x, **k: x, {"a": [1, 2, 4], "b": [1, 2]},
                  ["a * b <= 4", lambda a, b: a != b])
    assert [space.config(r) for r in space.feasible_ranks()] == [{"a": 1, "b": 2}, {"a": 2, "b": 1}, {"a": 4, "b": 1}]
    failing = Space("s", lambda x, **k: x, {"a": [0, 1]}, "4 // a > 1")
    with pytest.raises(TuneFailure, match=r"space 's': restriction '4 // a > 1' failed for \{'a': 0\}"):
        list(failing.feasible_ranks())


def test_a_million_config_space_is_never_materialized() -> None:
    values = list(range(100))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        big = farm.TunableSet("big", signature=farm.array_signature)
        big.add(lambda x: x, name="reference", reference=True)
        big.space(a=values, b=values, c=values, restrict="a + b + c > 10")(lambda x, *, a, b, c: x)
        roster = big.roster()
        assert len(roster) == 1 + 100**3 and len(big) == 1 + 100**3
        assert roster[500_001].name == "<lambda>[a=50,b=0,c=0]"
        assert roster.position("<lambda>[a=99,b=99,c=99]") == 100**3
        assert roster.key_entries[1].name.startswith("<lambda>[a=0|1|2|")
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert used < 1 << 20, f"{used} bytes for a space of 10**6 configs"


def test_the_cache_key_names_the_space_and_a_grown_space_keeps_its_operation() -> None:
    client = farm.HostClient(0)
    x = np.ones(8)
    problem, roster, _ = stack_request("scale", "cpu", client, scale_set(), (x,))
    grown_problem, grown, _ = stack_request("scale", "cpu", client, scale_set(block=[16, 32, 64, 128, 256]), (x,))
    key = CacheKey.decode(farm.cache_key(problem, roster, 0, farm.StackPolicy()))
    assert [c.name for c in key.candidates] == [
        "reference", "tiled[block=16|32|64|128,unroll=1|2|4|8] where block * unroll <= 256 #"
        + key.candidates[1].name.rsplit("#", 1)[1], "doubled"]
    assert OperationKey.decode(problem.operation) == OperationKey.decode(grown_problem.operation)
    assert farm.cache_key(problem, roster, 0, farm.StackPolicy()) != farm.cache_key(grown_problem, grown, 0, farm.StackPolicy())
    other_restriction = stack_request("scale", "cpu", client, scale_set(restrict="block * unroll < 256"), (x,))[0]
    assert OperationKey.decode(other_restriction.operation) != OperationKey.decode(problem.operation)


def test_strategy_max_configs_and_seed_are_not_in_the_accuracy_key() -> None:
    plain = farm.StackPolicy()
    assert plain.accuracy_key() == farm.StackPolicy(strategy="bayes", max_configs=60, seed=3).accuracy_key()


@pytest.mark.parametrize("field, value, message", [
    ("strategy", "genetic", "policy.strategy must be one of exhaustive, random, bayes, local, got 'genetic'"),
    ("max_configs", 0, "policy.max_configs must be an integer"),
    ("max_configs", True, "policy.max_configs must be an integer"),
    ("seed", -1, "policy.seed must be an integer"),
    ("seed", 1.5, "policy.seed must be an integer"),
])
def test_a_bad_strategy_setting_is_invalid_input_naming_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(TuneFailure, match=message.replace("(", r"\(")):
        farm.StackPolicy.from_dict({field: value})


def test_a_space_tunes_in_process_on_a_real_client_and_never_picks_a_wrong_config() -> None:
    policy = farm.StackPolicy(warmups=1, samples=3, max_relative_mad=1.0, min_speedup=1.0)
    x = np.random.default_rng(0).random(64)
    tuned = farm.tune(scale_set(), x, policy=policy)
    report = tuned.report
    assert report is not None
    assert (report.strategy, report.evaluated, report.space_size) == ("exhaustive", 13, 16)
    notes = {c.name: c.note for c in report.candidates}
    assert {"tiled[block=16,unroll=1]", "tiled[block=128,unroll=2]", "doubled", "reference"} <= set(notes)
    assert "tiled[block=128,unroll=4]" not in notes  # infeasible: 512 > 256, never run
    assert notes["tiled[block=16,unroll=1]"].startswith("rejected: wrong output")
    assert not tuned.name.startswith("tiled[block=16,")
    np.testing.assert_allclose(tuned.fn(x), x * 2.0)
    assert report.covered == {"tiled": {"block": [16, 32, 64, 128], "unroll": [1, 2, 4, 8]}}


def test_try_execute_stack_runs_the_chosen_config_and_serves_it_from_memory_next_time() -> None:
    from farm import adapter

    tuner = farm.enable_stack_autotune(farm.StackPolicy(warmups=1, samples=3, max_relative_mad=1.0))
    try:
        client = farm.HostClient(0)
        ts = scale_set()
        x = np.arange(32, dtype=np.float64)
        np.testing.assert_allclose(farm.try_execute_stack("scale", "cpu", client, ts, (x,)), x * 2.0)
        np.testing.assert_allclose(farm.try_execute_stack("scale", "cpu", client, ts, (x,)), x * 2.0)
        assert (tuner.stats().tunes, tuner.stats().memory_hits) == (1, 1)
        assert tuner.reports()[-1].space_size == 16
    finally:
        adapter._uninstall_for_tests()


def test_a_catalog_policy_with_a_bad_strategy_names_the_file_and_field(tmp_path) -> None:
    from farm.errors import ConfigError
    from farm_coordinator.catalog import load_catalog

    path = tmp_path / "c.toml"
    path.write_text('[policy]\nstrategy = "genetic"\n\n[[problems]]\noperation = "matmul"\n'
                    'workloads = [{ m = 2, n = 2, k = 2, dtype = "float32" }]\n')
    with pytest.raises(ConfigError, match=r"c\.toml.*policy.*policy\.strategy must be one of exhaustive, random, bayes"):
        load_catalog(path)
    path.write_text('[policy]\nstrategy = "bayes"\nmax_configs = 60\nseed = 3\n\n[[problems]]\noperation = "matmul"\n'
                    'workloads = [{ m = 2, n = 2, k = 2, dtype = "float32" }]\n')
    policy = load_catalog(path).policy
    assert (policy.strategy, policy.max_configs, policy.seed) == ("bayes", 60, 3)


DECORATED = '''
import farm

blocked = farm.TunableSet("scale", signature=farm.array_signature)


@blocked.reference
def reference(x):
    return x * 2.0


@blocked.space(group=0, block=BLOCKS, unroll=[1, 2, 4, 8],
               restrict="block * unroll <= 256")
def tiled(x, *, block, unroll):
    return x * 2.0 if block != 16 else x * 3.0
'''


def decorated_module(directory, name: str, blocks: list[int]) -> farm.TunableSet:
    """The module a user writes, space declared with the documented decorator form and literal value lists."""
    import importlib.util

    path = directory / f"{name}.py"
    path.write_text(DECORATED.replace("BLOCKS", repr(blocks)))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.blocked


def test_a_space_declared_with_the_decorator_form_grows_incrementally_in_process(tmp_path) -> None:
    from farm import adapter

    small = decorated_module(tmp_path, "scale_v1", [16, 32, 64, 128])
    grown = decorated_module(tmp_path, "scale_v2", [16, 32, 64, 128, 256])
    # The decorator's value lists are not the code: the family and the set's checksum stay.
    assert small.spaces[0].family() == grown.spaces[0].family()
    assert small.checksum() == grown.checksum()
    assert "@blocked.space" not in farm.codetext.code_text(grown.spaces[0].fn)
    tuner = farm.enable_stack_autotune(farm.StackPolicy(warmups=1, samples=3, max_relative_mad=1.0),
                                       cache_directory=tmp_path / "cache")
    try:
        client, x = farm.HostClient(0), np.arange(64, dtype=np.float64)
        farm.try_execute_stack("scale", "cpu", client, small, (x,))
        first = tuner.reports()[-1]
        assert (first.incremental, first.evaluated, first.space_size) == (False, 13, 16)
        np.testing.assert_allclose(farm.try_execute_stack("scale", "cpu", client, grown, (x,)), x * 2.0)
        again = tuner.reports()[-1]
        # Only block=256 with unroll 1 (256 * 1 <= 256) is new and feasible.
        assert (again.incremental, again.evaluated, again.space_size) == (True, 1, 20)
        assert again.covered == {"tiled": {"block": [16, 32, 64, 128, 256], "unroll": [1, 2, 4, 8]}}
    finally:
        adapter._uninstall_for_tests()


NO_SOURCE = '''
import hashlib
import numpy as np
from farm.codetext import code_text

def scaled(x, *, block):
    return np.sum([v for v in x[:block] if v in {"p", "q", "r", "s"}])

def meaned(x, *, block):
    return np.mean([v for v in x[:block] if v in {"p", "q", "r", "s"}])

print(hashlib.sha256(code_text(scaled).encode()).hexdigest(), code_text(scaled) == code_text(meaned))
'''


def test_a_function_without_source_has_one_identity_in_every_process_and_its_names_count() -> None:
    """Defined with ``python -c`` (no source file): its bytecode, names and constants, a comprehension's code by
    its text and a set in sorted order, so two processes with different hash seeds agree; ``np.sum`` and
    ``np.mean`` (the same bytecode) differ."""
    import subprocess
    import sys

    from servers import farm_env

    said = [subprocess.run([sys.executable, "-c", NO_SOURCE], capture_output=True, text=True, timeout=120,
                           env=farm_env({"PYTHONHASHSEED": seed})) for seed in ("1", "2")]
    assert all(s.returncode == 0 for s in said), [s.stderr for s in said]
    (one,) = {s.stdout for s in said}
    assert one.split()[1] == "False", one
