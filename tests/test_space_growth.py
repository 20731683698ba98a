"""Incremental spaces on the farm: a grown space is a new problem of the same family, planned as the in-process
search plans it: the stored winner and only the configs the old space lacked, against the reference.

Table tests of the planning (the space of ``farm_spaceops`` grown by one chunk value), then the embedded farm
(`farm tune --cache-dir`) and the real farm (a private redis-server, real `farm worker` processes, `farm tune`)
tuning a space, growing it and tuning again: one decision per problem, the family's id indexing the last
complete one."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from farm_helpers import fleet, write_catalog
from farm_spaceops import CHUNKS, operations
from servers import farm_env, start_worker, wait_worker_ready

from farm.spacesearch import Prior, covered_by
from farm.stores.base import DecisionRecord
from farm.stores.local import LocalStore
from farm.stores.redis import RedisDecisions
from farm_coordinator.catalog import load_catalog
from farm_coordinator.plan import PlannedProblem, Planner, SpaceFamily, Target, plan_groups
from farm_coordinator.spacestrategy import SpaceSearch
from farm_fleet.protocol import GroupTask
from farm_kernels import registry

GROWN = (7, 256, 512, 1024, 4096)  # one chunk value more: two new configs, both feasible
NEW = {"chunked[chunk=512,twice=False]", "chunked[chunk=512,twice=True]"}
SPACE = """
[[problems]]
operation = "farmtest_space"
workloads = [{ n = 3000, dtype = "float64" }]
"""
POLICY = 'samples = 5\nwarmups = 1\nbudget = 30.0\nmax_relative_mad = 1.0\nstrategy = "exhaustive"\n'
WINNER = "chunked[chunk=1024,twice=True]"


def covered(chunks: tuple[int, ...] = CHUNKS) -> dict[str, dict[str, list[object]]]:
    return {"chunked": {"chunk": list(chunks), "twice": [False, True]}}


@pytest.fixture
def space() -> Iterator[None]:
    """``farmtest_space`` registered in this process with its space grown (:data:`GROWN`)."""
    registry.ensure_loaded(("farm_spaceops",))
    original = registry.get("farmtest_space")
    registry.unregister("farmtest_space")
    registry.register(operations(GROWN)[0])
    try:
        yield
    finally:
        registry.unregister("farmtest_space")
        registry.register(original)


def planned(groups) -> set[str]:
    return {name for _, candidates in groups.groups for name, _ in candidates}


def test_a_grown_space_plans_the_stored_winner_and_only_the_configs_the_old_space_lacked(space, tmp_path) -> None:
    catalog = load_catalog(write_catalog(tmp_path / "c.toml", SPACE, POLICY))
    full = plan_groups("farmtest_space", "cpu", catalog)
    grown = plan_groups("farmtest_space", "cpu", catalog, prior=Prior(covered(), WINNER))
    assert len(planned(full)) == 10 - 1  # every feasible config (chunk=7 with twice is not)
    assert planned(grown) == {WINNER, *NEW}
    assert grown.family is not None and grown.family.covered == covered(GROWN)
    # A winner the grown space no longer holds is not planned; nothing covered comes back.
    gone = plan_groups("farmtest_space", "cpu", catalog, prior=Prior(covered(), "chunked[chunk=8192,twice=True]"))
    assert planned(gone) == NEW


def test_a_problem_id_covers_its_space_values_and_its_family_id_does_not(space, tmp_path) -> None:
    catalog = load_catalog(write_catalog(tmp_path / "c.toml", SPACE, POLICY))
    target = Target("d" * 16, "fp", "cpu")
    (workload,) = catalog.workloads
    grown = Planner(catalog, [target], "run")
    ids = (grown.problem_id(target, workload), grown.family_id(target, workload))
    registry.unregister("farmtest_space")
    registry.register(operations(CHUNKS)[0])
    old = Planner(catalog, [target], "run")
    assert old.problem_id(target, workload) != ids[0]
    assert old.family_id(target, workload) == ids[1] is not None


def test_the_planner_finds_the_family_record_and_plans_the_problem_incrementally(space, tmp_path) -> None:
    catalog = load_catalog(write_catalog(tmp_path / "c.toml", SPACE, POLICY))
    target = Target("d" * 16, "fp", "cpu")
    (workload,) = catalog.workloads
    import time

    def families(now: float, meta: dict[str, object]):
        record = DecisionRecord("family-key", 1, 0, WINNER, True, 0.5, now, meta)
        return lambda digest, ids: {i: record for i in ids}

    fresh = Planner(catalog, [target], "run", families=families(time.time(), {"covered": covered(), "winner": WINNER}))
    pid = fresh.problem_id(target, workload)
    (problem,) = fresh.problems([(pid, target, workload)])
    assert {n for t in problem.tasks for n, _ in t.candidates} == {WINNER, *NEW}
    assert problem.family is not None and problem.family.prior == Prior(covered(), WINNER)
    # A stale family record, or a malformed one, is a full search.
    for lookup in (families(time.time() - catalog.policy.ttl - 60, {"covered": covered(), "winner": WINNER}),
                   families(time.time(), {"covered": "everything", "winner": WINNER})):
        (full,) = Planner(catalog, [target], "run", families=lookup).problems([(pid, target, workload)])
        assert len({n for t in full.tasks for n, _ in t.candidates}) == 9 and full.family.prior is None


def test_a_space_search_of_a_grown_space_never_asks_a_covered_config(space) -> None:
    roster = registry.get("farmtest_space").tunable("cpu").roster()
    task = GroupTask("run", "pid", "g0", "farmtest_space", "cpu", {"n": 10}, (("slow_reference", "1"),), {}, "d" * 16)
    family = SpaceFamily("fid", covered_by(roster), Prior(covered(), WINNER))
    plan = PlannedProblem("pid", Target("d" * 16, "fp", "cpu", ("w0",)), None, (task,), family=family)  # type: ignore[arg-type]
    from farm.policy import StackPolicy
    from farm_fleet.protocol import GroupResult

    search = SpaceSearch(StackPolicy(strategy="random", max_configs=50, seed=0), lambda op, kind: roster)
    told = {"g0": GroupResult("run", "pid", "g0", "ok")}
    asked = []
    while asks := search.propose(plan, told, frozenset(), 4):
        for ask in asks:
            asked.append(ask.candidates[0][0])
            told[ask.group] = GroupResult("run", "pid", ask.group, "ok")
    assert set(asked) == NEW


def grown_module(directory: Path, name: str, chunks: tuple[int, ...]) -> dict[str, str]:
    """A kernels module ``name`` in ``directory`` with the space over ``chunks``; the environment that finds it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(f"from farm_spaceops import operations\nOPERATIONS = operations({chunks!r})\n")
    return farm_env({"PYTHONPATH": f"{directory}:{farm_env()['PYTHONPATH']}"})


def embedded_tune(catalog: Path, cache: Path, kernels: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(catalog), "--cache-dir", str(cache),
                           "--kernels", kernels], capture_output=True, text=True, env=env, cwd=catalog.parent,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def records(cache: Path) -> list[DecisionRecord]:
    return [DecisionRecord.from_json(text) for batch in LocalStore(cache).scan() for text, _, _ in batch]


def judged(record: DecisionRecord) -> set[str]:
    return {c["name"] for c in record.meta["candidates"]}


def family_id(catalog: Path, record: DecisionRecord) -> str | None:
    """The family id of a decision's problem, as the coordinator computes it (the test's registry: :data:`GROWN`)."""
    target = Target(record.meta["fingerprint"], "fp", "cpu")
    (workload,) = load_catalog(catalog).workloads
    return Planner(load_catalog(catalog), [target], "run").family_id(target, workload)


def test_the_embedded_farm_tunes_a_grown_space_incrementally_again_and_again(space, tmp_path) -> None:
    catalog = write_catalog(tmp_path / "c.toml", SPACE, POLICY)
    cache = tmp_path / "cache"
    embedded_tune(catalog, cache, "farm_spaceops", farm_env())
    (first,) = records(cache)
    assert first.meta["covered"] == covered() and not first.meta["incremental"]

    out = embedded_tune(catalog, cache, "grownops", grown_module(tmp_path / "mods", "grownops", GROWN))
    assert "evaluated 2 of 10 configs (exhaustive, incremental)" in out, out
    (grown,) = [r for r in records(cache) if r.cache_key != first.cache_key]  # one decision per problem
    # Only the new configs were evaluated, against the reference and the stored winner, judged again.
    assert judged(grown) == {first.name, *NEW} - {"slow_reference"}
    effort = {k: grown.meta[k] for k in ("evaluated", "space_size", "incremental", "covered", "winner")}
    assert effort == {"evaluated": 2, "space_size": 10, "incremental": True, "covered": covered(GROWN),
                      "winner": grown.name}
    assert grown.name in {first.name, "slow_reference", *NEW}
    # The family's id now points at the grown decision: the next growth starts from it.
    digest = grown.meta["fingerprint"]
    assert LocalStore(cache).problem_records(digest, [family_id(catalog, grown)]) == {family_id(catalog, grown): grown}

    more = (*GROWN, 8192)
    out = embedded_tune(catalog, cache, "grownops2", grown_module(tmp_path / "mods", "grownops2", more))
    assert "evaluated 2 of 12 configs (exhaustive, incremental)" in out, out
    (third,) = [r for r in records(cache) if r.cache_key not in (first.cache_key, grown.cache_key)]
    assert judged(third) == {grown.name, "chunked[chunk=8192,twice=False]", "chunked[chunk=8192,twice=True]"} - {
        "slow_reference"}
    assert third.meta["covered"] == covered(more)


@pytest.mark.servers
def test_the_farm_tunes_a_grown_space_incrementally_with_real_workers(space, redis_srv, tmp_path) -> None:
    catalog = write_catalog(tmp_path / "c.toml", SPACE, POLICY.replace("budget = 30.0", "budget = 3.0"))
    with fleet(redis_srv, tmp_path / "fleet", ()) as f:
        def tune(kernels: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
            worker = start_worker("cpu:0", f.broker, f.results_url, f.directory, env, kernels=(kernels,))
            f.workers.append(worker)
            try:
                wait_worker_ready(worker, f.client(), f.settings.prefix)
                return subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(catalog), "--broker", f.broker,
                                       "--redis", f.results_url, "--kernels", kernels], capture_output=True, text=True,
                                      env=env, timeout=300)
            finally:
                worker.stop()
                f.workers.remove(worker)

        first = tune("farm_spaceops", f.env)
        assert first.returncode == 0, first.stdout + first.stderr
        env = {**f.env, "PYTHONPATH": grown_module(tmp_path / "mods", "grownfleet", GROWN)["PYTHONPATH"]}
        again = tune("grownfleet", env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "evaluated 2 of 10 configs (exhaustive, incremental)" in again.stdout, again.stdout
        store = RedisDecisions(client=f.client(), settings=f.settings)
        decisions = [r for digest in store.fingerprints() for r in store.records(digest)]
        assert len(decisions) == 2  # one per problem: the old space's and the grown one's
        (old,) = [r for r in decisions if not r.meta.get("incremental")]
        (grown,) = [r for r in decisions if r.meta.get("incremental")]
        fid = family_id(catalog, grown)
        assert fid is not None
        indexed = store.problem_records(grown.meta["fingerprint"], [fid])
    assert judged(old) == {f"chunked[chunk={c},twice={t}]" for c in CHUNKS for t in (False, True)} - {
        "chunked[chunk=7,twice=True]"}
    assert judged(grown) == {old.name, *NEW} - {"slow_reference"}
    assert (grown.meta["evaluated"], grown.meta["covered"]) == (2, covered(GROWN))
    assert indexed == {fid: grown}


@pytest.mark.servers
def test_a_worker_left_on_the_old_space_refuses_the_task_and_the_run_says_so(redis_srv, tmp_path) -> None:
    catalog = write_catalog(tmp_path / "c.toml", SPACE, POLICY.replace("budget = 30.0", "budget = 3.0"))
    with fleet(redis_srv, tmp_path / "fleet", ()) as f:
        stale = start_worker("cpu:0", f.broker, f.results_url, f.directory, f.env, kernels=("farm_spaceops",))
        f.workers.append(stale)  # still importing the 8-config module
        wait_worker_ready(stale, f.client(), f.settings.prefix)
        env = {**f.env, "PYTHONPATH": grown_module(tmp_path / "mods", "grownstale", GROWN)["PYTHONPATH"]}
        done = subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(catalog), "--broker", f.broker,
                               "--redis", f.results_url, "--kernels", "grownstale"], capture_output=True, text=True,
                              env=env, timeout=300)
        store = RedisDecisions(client=f.client(), settings=f.settings)
        decisions = [r for digest in store.fingerprints() for r in store.records(digest)]
    said = " ".join((done.stdout + done.stderr).split())  # the table and failure lines wrap on a narrow terminal
    assert done.returncode == 1, said
    assert "farmtest_space on worker" in said and "differs from the coordinator's" in said, said
    assert ("space 'chunked' values chunked[chunk=7|256|1024|4096,twice=False|True] here, "
            "chunked[chunk=7|256|512|1024|4096,twice=False|True] on the coordinator" in said), said
    assert decisions == []  # nothing published under either set


DECORATED = '''
from farm import TunableSet, array_signature
from farm_kernels.operation import Operation, dim
from farm_spaceops import make, slow_reference

tunable = TunableSet("farmtest_space", signature=array_signature)
tunable.add(slow_reference, name="slow_reference", reference=True)


@tunable.space(group=0, chunk=CHUNKS, twice=[False, True],
               restrict="chunk >= 256 or not twice")
def chunked(x, *, chunk, twice):
    from farm_spaceops import chunked as body
    return body(x, chunk=chunk, twice=twice)


OPERATIONS = (Operation(name="farmtest_space", host=tunable, cuda=None, fields=(dim("n"),),
                        dtypes={"cpu": ("float64",)}, make=make),)
'''


def decorated_module(directory: Path, name: str, chunks: tuple[int, ...]) -> dict[str, str]:
    """A kernels module ``name`` as docs/spaces.md declares a space: the decorator above the function, its value
    lists written out (``chunk=[7, 256, 1024, 4096]``); the environment that finds it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(DECORATED.replace("CHUNKS", repr(list(chunks))))
    return farm_env({"PYTHONPATH": f"{directory}:{farm_env()['PYTHONPATH']}"})


def test_a_space_declared_with_the_documented_decorator_grows_incrementally_on_the_farm(tmp_path) -> None:
    catalog = write_catalog(tmp_path / "c.toml", SPACE, POLICY)
    cache = tmp_path / "cache"
    embedded_tune(catalog, cache, "decorated1", decorated_module(tmp_path / "mods", "decorated1", CHUNKS))
    (first,) = records(cache)
    assert first.meta["covered"] == covered() and not first.meta["incremental"]

    # The same module with one value added to the decorator's list: the same operation, only the new configs run.
    out = embedded_tune(catalog, cache, "decorated2", decorated_module(tmp_path / "mods", "decorated2", GROWN))
    assert "evaluated 2 of 10 configs (exhaustive, incremental)" in out, out
    (grown,) = [r for r in records(cache) if r.cache_key != first.cache_key]
    assert judged(grown) == {first.name, *NEW} - {"slow_reference"}
    assert (grown.meta["incremental"], grown.meta["evaluated"], grown.meta["covered"]) == (True, 2, covered(GROWN))

    # A change to the function's body is a new family: a full search.
    body = tmp_path / "mods" / "decorated3.py"
    decorated_module(tmp_path / "mods", "decorated3", GROWN)
    body.write_text(body.read_text().replace("return body(x,", "return 1 * body(x,"))
    out = embedded_tune(catalog, cache, "decorated3", farm_env({"PYTHONPATH": f"{tmp_path / 'mods'}:"
                                                                              f"{farm_env()['PYTHONPATH']}"}))
    assert "incremental" not in out, out
