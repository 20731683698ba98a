"""A race's group task on a worker (``screening = "race"``, docs/farm.md "Racing on the farm").

The coordinator keeps the race's incumbent (``farm_coordinator.racing``) and sends each config as a group that
names it and the noise it has seen. Here, on this worker's device, each config is validated against the reference
(its validation run is its warm-up), then timed in order-balanced pairs against the incumbent with the in-process
race's test (``farm.racing.screen``) after every pair: decided slower, it is dropped (verdict ``dropped``);
decided faster, it is ``promoted``; still close after ``samples`` pairs, a ``contender``. Both fastest runs the test
compares are taken on this device; the excess distribution is the coordinator's noise plus the incumbent's runs here.
A failure is the config's verdict, as in-process. Celery-free, like ``farm_workers.tasks``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from farm.policy import StackPolicy
from farm.racing import excesses, screen
from farm.runner import TrialRunner
from farm.search import budget_note
from farm.trials import Outcome, TrialVerdict, failure_of, timed, validation_trial

PROMOTED = "promoted"
CONTENDER = "contender"


@dataclass
class Raced:
    """A race group's outcomes (one per config, in order), each timed config's standing, the seconds charged."""

    outcomes: list[Outcome] = field(default_factory=list)
    standings: dict[str, str] = field(default_factory=dict)
    budget_exhausted: bool = False
    spent: float = 0.0


def race_group(runner: TrialRunner, policy: StackPolicy, reference: int, incumbent: int, positions: Sequence[int],
               names: Sequence[str], noise: Sequence[float], budget: float,
               stop: Callable[[], str | None] = lambda: None, revisions: Sequence[str] = ()) -> Raced:
    """Validate and screen each config of ``positions`` against ``incumbent`` (a roster position) within
    ``budget`` seconds; ``stop`` says why to stop early (the task's time limit), None to go on. Raises only what
    the trials propagate (a DEVICE failure, a busy device)."""
    started = time.monotonic()
    deadline = started + budget
    raced = Raced()
    incumbent_runs: list[float] = []  # the incumbent's runs on this device, every pair of this group
    warmed = incumbent == reference  # a config's validation runs the reference: its warm-up
    for i, position in enumerate(positions):
        name, revision = names[position], revisions[i] if i < len(revisions) else ""
        why = stop()
        if why is not None or raced.budget_exhausted or time.monotonic() > deadline:
            raced.budget_exhausted = raced.budget_exhausted or why is None
            raced.outcomes.append(Outcome(position, name, verdict=TrialVerdict.NOT_TRIED, revision=revision,
                                          note=why or budget_note(policy.budget), budget_exhausted=why is None))
            continue
        validated = dataclasses.replace(validation_trial(runner, policy, reference, position, name), revision=revision)
        if validated.failure is not None:
            raced.outcomes.append(validated)
            continue
        if not warmed:
            try:
                runner.measure(incumbent)  # its warm-up on this device, untimed
            except Exception as e:
                verdict, note = failure_of(e)
                raced.outcomes.append(dataclasses.replace(
                    validated, verdict=verdict, note=f"the incumbent {names[incumbent]!r} failed here: {note}"))
                continue
            warmed = True
        outcome, standing = _screen(runner, policy, incumbent, position, names, validated, incumbent_runs, noise,
                                    deadline, stop)
        raced.budget_exhausted = raced.budget_exhausted or outcome.budget_exhausted
        raced.outcomes.append(outcome)
        if standing is not None:
            raced.standings[name] = standing
    raced.spent = time.monotonic() - started
    return raced


def _screen(runner: TrialRunner, policy: StackPolicy, incumbent: int, position: int, names: Sequence[str],
            validated: Outcome, incumbent_runs: list[float], noise: Sequence[float], deadline: float,
            stop: Callable[[], str | None]) -> tuple[Outcome, str | None]:
    """Pairs against the incumbent until the config is decided or has ``samples`` pairs: its Outcome and its
    standing (None for a dropped or failed config: its verdict says it)."""
    name = names[position]
    pairs: list[tuple[float, float]] = []
    exhausted = False
    while len(pairs) < policy.samples:
        if stop() is not None or time.monotonic() > deadline:
            exhausted = stop() is None
            break
        try:
            if len(pairs) % 2 == 0:
                i = timed(runner, incumbent, names[incumbent])
                c = timed(runner, position, name)
            else:
                c = timed(runner, position, name)
                i = timed(runner, incumbent, names[incumbent])
        except Exception as e:
            failed, note = failure_of(e)
            return dataclasses.replace(validated, verdict=failed, note=note, pairs=tuple(pairs)), None
        pairs.append((i, c))
        incumbent_runs.append(i)
        runs = [p[1] for p in pairs]
        best, incumbent_best = min(runs), min(incumbent_runs)
        verdict = screen(best, len(runs), incumbent_best, len(incumbent_runs),
                         [*noise, *excesses(incumbent_runs)], len(pairs))
        if verdict == "slower":
            return dataclasses.replace(
                validated, verdict=TrialVerdict.DROPPED, pairs=tuple(pairs), stop="decided",
                note=f"slower than {names[incumbent]!r}: best run {best * 1e3:.4g} ms against "
                     f"{incumbent_best * 1e3:.4g} ms after {len(pairs)} pairs"), None
        if verdict == "faster":
            return dataclasses.replace(validated, pairs=tuple(pairs), stop="decided"), PROMOTED
    if not pairs:
        return dataclasses.replace(validated, verdict=TrialVerdict.NOT_TRIED, budget_exhausted=exhausted,
                                   note=budget_note(policy.budget) if exhausted else "the group task hit its time limit"), None
    return dataclasses.replace(validated, pairs=tuple(pairs), stop="screened", budget_exhausted=exhausted), CONTENDER
