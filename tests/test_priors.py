"""Priors (farm.priors): other devices' decisions read as rankings, weighted by how well each predicted this
device, evaluated first and seeding the strategy; a decision records the priors it used and keeps a ranking."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
from test_replay import recording

import farm
from farm.errors import TuneFailure
from farm.priors import PriorFirst, Source, source, weight
from farm.spacesearch import Explored, space_meta
from farm.stores.base import DecisionRecord
from farm.strategies import make_sampler

HUB = Path(__file__).resolve().parent.parent / "recordings" / "benchmark_hub"
DEVICE = farm.Timing.DEVICE
RANKING = Source("gpu-a", (("a", 0.1), ("b", 0.2), ("c", 0.3), ("d", 0.4), ("e", 0.5)))


@pytest.mark.parametrize(
    ("measured", "expected"),
    [
        ({}, 1.0),  # no evidence: the prior is trusted
        ({"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4, "e": 0.5}, 1.0),  # the same order, other ratios
        ({"a": 0.5, "b": 0.4, "c": 0.3, "d": 0.2, "e": 0.1}, 0.0),  # reversed: muted
        ({"a": 0.5, "b": 0.4, "c": 0.3}, 0.0),  # reversed on three
        ({"x": 0.1, "y": 0.2}, 1.0),  # nothing in common with an incomplete source
        ({"a": 0.1, "b": 0.2, "c": 0.4, "d": 0.3, "e": 0.5}, pytest.approx(0.833, abs=1e-3)),  # one swap
    ],
)
def test_a_source_weighs_its_rank_agreement_with_this_device(measured: dict[str, float], expected: float) -> None:
    assert weight(RANKING, measured) == expected


def test_a_complete_source_loses_weight_when_a_config_it_ranks_below_its_list_is_faster_here() -> None:
    complete = Source("gpu-a", RANKING.ranking[:2], complete=True)
    assert weight(complete, {"a": 0.1, "b": 0.2, "x": 0.5, "y": 0.6}) == 1.0
    assert weight(complete, {"a": 0.5, "b": 0.6, "x": 0.1, "y": 0.2}) == 0.0
    # An incomplete source (a search that did not cover the space) says nothing of configs it does not list.
    assert weight(Source("gpu-a", complete.ranking), {"a": 0.5, "b": 0.6, "x": 0.1, "y": 0.2}) == 1.0


def test_a_reversed_source_is_muted_and_the_strategy_takes_over(tmp_path: Path) -> None:
    rec = farm.replay.load(recording(tmp_path))
    roster = rec.tunable.roster()
    names = roster.names
    good = [n for n in names if n.startswith("kernel[") and roster[names.index(n)].eligible]
    truth = {n: float(i + 1) for i, n in enumerate(good)}  # this device: position order is best first
    reversed_source = Source("gpu-wrong", tuple((n, truth[n]) for n in reversed(good)))
    policy = farm.StackPolicy(strategy="exhaustive")
    prior = PriorFirst(make_sampler(roster, policy), roster, [reversed_source], None, names[0])
    asked = prior.ask(3)
    assert [names[p] for p in asked] == good[::-1][:3]  # the prior's best first
    prior.tell([(p, truth[names[p]]) for p in asked])
    assert prior.weights[0] == 0.0  # its three best ran in reverse order here: muted
    following = prior.ask(2)
    assert [names[p] for p in following] == [n for n in good if names.index(n) not in asked][:2]  # exhaustive's own


def test_the_priors_best_config_is_evaluated_first_and_the_report_names_the_prior(tmp_path: Path) -> None:
    rec = farm.replay.load(recording(tmp_path))
    best = rec.best[0]
    client = rec.client(seed=0)
    keys: list[Any] = []
    run = client.run
    client.run = lambda key: keys.append(key) or run(key)  # type: ignore[method-assign]
    prior = Source("gpu-elsewhere", ((best, 0.2), ("kernel[block=32,unroll=2]", 0.9)))
    tuned = farm.tune(rec.tunable, rec.inputs, device=client, priors=[prior],
                      policy=farm.StackPolicy(timing=DEVICE, strategy="exhaustive", budget=60.0))
    first = next(k for k in keys if k != (16, 1))  # after the reference's own runs
    assert first == (64, 2) and tuned.name == best
    assert tuned.report is not None and tuned.report.priors == ("gpu-elsewhere",)
    assert tuned.report.estimates[0][0] == best  # every evaluated config, best first
    assert {n for n, _ in tuned.report.estimates} >= {"reference", "kernel[block=16,unroll=2]"}


def test_a_prior_without_a_ranking_is_invalid_input(tmp_path: Path) -> None:
    rec = farm.replay.load(recording(tmp_path))
    bare = DecisionRecord("key", 1, 0, "kernel[block=64,unroll=2]", True, 0.25, 0.0, {})
    with pytest.raises(TuneFailure, match="ranking"):
        farm.tune(rec.tunable, rec.inputs, device=rec.client(), priors=[bare])
    with pytest.raises(TuneFailure, match="Tuned result or a DecisionRecord"):
        farm.tune(rec.tunable, rec.inputs, device=rec.client(), priors=["A100"])  # type: ignore[list-item]


def test_a_decision_keeps_a_bounded_ranking_and_its_priors_and_a_record_reads_back_as_a_prior() -> None:
    estimates = tuple((f"kernel[x={i}]", 0.1 + i / 100) for i in range(50)) + (("reference", 1.0),)
    spaced = Explored((1.0,), (), False, 50, 64, {"kernel": {"x": list(range(64))}}, False, estimates, ("gpu-a",))
    meta = space_meta(farm.StackPolicy(), spaced, "kernel[x=0]")
    assert meta["priors"] == ["gpu-a"] and len(meta["ranked"]) == 32 and meta["ranked"][0] == ["kernel[x=0]", 0.1]
    read = source(DecisionRecord("not a cache key", 1, 0, "kernel[x=0]", True, 0.1, 0.0, meta))
    assert read.complete and [n for n, _ in read.ranking[:2]] == ["kernel[x=0]", "kernel[x=1]"]


def picks(rec: farm.replay.Recording, strategy: str, configs: int | None, priors: list[Any],
          seeds: range) -> list[tuple[float, float]]:
    out = []
    for seed in seeds:
        client = rec.client(seed=seed)
        tuned = farm.tune(rec.tunable, rec.inputs, device=client, priors=priors,
                          policy=farm.StackPolicy(timing=DEVICE, strategy=strategy, max_configs=configs, seed=seed,
                                                  budget=1e9))
        out.append((rec.mean_ms(tuned.name) / rec.best[1], client.device_seconds))
    return out


def test_a_same_vendor_prior_finds_the_optimum_in_20_configs_where_the_search_alone_does_not() -> None:
    a4000 = farm.replay.load(HUB / "convolution_A4000.json.gz")
    a6000 = farm.replay.load(HUB / "convolution_A6000.json.gz")
    prior = source(picks_tuned(a4000), limit=32)  # what its decision record keeps
    assert prior.complete and len(prior.ranking) == 32
    alone = picks(a6000, "local", 20, [], range(3))
    helped = picks(a6000, "local", 20, [prior], range(3))
    assert statistics.median(p for p, _ in helped) <= 1.02 and max(p for p, _ in helped) <= 1.05
    assert statistics.median(p for p, _ in alone) > 1.1
    assert statistics.median(s for _, s in helped) <= statistics.median(s for _, s in alone) * 1.1


def test_a_misleading_prior_costs_an_exhaustive_search_little_and_never_its_pick() -> None:
    # The A100's best convolution configs are 14.7x off the optimum on the MI250X.
    a100 = farm.replay.load(HUB / "convolution_A100.json.gz")
    mi250x = farm.replay.load(HUB / "convolution_MI250X.json.gz")
    misleading = source(picks_tuned(a100), limit=32)
    (alone_pick, alone_seconds), = picks(mi250x, "exhaustive", None, [], range(1))
    (misled_pick, misled_seconds), = picks(mi250x, "exhaustive", None, [misleading], range(1))
    assert misled_pick <= 1.01 and alone_pick <= 1.01
    assert misled_seconds <= 1.1 * alone_seconds


def picks_tuned(rec: farm.replay.Recording) -> farm.Tuned:
    return farm.tune(rec.tunable, rec.inputs, device=rec.client(seed=0),
                     policy=farm.StackPolicy(timing=DEVICE, strategy="exhaustive", budget=1e9))


@pytest.mark.parametrize("strategy", ["exhaustive", "random", "bayes", "local"])
def test_every_strategy_adopts_the_priors_configs_and_never_proposes_them_again(tmp_path: Path, strategy: str) -> None:
    rec = farm.replay.load(recording(tmp_path))
    prior = Source("gpu-elsewhere", ((rec.best[0], 0.2), ("kernel[block=32,unroll=2]", 0.5)))
    client = rec.client(seed=0)
    tuned = farm.tune(rec.tunable, rec.inputs, device=client, priors=[prior],
                      policy=farm.StackPolicy(timing=DEVICE, strategy=strategy, max_configs=6, seed=0, budget=60.0))
    assert tuned.name == rec.best[0] and tuned.report is not None and tuned.report.evaluated == 6
    evaluated = [c.name for c in tuned.report.candidates if c.name != "reference"]
    assert len(evaluated) == len(set(evaluated)) == 6  # the prior's configs count toward max_configs, once
