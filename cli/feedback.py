"""``farm tune --from-fleet``: tune what the applications reported (coordinator/feedback.py), then print what was
decided, what was acknowledged and what is left in the stream, and why."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from farm.errors import FarmError
from farm_cli.errors import EXIT_FAILED
from farm_fleet.settings import Settings

if TYPE_CHECKING:  # types only
    from farm_coordinator.ports import Parts


def from_fleet(catalog: Path | None, settings: Settings, parts: Parts, kernels: tuple[str, ...], run_id: str,
               timeout: float | None, as_json: bool) -> None:
    """Run the fleet's reports as catalogs on ``parts`` (their observer shows each run). CATALOG, when given,
    supplies only the [policy]."""
    from farm.policy import StackPolicy
    from farm.stores.redis import connect
    from farm_coordinator.catalog import load_catalog, workload_label
    from farm_coordinator.feedback import run_id_for, tune_from_fleet
    from farm_coordinator.ports import RunOptions
    from farm_coordinator.run import tune

    if not settings.redis_url:
        raise FarmError("--from-fleet reads the reports stream: give --redis (or FARM_REDIS_URL)")
    policy = load_catalog(catalog, kernels, policy_only=True).policy if catalog is not None else StackPolicy()
    client = connect(settings.redis_url, timeout=10.0)
    runs = 0

    def run(cat: Any, fingerprint: str, force: bool) -> Any:
        nonlocal runs
        runs += 1
        options = RunOptions(run=run_id_for(run_id, force, runs), force=force, fingerprint=fingerprint,
                             timeout=timeout)
        return tune(cat, parts, settings, options)

    result = tune_from_fleet(client, settings, policy, run, kernels)
    rows = [{"operation": e.operation, "workload": workload_label(e.operation, e.spec), "device_kind": e.device_kind,
             "fingerprint": e.fingerprint, "hosts": len(e.hosts), "reports": e.reports, "reason": e.reason,
             "calls_per_hour": e.calls_per_hour, "weight": e.weight,
             "decided": e in result.decided} for e in result.entries]
    if as_json:
        click.echo(json.dumps({"problems": rows, "acknowledged": result.acknowledged, "left": result.left},
                              indent=1, sort_keys=True))
    else:
        for row in rows:
            state = "decided" if row["decided"] else "left"
            click.echo(f"{state:8} {row['operation']} {row['workload']} on {row['device_kind'] or '?'} "
                       f"[{row['fingerprint']}]: {row['reason']}")
        click.echo(f"{len(result.decided)} of {len(result.entries)} reported problems decided; "
                   f"{result.acknowledged} reports acknowledged")
        for reason, count in sorted(result.left.items()):
            click.echo(f"left in the stream: {count} report(s): {reason}")
    if any(reason.endswith("not decided in this run") for reason in result.left):
        sys.exit(EXIT_FAILED)
