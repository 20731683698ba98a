"""The trial-runner port: a runner needs only validate and measure; its optional capabilities (the latest output
comparison, a throttle probe) are declared Protocols, read when present and absent otherwise."""

from __future__ import annotations

import math

import numpy as np
from fakes import FAST

from farm.arrays import OutputCheck, array_signature
from farm.identity import Candidate
from farm.policy import Timing, Tolerance
from farm.runner import ChecksOutputs, ProbesThrottle, TrialRunner, Validation, output_check, throttle_probe
from farm.runtimes import HostClient
from farm.search import search
from farm.trials import candidate_trials
from farm.tunable import TunableSet

NAMES = ["ref", "a"]


class Plain:
    """The smallest runner: no capability at all (the candidate takes half the reference's time)."""

    def validate(self, reference: int, candidate: int, tolerance: Tolerance) -> Validation:
        return Validation.PASSED

    def measure(self, candidate: int) -> float:
        return 1.0 if candidate == 0 else 0.5


class Checked(Plain):
    """A runner that reports each comparison and a device that is always throttled."""

    def __init__(self) -> None:
        self.last_check: OutputCheck | None = None
        self.throttle_probe = lambda: True

    def validate(self, reference: int, candidate: int, tolerance: Tolerance) -> Validation:
        self.last_check = OutputCheck(True, None, 0.125, 0.25)
        return Validation.PASSED


def test_a_runner_without_capabilities_reads_as_absent_ones() -> None:
    runner: TrialRunner = Plain()
    assert not isinstance(runner, ChecksOutputs) and not isinstance(runner, ProbesThrottle)
    assert output_check(runner) is None and throttle_probe(runner) is None
    outcome = candidate_trials(runner, FAST, 0, 1, NAMES, math.inf)
    assert outcome.failure is None and (outcome.max_abs_error, outcome.max_rel_error) == (None, None)
    assert outcome.interference is not None and outcome.interference.throttled == 0


def test_a_runner_with_both_capabilities_has_them_read() -> None:
    runner = Checked()
    assert isinstance(runner, ChecksOutputs) and isinstance(runner, ProbesThrottle)
    outcome = candidate_trials(runner, FAST.replace(max_disturbed=1.0), 0, 1, NAMES, math.inf)
    assert (outcome.max_abs_error, outcome.max_rel_error) == (0.125, 0.25)
    assert outcome.interference is not None and outcome.interference.throttled == outcome.interference.pairs > 0


def test_a_plain_runner_serves_a_whole_search() -> None:
    found = search(Plain(), FAST, 0, (Candidate("ref"), Candidate("a")), [1])
    assert [o.name for o in found.outcomes] == ["a"] and found.outcomes[0].failure is None


def test_the_runtime_runner_declares_both_capabilities() -> None:
    from farm.adapter import RuntimeTrials

    tunable = TunableSet("double", signature=array_signature)
    tunable.add(lambda x: x * 2, name="ref", reference=True)
    trials = RuntimeTrials(HostClient(0), tunable, (np.ones(4),), (0,), Timing.END_TO_END)
    assert isinstance(trials, ChecksOutputs) and isinstance(trials, ProbesThrottle)
    assert output_check(trials) is None and throttle_probe(trials) is None  # a host client has no NVML probe
    trials.validate(0, 0, Tolerance())
    check = output_check(trials)
    assert check is not None and check.passed
