"""The errors only the fleet raises, under the core's root :class:`farm.errors.FarmError`.

```
FarmError
├── StoreUnavailable                       the decisions/results Redis stayed unreachable past its retries
├── DeviceQuarantined                      a worker's device failed a completion fence
├── RunInterrupted                         a tuning run was interrupted (Ctrl-C)
├── IllegalTransition (also RuntimeError)  the coordinator's machine refused a transition (a bug)
├── GroupsFailed                           groups of a task failed in the farm (the task's state says so)
└── CompileTimeout                         the compile queue did not compile every kernel before the deadline
```

They round-trip through JSON like every farm error (``farm.errors.error_from_dict``): importing ``farm_fleet``
registers them. The tree above is checked against the classes by ``tests/test_errors.py``.
"""

from __future__ import annotations

from typing import Any

from farm.errors import FarmError

__all__ = ["CompileTimeout", "DeviceQuarantined", "GroupsFailed", "IllegalTransition", "RunInterrupted",
           "StoreUnavailable"]


class StoreUnavailable(FarmError):
    """Raised when the decisions/results Redis stayed unreachable for the whole retry budget."""


class DeviceQuarantined(FarmError):
    """Raised when a worker's device failed a completion fence: its task must go to another worker."""


class RunInterrupted(FarmError):
    """Raised when a tuning run is interrupted (Ctrl-C) after its queued tasks were revoked and its leases
    released; ``summary`` is the run's summary so far (None after a round trip through JSON)."""

    exit_code = 130
    summary: Any = None
    headline: str | None = None  # the message without its resume advice (a caller with its own advice prints it)


class IllegalTransition(FarmError, RuntimeError):
    """Raised when an event would move a problem along a transition the coordinator's machine does not allow (a
    bug)."""


class GroupsFailed(FarmError):
    """Raised when groups of a task failed in the farm (their failed results are stored, so nothing is retried):
    the Celery task ends in state FAILURE, as Flower shows it, with each failed group and its error."""

    @classmethod
    def of(cls, failed: list[dict[str, Any]], total: int) -> GroupsFailed:
        """The error for ``failed`` result dicts out of ``total`` (one argument: it round-trips as it is)."""
        lines = "; ".join(f"{r.get('problem_id', '?')}/{r.get('group', '?')}: {r.get('error') or r.get('status')}"
                          for r in failed[:5])
        more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
        return cls(f"{len(failed)} of {total} groups failed in the farm: {lines}{more}")


class CompileTimeout(FarmError):
    """Raised when the compile queue did not store every job's entry before the deadline (no compile worker
    running?)."""
