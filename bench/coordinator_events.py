"""The coordinator's own cost per event: N trivial problems through the run's state machine, with group results
made instantly (one real result, copied), a memory sink and in-process dispatch. Prints events/s per N: a
constant rate means constant cost per event (issue 13 item 1: no scan of all problems per event)."""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rich.console import Console  # noqa: E402

from farm.runtimes import client_for  # noqa: E402
from farm.stores.base import DecisionRecord, Publication  # noqa: E402
from farm_coordinator.catalog import load_catalog  # noqa: E402
from farm_coordinator.dispatch import LocalDispatcher  # noqa: E402
from farm_coordinator.fleet import LocalFleet  # noqa: E402
from farm_coordinator.ports import Parts  # noqa: E402
from farm_coordinator.run import tune  # noqa: E402
from farm_coordinator.runview import ConsoleObserver  # noqa: E402
from farm_fleet.protocol import GroupResult, GroupTask  # noqa: E402
from farm_fleet.results import MemoryResults  # noqa: E402
from farm_fleet.settings import Settings  # noqa: E402
from farm_workers.tasks import WorkerContext, run_group  # noqa: E402


class MemorySink:
    def __init__(self) -> None:
        self.records: dict[str, DecisionRecord] = {}

    def publish(self, record: DecisionRecord, fingerprint: str, problem_id: str, trials: list[dict[str, Any]],
                fence: tuple[str, str] | None = None) -> tuple[bool, str]:
        self.records[problem_id] = record
        return True, "new"

    def publish_many(self, publications: list[Publication]) -> list[tuple[bool, str]]:
        return [self.publish(p.record, p.fingerprint, p.problem_id, list(p.trials), p.fence) for p in publications]

    def decided(self, digest: str, problem_ids: list[str]) -> set[str]:
        return {p for p in problem_ids if p in self.records}

    def problem_records(self, digest: str, problem_ids: list[str]) -> dict[str, DecisionRecord]:
        return {p: self.records[p] for p in problem_ids if p in self.records}


def main() -> None:
    settings = Settings()
    ctx = WorkerContext(client=client_for("cpu:0"), results=MemoryResults(), settings=settings, worker_id="local-cpu0",
                        kernels=("bench_ops",))
    fleet = LocalFleet([ctx])
    template: dict[str, GroupResult] = {}

    def execute(task: GroupTask, queue: str) -> GroupResult:
        if task.group not in template:
            template[task.group] = GroupResult.from_dict(run_group(task.to_dict(), ctx))
        return dataclasses.replace(template[task.group], run=task.run, problem_id=task.problem_id)

    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 2000, 4000]
    print(f"{'problems':>9} {'seconds':>8} {'events/s':>9}")
    for n in sizes:
        with tempfile.TemporaryDirectory() as d:
            workloads = ", ".join(f"{{ n = {8 + i}, dtype = \"float64\" }}" for i in range(n))
            path = Path(d) / "c.toml"
            path.write_text("[policy]\nsamples = 3\nwarmups = 1\nbudget = 1.0\nmax_relative_mad = 1.0\n"
                            f"[[problems]]\noperation = \"bench_trivial\"\nworkloads = [{workloads}]\n")
            catalog = load_catalog(path, ("bench_ops",))
            started = time.perf_counter()
            parts = Parts(fleet, LocalDispatcher(execute), MemorySink(), observer=ConsoleObserver(quiet))
            summary = tune(catalog, parts, settings)
            seconds = time.perf_counter() - started
            events = summary.ran + summary.published
            print(f"{n:>9} {seconds:>8.2f} {events / seconds:>9.0f}")


if __name__ == "__main__":
    main()
