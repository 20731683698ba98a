"""The explored configs of a problem tuned over a space, as `farm report` draws them: a heat map of the two
parameters that matter most against the ratio, failures marked.

Computed from the decision alone: the key's space descriptors give the parameters and their values
(``farm.keyroster``), the record's candidates the configs explored and their ratios. A parameter matters as much
as it moves the log-ratio between configs that differ in it alone (:func:`importance`); the two that matter most
are the map's axes (one parameter: a single row). A cell holds the best ratio of the configs
explored at that pair of values, how many were explored there, how many failed (a wrong output, an error: no
ratio), and how many the search planned but never tried (the budget ran out first: verdict ``not tried``). A config
not tried is not explored and did not fail: it has its own count and mark.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from farm.identity import CacheKey
from farm.keyroster import SpaceShape, parse_descriptor


def heat_maps(cache_key: str, candidates: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One map per space of the key that has explored configs among ``candidates`` (name, ratio, note)."""
    try:
        entries = [c.name for c in CacheKey.decode(cache_key).candidates]
    except ValueError:
        return []
    maps = []
    for entry in entries:
        shape = parse_descriptor(entry)
        if shape is None:
            continue
        explored = [(values, c) for c in candidates if (values := shape.values_of(str(c.get("name", ""))))]
        if explored:
            maps.append(heat_map(shape, explored))
    return maps


def not_tried(candidate: Mapping[str, Any]) -> bool:
    """Whether the search never ran the config (its verdict ``not tried``: the budget, or the run, stopped first)."""
    return str(candidate.get("note", "")).startswith("not tried")


def _ratio(candidate: Mapping[str, Any]) -> float | None:
    ratio = candidate.get("ratio")
    note = str(candidate.get("note", ""))
    if not isinstance(ratio, int | float) or ratio <= 0 or note.startswith(("rejected", "skipped", "group failed")):
        return None
    return float(ratio)


def importance(shape: SpaceShape, explored: Sequence[tuple[dict[str, str], Mapping[str, Any]]]) -> dict[str, float]:
    """How much each parameter moves the log-ratio: the mean spread (max - min) over configs that differ in it
    alone, where the exploration holds such pairs; else the variance of the mean log-ratio over its values (a
    sparse sample: confounded by the other parameters, the best there is). Configs without a ratio are left out."""
    timed = [(values, math.log(r)) for values, c in explored if (r := _ratio(c)) is not None]
    out = {}
    for param, _ in shape.params:
        contexts: dict[tuple[str, ...], list[float]] = {}
        by_value: dict[str, list[float]] = {}
        for values, logged in timed:
            rest = tuple(values[p] for p, _ in shape.params if p != param)
            contexts.setdefault(rest, []).append(logged)
            by_value.setdefault(values[param], []).append(logged)
        spreads = [max(v) - min(v) for v in contexts.values() if len(v) >= 2]
        means = [statistics.fmean(v) for v in by_value.values()]
        out[param] = (statistics.fmean(spreads) if spreads else
                      statistics.pvariance(means) if len(means) >= 2 else 0.0)
    return out


def heat_map(shape: SpaceShape, explored: Sequence[tuple[dict[str, str], Mapping[str, Any]]]) -> dict[str, Any]:
    """The map of one space; see the module docstring."""
    spread = importance(shape, explored)
    order = {p: i for i, (p, _) in enumerate(shape.params)}
    axes = sorted(spread, key=lambda p: (-spread[p], order[p]))[:2]
    values = dict(shape.params)
    y = axes[0]
    x = axes[1] if len(axes) > 1 else None
    ys = list(values[y])
    xs = list(values[x]) if x is not None else [""]
    cells: list[list[dict[str, Any] | None]] = [[None] * len(xs) for _ in ys]
    for config, c in explored:
        i, j = ys.index(config[y]), (xs.index(config[x]) if x is not None else 0)
        cell = cells[i][j] or {"best": None, "explored": 0, "failed": 0, "not_tried": 0, "name": None}
        cells[i][j] = cell
        if not_tried(c):
            cell["not_tried"] += 1
            continue
        cell["explored"] += 1
        ratio = _ratio(c)
        if ratio is None:
            cell["failed"] += 1
        elif cell["best"] is None or ratio < cell["best"]:
            cell["best"], cell["name"] = ratio, c.get("name")
    untried = sum(1 for _, c in explored if not_tried(c))
    return {"space": shape.name, "y": y, "x": x, "ys": ys, "xs": xs, "cells": cells,
            "explored": len(explored) - untried, "not_tried": untried, "size": shape.size,
            "importance": {p: round(v, 6) for p, v in spread.items()}}
