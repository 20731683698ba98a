"""A cache key's roster from the key alone (farm.keyroster): a decision over a space has a roster position as its
index, and archives check the winner's name against the name unranked from the space's descriptor."""

from __future__ import annotations

import pytest
from archive_helpers import FP_A, key_for, make_record, make_trials

import farm_archives
from farm.errors import ArchiveError
from farm.keyroster import KeyRoster, parse_descriptor
from farm.space import Space
from farm.stores import archive as arc


def tiled(x, *, block, layout, scale):
    return x


SPACE = Space("tiled", tiled, {"block": [16, 32], "layout": ["row", 'a|b,]"c'], "scale": [1.5, True, 3]},
              restrict="block > 16 or scale != 3")
ROSTER = ["ref", *(SPACE.config_name(SPACE.config(r)) for r in range(SPACE.size)), "plain"]
ENTRIES = ("ref", SPACE.descriptor(), "plain")


def test_every_position_of_a_key_is_named_as_the_space_names_its_config() -> None:
    roster = KeyRoster(ENTRIES)
    assert len(roster) == len(ROSTER) == 1 + 12 + 1 and roster.sized
    assert [roster.name(p) for p in range(len(roster))] == ROSTER
    assert [roster.position(n) for n in ROSTER] == list(range(len(ROSTER)))
    assert roster.position("tiled[block=64,layout=row,scale=1.5]") is None
    with pytest.raises(IndexError):
        roster.name(len(ROSTER))


def test_a_key_roster_tells_space_configs_from_listed_candidates_and_counts_them() -> None:
    roster = KeyRoster(ENTRIES)
    assert roster.space_size == SPACE.size == 12
    assert [p for p in range(len(roster)) if roster.in_space(p)] == list(range(1, 13))
    assert not roster.in_space(-1) and not roster.in_space(len(ROSTER))
    assert KeyRoster(["ref", "plain"]).space_size == 0
    hashed = KeyRoster(["ref", "big[sha256:" + "0" * 64 + "]"])
    assert hashed.space_size is None and hashed.in_space(7) and not hashed.in_space(0)


def test_a_listed_name_is_not_a_descriptor_and_a_hashed_descriptor_hides_the_positions_past_it() -> None:
    assert parse_descriptor("fast") is None and parse_descriptor("x[a=1") is None
    assert parse_descriptor("x[a=1|2] trailing") is None
    hashed = KeyRoster(["ref", "big[sha256:" + "0" * 64 + "]"])
    assert not hashed.sized and hashed.in_range(10**9) and hashed.name(5) is None and hashed.name(0) == "ref"


def spaced_entry(winner: int, name: str | None = None) -> arc.ArchiveEntry:
    key = key_for(FP_A, "n=4", names=ENTRIES)
    record = make_record(key, winner, names=(*ROSTER, "past the roster"))
    if name is not None:
        record = record.__class__(record.cache_key, record.index, record.reference_index, name, record.verified,
                                  record.ratio, record.created, record.meta)
    return arc.ArchiveEntry(record, str(record.meta["problem_id"]), tuple(make_trials(record)))


def test_a_decision_over_a_space_is_written_to_an_archive_and_read_back(tmp_path) -> None:
    winner = ROSTER.index("tiled[block=32,layout=row,scale=True]")
    folder = farm_archives.write_archive(tmp_path, FP_A, [spaced_entry(winner)]).path
    (entry,) = farm_archives.read_archive(folder).entries.values()
    record = entry.record
    assert (record.index, record.name) == (winner, "tiled[block=32,layout=row,scale=True]")


@pytest.mark.parametrize(("winner", "name", "error"), [
    (5, ROSTER[4], "field 'winner' = .* is not candidate 5 of the key"),
    (14, "tiled[block=32,layout=row,scale=3]", "field 'winner_index' = 14 is out of range for the key's 14"),
])
def test_a_forged_winner_index_over_a_space_is_refused(tmp_path, winner, name, error) -> None:
    with pytest.raises(ArchiveError, match=error):
        farm_archives.write_archive(tmp_path, FP_A, [spaced_entry(winner, name)])


def test_a_result_without_names_is_aggregated_by_the_names_unranked_from_its_key() -> None:
    from farm.policy import StackPolicy
    from farm.trials import Outcome, TrialVerdict
    from farm_coordinator.aggregate import aggregate, trial_rows
    from farm_coordinator.catalog import Workload
    from farm_coordinator.plan import PlannedProblem, Target
    from farm_fleet.protocol import GroupResult, GroupTask

    key = key_for(FP_A, "n=4", names=ENTRIES)
    trap = "tiled[block=32,layout=row,scale=3]"
    task = GroupTask("run", "pid", "s0.9", "scale", "cpu", {"n": 4}, ((trap, "1"),), {}, "d" * 16)
    plan = PlannedProblem("pid", Target("d" * 16, "fp", "cpu"), Workload("scale", ("cpu",), {"n": 4}, "w"), (task,))
    outcome = Outcome(ROSTER.index(trap), trap, verdict=TrialVerdict.REJECTED, note="wrong output")
    told = {"s0.9": GroupResult("run", "pid", "s0.9", "ok", cache_key=key, reference_index=0, names=(),
                                reference_times=(1.0, 1.0, 1.0), outcomes=(outcome,))}
    agg = aggregate(plan, told, StackPolicy(), "run")
    assert agg.record is not None and agg.record.name == "ref" and agg.record.meta["reference"] == "ref"
    assert [c["name"] for c in agg.record.meta["candidates"]] == [trap]
    assert {r["candidate"] for r in trial_rows(agg) if r["role"] == "reference"} == {"ref"}
