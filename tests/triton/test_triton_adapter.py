"""The adapter in one process: both ways in, what is in the key, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import triton
from tier import records
from triton_ops import CONFIGS, KEY, NAME, add_kernel, grid

import farm_triton
from farm.errors import ConfigError, TuneFailure
from farm_coordinator.catalog import load_catalog
from farm_triton import identity
from farm_triton.registry import Kernel


def launch(kernel, n: int) -> torch.Tensor:
    x, y = torch.rand(n), torch.rand(n)
    out = torch.empty_like(x)
    kernel[lambda meta: grid(meta, x, y, out, n)](x, y, out, n)
    assert torch.allclose(out, x + y)
    return out


def fail_benchmark(kernel_call, quantiles):
    raise AssertionError("Triton ran a benchmark")


def test_the_decorator_keeps_tritons_signature_and_serves_the_farms_config(tuned: Path) -> None:
    farm_triton.configure(policy=load_catalog(tuned / "policy.toml", policy_only=True).policy,
                          cache_directory=tuned / "cache")
    kernel = farm_triton.autotune(configs=CONFIGS, key=KEY, name=NAME, do_bench=fail_benchmark)(add_kernel)
    launch(kernel, 4096)
    (record,) = records(tuned)
    assert kernel.best_config is identity.served(record.index, CONFIGS)
    assert farm_triton.current().counts == {"hits": 1, "misses": 0}


def test_on_a_miss_the_decorator_leaves_tritons_own_autotuning_and_the_applications_pruning(tuned: Path) -> None:
    farm_triton.configure(cache_directory=tuned / "cache")
    timed: list[str] = []

    def bench(kernel_call, quantiles):
        timed.append("bench")
        return [1.0, 1.0, 1.0]

    def mine(configs, named_args, **kwargs):
        return [configs[2], configs[3]]

    kernel = farm_triton.autotune(configs=CONFIGS, key=KEY, name=NAME, do_bench=bench,
                                  prune_configs_by={"early_config_prune": mine})(add_kernel)
    launch(kernel, 777)
    assert timed == ["bench", "bench"]  # Triton tuned the two configs the application's own pruning kept
    assert farm_triton.current().counts == {"hits": 0, "misses": 1}


def test_an_unconfigured_process_falls_back_to_the_first_config_when_asked() -> None:
    kernel = triton.autotune(configs=CONFIGS, key=KEY, do_bench=fail_benchmark,
                             prune_configs_by={"early_config_prune": farm_triton.decided(NAME, on_miss="first")})(add_kernel)
    launch(kernel, 500)
    assert kernel.best_config is CONFIGS[0]


def kernel_with(configs=tuple(CONFIGS), fn=add_kernel, name=NAME) -> Kernel:
    return Kernel(name, fn, tuple(configs), tuple(KEY), tuple(add_kernel.arg_names))


@triton.jit
def other_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: triton.language.constexpr):
    pid = triton.language.program_id(0)
    offsets = pid * BLOCK + triton.language.arange(0, BLOCK)
    triton.language.store(out_ptr + offsets, triton.language.load(x_ptr + offsets), mask=offsets < n)


@pytest.mark.parametrize("changed", [
    kernel_with(configs=[*CONFIGS[:3], triton.Config({"BLOCK": 2048}, num_warps=4, num_stages=2)]),  # num_warps
    kernel_with(configs=[*CONFIGS[:3], triton.Config({"BLOCK": 2048}, num_warps=8, num_stages=3)]),  # num_stages
    kernel_with(configs=CONFIGS[:3]),  # the config list
    kernel_with(fn=other_kernel),  # the kernel's source
    kernel_with(name="another_name"),
], ids=["num_warps", "num_stages", "config list", "kernel source", "operation name"])
def test_whatever_makes_a_timing_stale_changes_the_operations_checksum(changed: Kernel) -> None:
    base = kernel_with()
    assert identity.checksum(base.name, base.fn, base.configs) != identity.checksum(changed.name, changed.fn, changed.configs)


def test_another_triton_build_is_another_checksum(monkeypatch: pytest.MonkeyPatch) -> None:
    before = identity.checksum(NAME, add_kernel, CONFIGS)
    monkeypatch.setattr(triton, "__version__", "0.0.0-other")
    identity.backend_identity.cache_clear()
    try:
        assert identity.checksum(NAME, add_kernel, CONFIGS) != before
    finally:
        identity.backend_identity.cache_clear()


def test_the_workload_is_tritons_own_tuning_key() -> None:
    keys: list[tuple] = []
    kernel = triton.autotune(configs=CONFIGS, key=KEY,
                             prune_configs_by={"early_config_prune": lambda c, named, **kw: keys.append(tuple(named)) or [c[2]]})(add_kernel)
    launch(kernel, 300)
    (cached,) = kernel.cache  # the key Triton stored its config under
    x = torch.rand(300)
    named = {"x_ptr": x, "y_ptr": x, "out_ptr": x, "n": 300}
    assert identity.tuning_key(KEY, add_kernel.arg_names, named) == cached
    assert identity.workload(cached) != identity.workload((301, *cached[1:]))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: farm_triton.decided(""), "name must be a non-empty string"),
    (lambda: farm_triton.decided(NAME, on_miss="best"), "on_miss must be None or 'first'"),
    (lambda: farm_triton.decided(NAME, reference=-1), "reference must be a config index"),
    (lambda: farm_triton.decided("farmtriton_unknown")(CONFIGS, {}), "must be an early_config_prune of @triton.autotune"),
    (lambda: farm_triton.decided(NAME, reference=9)(CONFIGS, {}), "no config 9 to be the reference"),
])
def test_bad_hook_arguments_are_invalid_input_naming_the_problem(call, message: str) -> None:
    with pytest.raises(TuneFailure, match=message):
        call()


@pytest.mark.parametrize(("kw", "field"), [
    ({"outputs": ("nope",)}, "outputs"),
    ({"configs": []}, "configs"),
    ({"configs": [{"BLOCK": 4}]}, "configs"),
    ({"reference": 9}, "reference"),
])
def test_a_bad_operation_is_a_config_error_naming_the_field(kw: dict, field: str) -> None:
    args = {"configs": CONFIGS, "key": KEY, "grid": grid, "inputs": lambda s, d, g: (), "outputs": ("out_ptr",),
            "reference": 0, **kw}
    with pytest.raises(ConfigError) as e:
        farm_triton.operation("farmtriton_bad", add_kernel, **args)
    assert e.value.field == field


def test_a_hook_called_outside_tritons_autotuner_finds_an_operation_this_process_loaded(tuned: Path) -> None:
    # torch.compile calls early_config_prune from its own code: an operation loaded here names the kernel.
    farm_triton.configure(policy=load_catalog(tuned / "policy.toml", policy_only=True).policy,
                          cache_directory=tuned / "cache")
    x = torch.rand(4096)
    (record,) = records(tuned)
    chosen = farm_triton.decided(NAME)(CONFIGS, {"x_ptr": x, "y_ptr": x, "out_ptr": x, "n": 4096})
    assert chosen == [identity.served(record.index, CONFIGS)]


def test_a_space_is_every_combination_in_a_fixed_order() -> None:
    configs = farm_triton.space({"BLOCK": [32, 64]}, num_warps=[1, 2], num_stages=[1])
    assert [(c.kwargs, c.num_warps, c.num_stages) for c in configs] == [
        ({"BLOCK": 32}, 1, 1), ({"BLOCK": 32}, 2, 1), ({"BLOCK": 64}, 1, 1), ({"BLOCK": 64}, 2, 1)]
    with pytest.raises(TuneFailure, match="num_warps must be a non-empty list"):
        farm_triton.space({"BLOCK": [32]}, num_warps=[])


def test_on_the_farm_a_configs_pre_hook_runs_before_its_launch_with_the_arguments_by_name() -> None:
    from triton_kernels import make

    import farm
    from farm_kernels import dim

    seen: list[list[str]] = []
    config = triton.Config({"BLOCK": 1024}, num_warps=4, pre_hook=lambda named: seen.append(sorted(named)))
    op = farm_triton.operation("farmtriton_hooked", add_kernel, configs=[config], key=KEY, grid=grid, inputs=make,
                               outputs=("out_ptr",), reference=0, fields=(dim("n"),))
    inputs = op.build({"n": 100, "dtype": "float32"}, farm.HostClient(0))
    out = op.host[0].fn(*inputs)
    assert seen == [sorted(["x_ptr", "y_ptr", "out_ptr", "n", *config.all_kwargs()])]
    assert (out == (inputs[0] + inputs[1]).numpy()).all()


def test_a_lookup_that_fails_leaves_the_launch_to_triton(caplog: pytest.LogCaptureFixture) -> None:
    decisions = farm_triton.configure(device="cuda:7")  # no such device here: the environment probe fails
    kernel = farm_triton.autotune(configs=CONFIGS, key=KEY, name=NAME, on_miss="first", do_bench=fail_benchmark)(add_kernel)
    with caplog.at_level("WARNING", logger="farm_triton"):
        launch(kernel, 200)
    assert kernel.best_config is CONFIGS[0]
    assert decisions.counts == {"hits": 0, "misses": 0}  # no lookup completed
    assert f"no farm decision for {NAME}" in caplog.text


def test_without_configure_the_farm_controllers_tiers_and_policy_serve_the_kernel(tuned: Path) -> None:
    import farm

    farm.enable_stack_autotune(load_catalog(tuned / "policy.toml", policy_only=True).policy,
                               cache_directory=tuned / "cache")
    kernel = triton.autotune(configs=CONFIGS, key=KEY, do_bench=fail_benchmark,
                             prune_configs_by={"early_config_prune": farm_triton.decided(NAME)})(add_kernel)
    launch(kernel, 4096)
    (record,) = records(tuned)
    assert kernel.best_config is identity.served(record.index, CONFIGS)
    assert farm_triton.current().counts == {"hits": 1, "misses": 0}


def test_a_settled_key_launches_its_config_without_tritons_run_and_a_new_key_goes_through_it(
        tuned: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime.autotuner import Autotuner

    farm_triton.configure(cache_directory=tuned / "cache")
    kernel = farm_triton.autotune(configs=CONFIGS, key=KEY, name=NAME, on_miss="first", do_bench=fail_benchmark)(add_kernel)
    assert isinstance(kernel, Autotuner)  # still Triton's autotuner, with its state and attributes
    entered: list[tuple] = []
    original = Autotuner.run

    def counted(self, *args, **kwargs):
        entered.append(args[3:4] or (kwargs.get("n"),))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Autotuner, "run", counted)
    x, y = torch.rand(300), torch.rand(300)
    out = torch.empty_like(x)
    for _ in range(3):
        kernel[lambda meta: grid(meta, x, y, out, 300)](x, y, out, 300)
    kernel[lambda meta: grid(meta, x, y, out, 300)](x, y, out_ptr=out, n=300)  # keywords: the same Triton key
    assert torch.allclose(out, x + y) and kernel.best_config is CONFIGS[0]
    assert entered == [(300,)]  # only the first launch of the key went through Triton's run
    z = torch.rand(300, dtype=torch.float64)
    kernel[lambda meta: grid(meta, z, z, z, 300)](z, z, torch.empty_like(z), 300)  # another dtype: another key
    assert len(entered) == 2 and set(kernel.cache) == {(300, "torch.float32", "torch.float32", "torch.float32"),
                                                       (300, "torch.float64", "torch.float64", "torch.float64")}
