"""Fleet priors on the farm (issue 36): a problem planned for a fingerprint without a decision of its family starts
its space search from the same family's decisions on other fingerprints. Pure tables for the family id across
fingerprints, the priors' rounds of the space search and what a decision keeps; each store's lookup (a real
redis-server, the local cache, archives); and two SKUs' recordings tuned by real replay workers, the second
seeded by the first's decision."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from archive_helpers import FP_A, FP_B, key_for, make_record
from farm_spaceops import OPERATIONS as SPACE_OPERATIONS
from servers import farm_env
from test_replay_farm import farm, write_recording

import farm_archives
from farm.environment import fingerprint_digest
from farm.identity import Problem, Scope, cache_key, fields
from farm.policy import StackPolicy
from farm.priors import Source
from farm.replay import load
from farm.stores import archive as arc
from farm.stores.base import DecisionRecord, Publication
from farm.stores.local import FARM, LocalStore
from farm.stores.redis import KeyLayout, RedisDecisions
from farm.trials import Outcome, TrialVerdict
from farm_coordinator.aggregate import aggregate
from farm_coordinator.catalog import Workload, load_catalog
from farm_coordinator.plan import PlannedProblem, Planner, SpaceFamily, Target
from farm_coordinator.priors import PriorTiers, run_lookup
from farm_coordinator.publish import family_alias
from farm_coordinator.spacestrategy import (
    RaceSearch,
    SpaceSearch,
    parse_group,
    parse_prior_group,
    prior_group,
)
from farm_fleet.protocol import GroupResult, GroupTask
from farm_kernels import recorded

ROSTER = SPACE_OPERATIONS[0].host.roster()
REF = ROSTER.names[0]
CONFIGS = [n for n in ROSTER.names[1:] if ROSTER[ROSTER.names.index(n)].eligible]  # 7: one is infeasible
FP_C = fields(["host-numpy", "cpu", "model C", "driver 1", "cpython", "build 1", "", "opts"])
HUB = Path(__file__).resolve().parent.parent / "recordings" / "benchmark_hub"


# -- the family across fingerprints (pure) ------------------------------------------------------------------------

def test_a_registry_problem_has_one_family_id_across_fingerprints_and_its_own_family_id_per_fingerprint(
        tmp_path: Path) -> None:
    catalog = load_catalog(tmp_path.joinpath("c.toml").write_text(
        '[policy]\nstrategy = "random"\nmax_configs = 4\n\n[[problems]]\noperation = "farmtest_space"\n'
        'workloads = [{ n = 100, dtype = "float64" }, { n = 200, dtype = "float64" }]\n') and tmp_path / "c.toml",
        ("farm_spaceops",))
    a, b = (Target(d * 16, d, "cpu", ("w",)) for d in "ab")
    planner = Planner(catalog, [a, b], "run")
    small, large = catalog.workloads
    assert planner.family_id(a, small) != planner.family_id(b, small)  # this fingerprint's own family
    assert planner.fleet_family_id(a, small) == planner.fleet_family_id(b, small)  # across fingerprints
    assert planner.fleet_family_id(a, small) != planner.fleet_family_id(a, large)  # another workload: another family
    assert planner.fleet_family_id(a, small) not in (planner.problem_id(a, small), planner.family_id(a, small))


def test_two_recordings_of_one_kernel_on_two_devices_are_one_family_across_their_fingerprints(tmp_path: Path) -> None:
    folder = tmp_path / "recordings"
    folder.mkdir()
    a = write_recording(folder / "vector_add_A.json", "GPU A", (64, 4, 0), 1)
    b = write_recording(folder / "vector_add_B.json", "GPU B", (32, 2, 1), 2)
    other = folder / "scale_C.json"
    other.write_text(a.read_text().replace('"vector_add"', '"scale"'))
    catalog_path = tmp_path / "catalog.toml"
    catalog_path.write_text('[policy]\nstrategy = "random"\nmax_configs = 4\n\n'
                            + "".join(f'[[problems]]\nrecording = "recordings/{p.name}"\n\n' for p in (a, b, other)))
    catalog = load_catalog(catalog_path)
    targets = [Target(recorded.fingerprint_of(load(p)), "fp", recorded.KIND, ("w",)) for p in (a, b, other)]
    planner = Planner(catalog, targets, "run")
    pairs = list(planner.pairs())
    assert [t.digest for t, _ in pairs] == [t.digest for t in targets]  # each recording on its own fingerprint
    problems = {planner.problem_id(t, w) for t, w in pairs}
    fleet = [planner.fleet_family_id(t, w) for t, w in pairs]
    assert len(problems) == 3  # three problems (each names its file) ...
    assert fleet[0] == fleet[1] != fleet[2]  # ... the two vector_add recordings are one family, scale another


# -- the priors' rounds of the farm's space search (pure) ---------------------------------------------------------

def plan_of(sources: tuple[Source, ...], workers: int = 2) -> PlannedProblem:
    target = Target("d" * 16, "fp", "cpu", tuple(f"w{i}" for i in range(workers)))
    task = GroupTask("run", "pid", "g0", "farmtest_space", "cpu", {"n": 10}, ((REF, "1"),), {}, "d" * 16)
    family = SpaceFamily("fid", (), None, "fleet-id", sources)
    return PlannedProblem("pid", target, Workload("farmtest_space", ("cpu",), {"n": 10}, "w"), (task,), family=family)


def timed(group: str, ratios: dict[str, float]) -> GroupResult:
    """A group whose configs ran: each config ``ratio`` times the reference's 1.0 s, in five pairs."""
    outcomes = tuple(Outcome(ROSTER.position(n) or 0, n, pairs=((1.0, r),) * 5, verdict=TrialVerdict.PASSED,
                             verified=True) for n, r in ratios.items())
    return GroupResult("run", "pid", group, "ok", reference_times=(1.0,) * 5, outcomes=outcomes)


def space(strategy: str = "random", max_configs: int | None = 8) -> SpaceSearch:
    return SpaceSearch(StackPolicy(strategy=strategy, max_configs=max_configs, seed=3), lambda op, kind: ROSTER)


def test_the_priors_best_configs_go_first_in_rounds_of_their_own_then_the_strategys() -> None:
    prior = Source("gpu-b", tuple((n, 0.1 * (i + 1)) for i, n in enumerate(CONFIGS[::-1][:4])))
    s, plan = space(), plan_of((prior,))
    told: dict[str, GroupResult] = {"g0": timed("g0", {})}
    first = s.propose(plan, told, frozenset(), 2)
    assert [a.group for a in first] == [prior_group(0, ROSTER.position(n) or 0) for n in CONFIGS[::-1][:2]]
    assert s.propose(plan, told, frozenset({first[1].group}), 2) == ()  # a priors' round waits for its results
    told.update({a.group: timed(a.group, {a.candidates[0][0]: 0.5 + i / 10}) for i, a in enumerate(first)})
    second = s.propose(plan, told, frozenset(), 2)
    assert [a.candidates[0][0] for a in second] == CONFIGS[::-1][2:4]  # the prior agreed: its next best
    assert {parse_prior_group(a.group)[0] for a in second} == {1}  # type: ignore[index]
    told.update({a.group: timed(a.group, {a.candidates[0][0]: 0.7 + i / 10}) for i, a in enumerate(second)})
    third = s.propose(plan, told, frozenset(), 2)
    assert all(parse_group(a.group) is not None for a in third)  # the prior has no more: the strategy's turn
    assert not {a.candidates[0][0] for a in third} & set(CONFIGS[::-1][:4])  # it never asks the priors' again
    assert len(third) == 2 and s.propose(plan, told, frozenset(), 2) == third  # pure: a restart asks the same


def test_a_source_this_device_contradicts_is_muted_after_its_first_round() -> None:
    wrong = Source("gpu-wrong", tuple((n, 0.1 * (i + 1)) for i, n in enumerate(CONFIGS)))
    s, plan = space(), plan_of((wrong,), workers=3)
    told: dict[str, GroupResult] = {"g0": timed("g0", {})}
    first = s.propose(plan, told, frozenset(), 3)
    assert [a.candidates[0][0] for a in first] == CONFIGS[:3]
    told.update({a.group: timed(a.group, {a.candidates[0][0]: 0.9 - i / 10}) for i, a in enumerate(first)})
    following = s.propose(plan, told, frozenset(), 3)  # reversed here: weight 0, the strategy takes over
    assert following and all(parse_group(a.group) is not None for a in following)


def test_stored_priors_rounds_other_priors_would_not_ask_hand_over_to_the_strategy_with_their_configs() -> None:
    # A coordinator restarted after the fleet published another decision of the family: its priors now start
    # elsewhere. The stored config is kept (adopted and told), the strategy takes over and never asks it again.
    plan = plan_of((Source("gpu-new", ((CONFIGS[3], 0.1),)),), workers=7)
    stored = prior_group(0, ROSTER.position(CONFIGS[0]) or 0)
    told = {"g0": timed("g0", {}), stored: timed(stored, {CONFIGS[0]: 0.5})}
    asks = space().propose(plan, told, frozenset(), 7)
    assert all(parse_group(a.group) is not None for a in asks)
    assert sorted(a.candidates[0][0] for a in asks) == sorted(CONFIGS[1:])


def test_without_priors_the_space_search_is_unchanged() -> None:
    with_none = space().propose(plan_of(()), {"g0": timed("g0", {})}, frozenset(), 2)
    assert all(parse_group(a.group) is not None for a in with_none)
    plain = dataclasses.replace(plan_of(()), family=None)
    assert [a.group for a in with_none] == [a.group for a in space().propose(plain, {"g0": timed("g0", {})},
                                                                                    frozenset(), 2)]


def test_a_race_sends_the_priors_configs_against_the_incumbent() -> None:
    prior = Source("gpu-b", ((CONFIGS[4], 0.2), (CONFIGS[5], 0.3)))
    race = RaceSearch(StackPolicy(strategy="random", max_configs=6, seed=3, screening="race"), lambda op, kind: ROSTER)
    (ask,) = race.propose(plan_of((prior,), workers=1), {"g0": timed("g0", {})}, frozenset(), 1)
    assert ask.group == prior_group(0, ROSTER.position(CONFIGS[4]) or 0)
    assert ask.incumbent == (REF, ROSTER[0].revision)


# -- what a decision keeps and where it is indexed (pure) ---------------------------------------------------------

def test_a_spaced_decision_keeps_its_ranking_its_family_across_fingerprints_and_its_priors() -> None:
    prior = Source("b" * 16, ((CONFIGS[0], 0.4),))
    plan = plan_of((prior,))
    key = roster_key()
    results = {"g0": dataclasses.replace(timed("g0", {}), cache_key=key, names=tuple(ROSTER.names)),
               "p0.1": dataclasses.replace(timed("p0.1", {CONFIGS[0]: 0.5}), cache_key=key, names=tuple(ROSTER.names)),
               "s0.3": dataclasses.replace(timed("s0.3", {CONFIGS[2]: 0.25}), cache_key=key, names=tuple(ROSTER.names))}
    agg = aggregate(plan, results, StackPolicy(strategy="random", max_configs=6), "run",
                    {"p0.1": ((CONFIGS[0], "1"),), "s0.3": ((CONFIGS[2], "1"),)})
    assert agg.record is not None
    meta = agg.record.meta
    assert meta["fleet_family"] == "fleet-id" and meta["priors"] == ["b" * 16]
    assert [n for n, _ in meta["ranked"]] == [CONFIGS[2], CONFIGS[0], REF]  # best first, the reference kept
    assert family_alias(agg) == ("fleet-id",)  # indexed under the family across fingerprints (not complete)


def roster_key() -> str:
    """The cache key workers would report for the space operation's roster."""
    problem = Problem(Scope.OPERATOR, "farmtest_space", FP_A, "n=10", persistent=True)
    return cache_key(problem, ROSTER, 0, StackPolicy())


# -- each store's lookup across fingerprints ----------------------------------------------------------------------

FAMILY = "f" * 32


def publications() -> list[Publication]:
    """A decision of FAMILY on each of three fingerprints, one of another family on B."""
    out = []
    for fp, workload, family in ((FP_A, "n=1", FAMILY), (FP_B, "n=1", FAMILY), (FP_C, "n=1", FAMILY),
                                 (FP_B, "n=2", "e" * 32)):
        record = make_record(key_for(fp, workload), fleet_family=family, ranked=[["fast", 0.5], ["ref", 1.0]])
        out.append(Publication(record, fp, str(record.meta["problem_id"]), aliases=(family,)))
    return out


def digests(found: list[tuple[str, DecisionRecord]]) -> list[str]:
    return [d for d, _ in found]


EXPECTED = sorted(fingerprint_digest(fp) for fp in (FP_B, FP_C))


@pytest.mark.servers
def test_redis_finds_a_familys_decisions_on_other_fingerprints_in_one_round_trip(redis_db) -> None:
    store = RedisDecisions(client=redis_db, settings=KeyLayout(prefix="tp"))
    store.publish_many(publications())
    found = store.priors(FAMILY, fingerprint_digest(FP_A), 8)
    assert digests(found) == EXPECTED and all(r.meta["fleet_family"] == FAMILY for _, r in found)
    assert digests(store.priors(FAMILY, fingerprint_digest(FP_A), 1)) == EXPECTED[:1]  # bounded
    assert store.priors("0" * 32, "", 8) == []
    store._priors_on_server = False  # a reader without the function: the same answer, client-side
    assert digests(store.priors(FAMILY, fingerprint_digest(FP_A), 8)) == EXPECTED
    assert digests(store.priors(FAMILY, fingerprint_digest(FP_A), 1)) == EXPECTED[:1]


def test_the_local_cache_finds_a_familys_decisions_on_other_fingerprints(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, owner=FARM)
    store.publish_many(publications())
    found = store.priors(FAMILY, fingerprint_digest(FP_A), 8)
    assert digests(found) == EXPECTED and all(r.meta["fleet_family"] == FAMILY for _, r in found)
    assert digests(store.priors(FAMILY, fingerprint_digest(FP_A), 1)) == EXPECTED[:1]
    assert LocalStore(tmp_path / "none").priors(FAMILY, "", 8) == []  # no cache file: nothing


def test_archives_find_a_familys_decisions_on_other_fingerprints_by_their_meta(tmp_path: Path) -> None:
    by_fingerprint: dict[str, list[arc.ArchiveEntry]] = {}
    for pub in publications():
        by_fingerprint.setdefault(pub.fingerprint, []).append(arc.ArchiveEntry(pub.record, pub.problem_id))
    for fp, entries in by_fingerprint.items():
        farm_archives.write_archive(tmp_path, fp, entries)
    archives = arc.ArchiveStore(tmp_path)
    found = archives.priors(FAMILY, fingerprint_digest(FP_A), 8)
    assert digests(found) == EXPECTED and all(r.meta["fleet_family"] == FAMILY for _, r in found)
    assert digests(archives.priors(FAMILY, fingerprint_digest(FP_A), 1)) == EXPECTED[:1]
    assert digests(archives.priors("e" * 32, "", 8)) == [fingerprint_digest(FP_B)]


def test_a_runs_lookup_takes_its_store_first_then_archives_and_none_with_no_priors(tmp_path: Path) -> None:
    pubs = publications()
    store = LocalStore(tmp_path / "cache", owner=FARM)
    store.publish_many([p for p in pubs if p.fingerprint == FP_B])
    farm_archives.write_archive(tmp_path / "archives", FP_C, [arc.ArchiveEntry(p.record) for p in pubs if p.fingerprint == FP_C])
    sink = LocalStore(tmp_path / "cache", owner=FARM)  # the embedded farm's sink
    lookup = run_lookup(sink, True, [str(tmp_path / "archives")])
    assert isinstance(lookup, PriorTiers)
    assert digests(lookup(FAMILY, fingerprint_digest(FP_A), 8)) == EXPECTED  # B from the cache, C from the archive
    assert digests(lookup(FAMILY, fingerprint_digest(FP_A), 1)) == [fingerprint_digest(FP_B)]
    assert run_lookup(sink, False, [str(tmp_path / "archives")]) is None  # --no-priors


def test_the_planner_seeds_a_problem_with_other_fingerprints_fresh_ranked_decisions_only(tmp_path: Path) -> None:
    catalog = load_catalog(tmp_path.joinpath("c.toml").write_text(
        '[policy]\nstrategy = "random"\nmax_configs = 4\n\n[[problems]]\noperation = "farmtest_space"\n'
        'workloads = [{ n = 100, dtype = "float64" }]\n') and tmp_path / "c.toml", ("farm_spaceops",))
    target = Target("a" * 16, "a", "cpu", ("w",))
    (workload,) = catalog.workloads
    fleet = Planner(catalog, [target], "run").fleet_family_id(target, workload)
    assert fleet is not None
    now = time.time()
    ranked = [[CONFIGS[1], 0.5], [REF, 1.0]]
    records = [("b" * 16, make_record(key_for(FP_B, "n=1"), created=now, fleet_family=fleet, ranked=ranked)),
               ("c" * 16, make_record(key_for(FP_C, "n=1"), created=now, fleet_family=fleet)),  # no ranking
               ("d" * 16, make_record(key_for(FP_C, "n=2"), created=1.0, fleet_family=fleet, ranked=ranked)),  # stale
               ("e" * 16, make_record(key_for(FP_C, "n=3"), created=now, fleet_family="x", ranked=ranked))]
    asked: list[tuple[str, str, int]] = []

    def lookup(family: str, exclude: str, limit: int) -> list[tuple[str, DecisionRecord]]:
        asked.append((family, exclude, limit))
        return records

    (problem,) = Planner(catalog, [target], "run", fleet_priors=lookup).problems(
        [(Planner(catalog, [target], "run").problem_id(target, workload), target, workload)])
    assert asked == [(fleet, "a" * 16, 8)]
    assert problem.family is not None and problem.family.fleet_id == fleet
    assert [(s.name, s.ranking) for s in problem.family.fleet_priors] == [("b" * 16, ((CONFIGS[1], 0.5), (REF, 1.0)))]
    (none,) = Planner(catalog, [target], "run").problems([(problem.problem_id, target, workload)])
    assert none.family is not None and none.family.fleet_priors == ()  # --no-priors: no lookup at all


# -- two SKUs on real replay workers -------------------------------------------------------------------------------

POLICY_TOML = '[policy]\nsamples = 5\nwarmups = 1\nbudget = 3.0\nstrategy = "random"\nscreening = "race"\n'

CHEAP = "seed = 0\nmax_configs = 20\n"


def tune_sku(folder: Path, f: Any, name: str, search: str, *options: str) -> dict[str, Any]:
    catalog = folder / f"{name}.toml"
    catalog.write_text(POLICY_TOML + search + f'\n[[problems]]\nrecording = "recordings/{name}.json.gz"\n')
    env = {**f.env, "FARM_KERNEL_CACHE": str(folder / "kcache"), "COLUMNS": "400"}
    done = farm("tune", str(catalog), "--broker", f.broker, "--redis", f.results_url, "--json", *options, env=env,
                cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    (decision,) = json.loads(done.stdout)["decisions"]
    return dict(decision)


@pytest.mark.servers
def test_a_second_sku_starts_from_the_first_skus_decision_and_no_priors_starts_from_nothing(redis_srv, tmp_path):
    from farm_helpers import fleet

    folder = tmp_path / "skus"
    (folder / "recordings").mkdir(parents=True)
    for name in ("convolution_A4000", "convolution_A6000"):
        shutil.copy(HUB / f"{name}.json.gz", folder / "recordings")
    a6000 = load(folder / "recordings" / "convolution_A6000.json.gz")
    with fleet(redis_srv, folder / "recordings", ("replay:convolution_A4000.json.gz",
                                                   "replay:convolution_A6000.json.gz")) as f:
        # The first SKU searched well (200 configs); the new one gets a cheap search (20 configs), same seed.
        first = tune_sku(folder, f, "convolution_A4000", "seed = 1\nmax_configs = 200\n")
        helped = tune_sku(folder, f, "convolution_A6000", CHEAP)
        store = RedisDecisions(client=f.client(), settings=KeyLayout(prefix=f.settings.prefix))
        trials = store.trials(helped["fingerprint"], helped["record"]["cache_key"])  # before --force replaces them
        alone = tune_sku(folder, f, "convolution_A6000", CHEAP, "--force", "--no-priors")
    meta_a, meta_helped, meta_alone = (d["record"]["meta"] for d in (first, helped, alone))
    assert meta_a["priors"] == [] and len(meta_a["ranked"]) > 10  # the first SKU had nothing to start from
    assert meta_a["fleet_family"] == meta_helped["fleet_family"] == meta_alone["fleet_family"]
    assert meta_helped["priors"] == [first["fingerprint"]]  # the second names the first's fingerprint
    assert meta_alone["priors"] == []  # --no-priors: none
    # The first groups the second SKU ran are the first SKU's best configs, in its order (those that compile here:
    # a recorded compile failure is rejected by the compile stage, never sent).
    by_round = sorted({(parse_prior_group(r["group"]), r["candidate"]) for r in trials
                       if r["role"] == "candidate" and parse_prior_group(r["group"]) is not None})
    tried = [name for _, name in by_round]
    builds = {a6000.name_of(dict(zip(a6000.names, k, strict=True))) for k, r in a6000.configs.items()
              if r.failure != "compile"}
    top = [n for n, _ in meta_a["ranked"] if n != "reference" and n in builds]
    assert tried and tried == top[: len(tried)], (tried, top)
    # Every rule of a decision holds: the winner has its full verdict against the reference.
    winner = next(c for c in meta_helped["candidates"] if c["name"] == helped["record"]["name"])
    assert winner["note"].startswith("selected:") and winner["pairs"] >= 5
    # Priors change effort: the same 20-config search on the same seed picks the A6000's optimum with them (the
    # A4000's best configs hold it) and spends fewer device seconds (a strong incumbent drops the rest at once).
    pick = {k: a6000.mean_ms(d["record"]["name"]) / a6000.best[1] for k, d in (("helped", helped), ("alone", alone))}
    assert pick["helped"] <= 1.02 and pick["helped"] <= pick["alone"], pick
    assert meta_helped["device_seconds"] < meta_alone["device_seconds"], (meta_helped, meta_alone)
    assert meta_helped["evaluated"] == meta_alone["evaluated"] == 20  # the priors' configs count toward max_configs


def test_the_embedded_farm_finds_priors_in_its_cache_and_in_archives_given_with_priors_from(tmp_path: Path) -> None:
    folder = tmp_path / "recordings"
    folder.mkdir()
    a = write_recording(folder / "vector_add_A.json", "GPU A", (64, 4, 0), 1)
    b = write_recording(folder / "vector_add_B.json", "GPU B", (64, 4, 0), 2)
    env = {**farm_env(), "FARM_KERNEL_CACHE": str(tmp_path / "kcache"), "COLUMNS": "400"}

    def tune(recording: Path, cache: str, *options: str) -> dict[str, Any]:
        catalog = tmp_path / f"{recording.stem}.toml"
        catalog.write_text(POLICY_TOML + CHEAP + f'\n[[problems]]\nrecording = "recordings/{recording.name}"\n')
        done = farm("tune", str(catalog), "--device", f"replay:{recording}", "--cache-dir", str(tmp_path / cache),
                    "--json", *options, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        (decision,) = json.loads(done.stdout)["decisions"]
        return dict(decision)

    first = tune(a, "one")
    exported = farm("archive", "export", "--from-cache", str(tmp_path / "one"), "--out", str(tmp_path / "archives"),
                    env=env, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    from_archive = tune(b, "two", "--priors-from", str(tmp_path / "archives"))
    from_cache = tune(b, "one")  # the embedded farm's own cache holds A's decision
    without = tune(b, "one", "--force", "--no-priors")
    assert from_archive["record"]["meta"]["priors"] == from_cache["record"]["meta"]["priors"] == [first["fingerprint"]]
    assert without["record"]["meta"]["priors"] == []
    assert from_cache["record"]["name"] == "kernel[block_size_x=64,block_size_y=4,unroll=0]"  # B's optimum
