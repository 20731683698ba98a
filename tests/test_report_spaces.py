"""`farm report` for a problem tuned over a space: the explored configs as a heat map of the two parameters that
matter most against the ratio, failures marked (coordinator/heatmap.py), in the page's data and in a real
headless browser."""

from __future__ import annotations

from archive_helpers import FP_A, key_for, make_record, make_trials
from browser import screenshot

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
    return arc.write_archive(parent, FP_A, [arc.ArchiveEntry(record, "pid", tuple(make_trials(record)))]).path


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
