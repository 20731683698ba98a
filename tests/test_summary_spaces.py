"""The CLI summary of space searches: "evaluated 60 of 10,240 configs (bayes, seed 0)" only under a partial search
(a sampling strategy, max_configs, the budget), never a line per exhaustively searched problem."""

from __future__ import annotations

import farm
from farm.stores.base import DecisionRecord
from farm_cli.summary import partial_search, space_effort


def record(candidates: list[dict[str, str]], **meta: object) -> DecisionRecord:
    body = {"operation": "farmtest_space", "device_kind": "cpu", "candidates": candidates, **meta}
    return DecisionRecord("k", 1, 0, "x", True, 0.5, 1.0, body)


def test_an_in_process_record_says_its_own_counts_and_is_partial_only_when_it_sampled_or_was_bounded() -> None:
    sampled = record([], strategy="bayes", seed=0, max_configs=60, evaluated=60, space_size=10240)
    assert space_effort(sampled) == "evaluated 60 of 10,240 configs (bayes, seed 0)"
    assert partial_search(sampled)
    whole = record([], strategy="exhaustive", seed=0, max_configs=None, evaluated=7, space_size=8)
    assert not partial_search(whole)


def test_a_farm_record_is_counted_from_its_candidates_under_the_runs_strategy() -> None:
    import farm_spaceops  # noqa: F401  (registers farmtest_space)

    from farm_kernels import registry

    registry.ensure_loaded(("farm_spaceops",))
    judged = [{"name": "chunked[chunk=256,twice=True]", "note": "slower"},
              {"name": "chunked[chunk=1024,twice=False]", "note": "selected"}]
    policy = farm.StackPolicy(strategy="random", max_configs=2, seed=4)
    farmed = record(judged)
    assert space_effort(farmed, policy) == "evaluated 2 of 8 configs (random, seed 4)"
    assert partial_search(farmed, policy) and not partial_search(farmed, farm.StackPolicy())
    cut = record([*judged, {"name": "chunked[chunk=4096,twice=True]", "note": "not tried: the budget ran out"}])
    assert partial_search(cut, farm.StackPolicy())
    # Not tried: not counted, and the line says the budget stopped the search and which setting changes it.
    assert space_effort(cut, farm.StackPolicy(budget=10.0)) == (
        "evaluated 2 of 8 configs (exhaustive): the budget of 10 s ran out with 1 candidate not tried (raise budget "
        "in the catalog's [policy] table)")


def test_farm_tune_says_the_budget_stopped_a_search_and_which_setting_changes_it(tmp_path) -> None:
    import subprocess
    import sys

    from farm_helpers import write_catalog
    from servers import farm_env

    problems = '[[problems]]\noperation = "farmtest_space"\nworkloads = [{ n = 3000, dtype = "float64" }]\n'
    catalog = write_catalog(tmp_path / "c.toml", problems, "samples = 5\nwarmups = 1\nbudget = 0.01\n")
    done = subprocess.run([sys.executable, "-m", "farm_cli", "tune", str(catalog), "--cache-dir", str(tmp_path / "c"),
                           "--kernels", "farm_spaceops"], capture_output=True, text=True, env=farm_env(),
                          cwd=tmp_path, timeout=300)
    said = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stdout + done.stderr
    # The search did not finish: the decision is partial, and the line says why, what was left and what to do.
    assert "configs (exhaustive); PARTIAL: the budget of 0.01 s ran out with" in said, said
    assert "not tried (chunked[" in said and "raise budget in the catalog's [policy] table" in said, said
