"""One-shot tuning: ``farm.tune`` decides one operation on given inputs and returns the decision with its report.

Like ``kernel_tuner.tune_kernel``: no process-wide controller, no cache, no fleet. Each call builds a fresh
:class:`~farm.engine.StackTuner`, runs the full search (validation against the reference, order-balanced sequential
pairs) and forgets everything afterwards.
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
        """The chosen implementation's name."""
        return self.decision.name


def tune(
    tunable: TunableSet,
    inputs: Any,
    *,
    device: str | ComputeClient = "cpu:0",
    policy: StackPolicy | None = None,
    name: str | None = None,
    priors: Iterable[Tuned | DecisionRecord] = (),
) -> Tuned:
    """Tune ``tunable`` for ``inputs`` (a tuple of positional arguments, or one argument) on ``device`` (``"cpu:N"``,
    ``"cuda:N"`` or a client) and return the decision, its report and the chosen function.

    ``policy`` defaults to :class:`StackPolicy`; its mode must be EXPLORE (a one-shot call has no cache to serve).
    ``priors``: results of the same problem family on other devices (``Tuned``, or decision records whose meta
    keeps a ranking): a spaced search evaluates their best configs first and seeds its strategy with them,
    weighted by how well each predicts this device (farm.priors); the report's ``priors`` names them. They
    change the search's effort, never what a decision means.

    Nothing is stored. Raises TuneFailure INVALID_INPUT (bad policy, a prior without a ranking, no reference, no
    signature), DEVICE or REJECTED (the reference itself failed), UNAVAILABLE (no such device).
    """
    policy = StackPolicy() if policy is None else policy
    if not isinstance(policy, StackPolicy):
        raise TuneFailure.invalid(f"policy must be a StackPolicy, got {type(policy).__name__}")
    if policy.mode is not Mode.EXPLORE:
        raise TuneFailure.invalid(f"farm.tune needs policy.mode EXPLORE, got {policy.mode.value!r}")
    try:
        sources = tuple(source(p) for p in priors)
    except ValueError as e:
        raise TuneFailure.invalid(str(e)) from e
    client = client_for(device) if isinstance(device, str) else device
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    tuner = StackTuner(policy)
    problem, candidates, order = stack_request(name or tunable.name, client.device_id, client, tunable, args)
    problem = dataclasses.replace(problem, persistent=False)  # a one-shot decision is never written anywhere
    runner = RuntimeTrials(client, tunable, args, order, policy.timing)
    with using(sources):
        decision = tuner.select(problem, candidates, 0, runner, device=client.device_id)
    reports = tuner.reports()
    return Tuned(decision, reports[-1] if reports else None, tunable[order[decision.index]].fn)
