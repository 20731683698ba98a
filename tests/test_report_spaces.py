"""`farm report` for a problem tuned over a space: the explored configs as a heat map of the two parameters that
matter most against the ratio, failures marked (coordinator/heatmap.py), in the page's data and in a real
headless browser."""

from __future__ import annotations

from archive_helpers import FP_A, key_for, make_record, make_trials
from browser import screenshot

import farm_archives
from farm.keyroster import KeyRoster
from farm.space import Space
from farm.stores import archive as arc
from farm_coordinator.heatmap import heat_maps
from farm_coordinator.report import load, render


def tiled(x, *, block, unroll, layout):
    return x


SPACE = Space("tiled", tiled, {"block": [16, 32, 64], "unroll": [1, 2], "layout": ["row", "col"]})
ENTRIES = ("ref", SPACE.descriptor())
ROSTER = [KeyRoster(ENTRIES).name(p) for p in range(1 + SPACE.size)]


def ratio_of(block: int, unroll: int, layout: str) -> float:
    """block matters most, layout next, unroll hardly at all."""
    return {16: 1.6, 32: 0.9, 64: 0.5}[block] * (1.2 if layout == "col" else 1.0) * (1.01 if unroll == 2 else 1.0)


def explored() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for rank in range(SPACE.size):
        config = SPACE.config(rank)
        if rank in (5, 6):
            continue  # not explored
        name = SPACE.config_name(config)
        if config == {"block": 64, "unroll": 2, "layout": "row"}:
            out.append({"name": name, "ratio": None, "note": "rejected: wrong output (max abs error 1)"})
        else:
            out.append({"name": name, "ratio": ratio_of(**config), "note": "slower"})  # type: ignore[arg-type]
    return out


def key() -> str:
    return key_for(FP_A, "n=4", names=ENTRIES)


def test_the_map_puts_the_two_parameters_that_matter_most_on_its_axes_with_best_ratios_and_failures() -> None:
    (h,) = heat_maps(key(), explored())
    assert (h["space"], h["y"], h["x"], h["size"], h["explored"]) == ("tiled", "block", "layout", 12, 10)
    assert h["ys"] == ["16", "32", "64"] and h["xs"] == ["row", "col"]
    row64 = h["cells"][2]
    assert row64[0]["failed"] == 1 and row64[0]["best"] == ratio_of(64, 1, "row")
    assert row64[0]["name"] == "tiled[block=64,unroll=1,layout=row]"
    assert h["cells"][0][0]["explored"] == 2 and h["cells"][0][0]["failed"] == 0
    assert h["importance"]["block"] > h["importance"]["layout"] > h["importance"]["unroll"]


def test_a_problem_without_spaces_has_no_map() -> None:
    assert heat_maps(key_for(FP_A, "n=4", names=("ref", "fast")), [{"name": "fast", "ratio": 0.5}]) == []
    assert heat_maps("not a key", explored()) == []


def spaced_archive(parent) -> object:
    winner = ROSTER.index("tiled[block=64,unroll=1,layout=row]")
    record = make_record(key(), winner, names=tuple(ROSTER), candidates=explored())
    return farm_archives.write_archive(parent, FP_A, [arc.ArchiveEntry(record, "pid", tuple(make_trials(record)))]).path


def test_the_reports_data_carries_the_map_of_a_problem_tuned_over_a_space(tmp_path) -> None:
    (fp,) = load(spaced_archive(tmp_path / "a"))
    (problem,) = fp["problems"]
    (h,) = problem["spaces"]
    assert (h["y"], h["x"], h["explored"]) == ("block", "layout", 10)


def test_the_page_draws_the_map_with_a_cell_per_value_pair_and_the_failures_crossed(tmp_path, chromium) -> None:
    out = tmp_path / "report.html"
    out.write_text(render(load(spaced_archive(tmp_path / "a")), "spaces"))
    chromium.get(out.as_uri() + "#expand")
    cells = chromium.execute_script("return document.querySelectorAll('tr.detail svg.heat rect.cell').length")
    crosses = chromium.execute_script("return document.querySelectorAll('tr.detail svg.heat text.failed').length")
    assert (cells, crosses) == (6, 1)
    screenshot(chromium, "report-space-heat-map")


def cut_short() -> list[dict[str, object]]:
    """:func:`explored` with two configs the budget never ran (verdict ``not tried``): planned, never timed."""
    out = explored()
    for rank in (5, 6):
        name = SPACE.config_name(SPACE.config(rank))
        out.append({"name": name, "ratio": None, "note": "not tried: budget of 10s exhausted"})
    return out


def test_configs_the_budget_never_ran_are_not_explored_nor_failed_but_counted_as_not_tried() -> None:
    (h,) = heat_maps(key(), cut_short())
    assert (h["explored"], h["not_tried"], h["size"]) == (10, 2, 12)
    cells = [c for row in h["cells"] for c in row if c is not None]
    assert sum(c["failed"] for c in cells) == 1  # the wrong output only
    assert sum(c["not_tried"] for c in cells) == 2 and sum(c["explored"] for c in cells) == 10
    (h_before,) = heat_maps(key(), explored())
    assert h_before["not_tried"] == 0 and h_before["cells"] != h["cells"]


def test_the_page_marks_not_tried_configs_apart_from_failures_and_says_the_decision_is_partial(tmp_path, chromium) -> None:
    winner = ROSTER.index("tiled[block=64,unroll=1,layout=row]")
    partial = {"not_tried": [SPACE.config_name(SPACE.config(rank)) for rank in (5, 6)],
               "reason": "the budget of 10 s ran out", "fix": "raise budget in the catalog's [policy] table"}
    record = make_record(key(), winner, names=tuple(ROSTER), candidates=cut_short(), partial=partial)
    archive = farm_archives.write_archive(tmp_path / "a", FP_A, [arc.ArchiveEntry(record, "pid", tuple(make_trials(record)))])
    out = tmp_path / "report.html"
    out.write_text(render(load(archive.path), "spaces"))
    chromium.get(out.as_uri() + "#expand")
    crosses = chromium.execute_script("return document.querySelectorAll('tr.detail svg.heat text.failed').length")
    title = chromium.execute_script("return document.querySelector('tr.detail svg.heat text.heat-title').textContent")
    titles = chromium.execute_script(
        "return [...document.querySelectorAll('tr.detail svg.heat rect.cell title')].map(t => t.textContent)")
    assert crosses == 1, crosses  # not tried is no failure
    assert "10 of 12 configs explored (2 not tried: the budget ran out)" in title, title
    assert sum("not tried" in t for t in titles) >= 1, titles
    said = chromium.execute_script("return document.querySelector('tr.detail p.partial').textContent")
    assert said.startswith("PARTIAL: the budget of 10 s ran out with 2 candidates not tried (tiled[") and (
        said.endswith("raise budget in the catalog's [policy] table")), said  # the decision is partial: it says so
    screenshot(chromium, "report-space-heat-map-not-tried")
