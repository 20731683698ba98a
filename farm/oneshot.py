"""One-shot tuning: ``farm.tune`` decides one operation on given inputs and returns the decision with its report.

Like ``kernel_tuner.tune_kernel``: a fresh :class:`~farm.engine.StackTuner` per call, no cache, no fleet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from farm.adapter import RuntimeTrials, stack_request
from farm.engine import Decision, StackTuner, TuneReport
from farm.errors import TuneFailure
from farm.policy import Mode, StackPolicy
from farm.priors import source, using
from farm.runtimes import ComputeClient, client_for
from farm.stores.base import DecisionRecord
from farm.tunable import TunableSet


@dataclass(frozen=True)
class Tuned:
    """A one-shot decision. ``report`` holds every candidate's verdict, pairs, stop reason and interference (None
    when no search ran, e.g. the reference's output cannot be validated: ``decision.source`` says why)."""

    decision: Decision
    report: TuneReport | None
    fn: Callable[..., Any]

    @property
    def name(self) -> str:
        return self.decision.name


def tune(tunable: TunableSet, inputs: Any, *, device: str | ComputeClient = "cpu:0",
         policy: StackPolicy | None = None, name: str | None = None,
         priors: Iterable[Tuned | DecisionRecord] = ()) -> Tuned:
    """Tune ``tunable`` for ``inputs`` (a tuple of positional arguments, or one argument) on ``device`` (``"cpu:N"``,
    ``"cuda:N"`` or a client) and return the decision, its report and the chosen function.

    ``policy`` defaults to :class:`StackPolicy`; its mode must be EXPLORE (a one-shot call has no cache to serve).
    ``priors``: results of the same problem family on other devices (``Tuned``, or decision records with a
    ranking), whose best configs a spaced search evaluates first (docs/spaces.md, "Priors").

    Nothing is stored. Raises TuneFailure INVALID_INPUT (bad policy, a prior without a ranking, no reference, no
    signature), DEVICE or REJECTED (the reference itself failed), UNAVAILABLE (no such device)."""
    tuner = StackTuner(StackPolicy() if policy is None else policy)  # checks the policy
    if tuner.policy.mode is not Mode.EXPLORE:
        raise TuneFailure.invalid(f"farm.tune needs policy.mode EXPLORE, got {tuner.policy.mode.value!r}")
    try:
        sources = tuple(source(p) for p in priors)
    except ValueError as e:
        raise TuneFailure.invalid(str(e)) from e
    client = client_for(device) if isinstance(device, str) else device
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    problem, candidates, order = stack_request(name or tunable.name, client.device_id, client, tunable, args)
    problem = dataclasses.replace(problem, persistent=False)  # a one-shot decision is never written anywhere
    runner = RuntimeTrials(client, tunable, args, order, tuner.policy.timing)
    with using(sources):
        decision = tuner.select(problem, candidates, 0, runner, device=client.device_id)
    reports = tuner.reports()
    return Tuned(decision, reports[-1] if reports else None, tunable[order[decision.index]].fn)
