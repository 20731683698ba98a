"""What the controller's rule tests share: one problem, three candidates, a tuner with a changed policy."""

from __future__ import annotations

from typing import Any

from fakes import FAST, candidates, problem

from farm.engine import StackTuner

P = problem()
C = candidates("ref", "a", "b")


def tuner_with(**changes: Any) -> StackTuner:
    """A controller under the fast test policy with ``changes`` applied."""
    return StackTuner(FAST.replace(**changes))
