"""The chaos soak (bench/soak.py; its short version is tests/test_soak.py): a catalog of trivial problems
(``farmtest_paced``) tuned by `farm tune` on two real `farm worker` processes, with private servers (a decisions
Redis, and a Redis or a private RabbitMQ node as the broker), while a seeded injector kills a worker (SIGKILL, then
starts it again), restarts the decisions Redis and the broker (SIGKILL, restarted on their data) and freezes the
coordinator (SIGSTOP, SIGCONT) at random intervals, every fault logged with its time.

Afterwards :func:`tally` counts, from the decisions Redis, which problems were decided and how many times each
decision was published; the coordinator's own JSON gives the reason of every problem it did not publish."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faultkit import FAULT_ENV, Server
from rabbitmq import RabbitMQNode
from servers import WorkerProcess, farm_env, free_port, start_worker, wait_worker_ready

from farm_fleet.settings import Settings

KINDS = ("worker", "decisions", "broker", "coordinator")
DEVICES = ("cpu:0", "cpu:1")


def paced_catalog(path: Path, problems: int, pace_ms: int) -> Path:
    """``problems`` trivial problems of ``farmtest_paced``, each costing its worker about ``pace_ms``."""
    rows = ",\n".join(f'  {{ index = {i}, pace_ms = {pace_ms}, dtype = "float64" }}' for i in range(problems))
    path.write_text(f"[policy]\nsamples = 3\nwarmups = 1\nbudget = 1.0\n\n[[problems]]\n"
                    f'operation = "farmtest_paced"\nworkloads = [\n{rows}\n]\n')
    return path


@dataclass
class Fault:
    at: float  # seconds since the coordinator started
    utc: str
    kind: str
    detail: str
    took: float  # seconds the injection took (a restarted server answering, a restarted worker announced)


def rss_kb(pids: list[int]) -> int:
    """The summed resident set of ``pids`` (0 for those gone)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def group_pids(leader: int) -> list[int]:
    """Every live process of the process group ``leader`` leads (a worker and its pool process)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[2]) == leader:
                    found.append(int(entry))
    return found


@dataclass
class SoakFleet:
    """The soak's servers, workers and coordinator; ``broker`` is "redis" or "rabbitmq" (a private node)."""

    directory: Path
    broker: str = "redis"
    decisions: Server = field(init=False)
    broker_redis: Server | None = None
    node: RabbitMQNode | None = None
    workers: list[WorkerProcess] = field(default_factory=list)
    coordinator: subprocess.Popen[bytes] | None = None
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def start(self, problems: int) -> None:
        self.decisions = Server(free_port(), self.directory / "decisions", aof=True)
        self.decisions.start()
        if self.broker == "rabbitmq":
            self.node = RabbitMQNode(self.directory / "rabbitmq")
            self.node.start()
            self.broker_url = self.stack.enter_context(self.node.vhost())
        else:
            self.broker_redis = Server(free_port(), self.directory / "broker", aof=True)
            self.broker_redis.start()
            self.broker_url = self.broker_redis.url()
        # Every publication stays in the events stream, so each one can be counted.
        self.env = farm_env({**FAULT_ENV, "FARM_PREFIX": f"soak{uuid.uuid4().hex[:6]}",
                             "FARM_EVENTS_MAXLEN": str(max(10000, 4 * problems))})
        self.settings = Settings.from_env(self.env, broker_url=self.broker_url, redis_url=self.decisions.url())
        for device in DEVICES:
            self.workers.append(self._worker(device))

    def _worker(self, device: str) -> WorkerProcess:
        worker = start_worker(device, self.broker_url, self.decisions.url(), self.directory / "workers", self.env)
        wait_worker_ready(worker, self.decisions.client(), self.settings.prefix)
        return worker

    def start_coordinator(self, catalog: Path) -> subprocess.Popen[bytes]:
        """``farm tune --json`` in its own session (so it can be frozen): stdout and stderr to files."""
        out, err = open(self.directory / "tune.json", "wb"), open(self.directory / "tune.log", "wb")  # noqa: SIM115
        with out, err:
            self.coordinator = subprocess.Popen(
                [sys.executable, "-m", "farm_cli", "tune", str(catalog), "--broker", self.broker_url, "--redis",
                 self.decisions.url(), "--kernels", "farm_testops", "--json"],
                env=self.env, stdout=out, stderr=err, start_new_session=True)
        return self.coordinator

    # -- the faults ------------------------------------------------------------------------------------------

    def kill_worker(self, index: int) -> str:
        old = self.workers[index]
        old.kill()
        self.workers[index] = self._worker(old.device)
        return f"SIGKILL worker {old.device} (pid {old.process.pid}), restarted as pid {self.workers[index].process.pid}"

    def restart_decisions(self, down: float) -> str:
        self.decisions.kill()
        time.sleep(down)  # the fault itself: the server is down this long
        self.decisions.start()
        return f"SIGKILL decisions Redis, down {down:.1f} s, restarted on its append-only file"

    def restart_broker(self, down: float) -> str:
        if self.node is not None:
            self.node.kill()
            time.sleep(down)  # the fault itself
            self.node.start()
            return f"SIGKILL RabbitMQ node {self.node.name}, down {down:.1f} s, restarted on its data"
        assert self.broker_redis is not None
        self.broker_redis.kill()
        time.sleep(down)  # the fault itself
        self.broker_redis.start()
        return f"SIGKILL broker Redis, down {down:.1f} s, restarted on its append-only file"

    def freeze_coordinator(self, seconds: float) -> str:
        assert self.coordinator is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.coordinator.pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)  # the fault itself: frozen this long
            finally:
                os.killpg(self.coordinator.pid, signal.SIGCONT)
        return f"SIGSTOP coordinator (pid {self.coordinator.pid}) for {seconds:.1f} s, then SIGCONT"

    def rss(self) -> tuple[int, int]:
        """(coordinator, both workers) resident set in kB."""
        coordinator = rss_kb([self.coordinator.pid]) if self.coordinator is not None else 0
        return coordinator, sum(rss_kb(group_pids(w.process.pid)) for w in self.workers)

    def close(self) -> None:
        if self.coordinator is not None and self.coordinator.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.coordinator.pid, signal.SIGCONT)
                os.killpg(self.coordinator.pid, signal.SIGKILL)
            self.coordinator.wait(30)
        for worker in self.workers:
            worker.stop()
        self.stack.close()
        if self.node is not None:
            self.node.stop()
        if self.broker_redis is not None:
            self.broker_redis.stop()
        with contextlib.suppress(AttributeError):
            self.decisions.stop()


class Injector(threading.Thread):
    """Seeded faults at random intervals (uniform in [0.5, 1.5] x ``every`` seconds) until ``stop`` is set. The
    kinds come from a deck shuffled by the seed, so every kind has come once in the first four faults."""

    def __init__(self, fleet: SoakFleet, seed: int, every: float, started: float, log: Callable[[Fault], None],
                 freeze: float = 5.0, down: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.fleet, self.rng, self.every, self.started, self.log = fleet, random.Random(seed), every, started, log
        self.freeze, self.down = freeze, down
        self.stop = threading.Event()
        self.faults: list[Fault] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        deck: list[str] = []
        try:
            while not self.stop.wait(self.rng.uniform(0.5, 1.5) * self.every):
                if not deck:
                    deck = list(KINDS)
                    self.rng.shuffle(deck)
                kind = deck.pop()
                at, begun, utc = time.monotonic() - self.started, time.monotonic(), time.gmtime()
                detail = self.inject(kind)
                fault = Fault(round(at, 1), time.strftime("%H:%M:%S", utc), kind, detail,
                              round(time.monotonic() - begun, 1))
                self.faults.append(fault)
                self.log(fault)
        except BaseException as e:  # surfaced by the caller: a fault that could not be injected or healed
            self.error = e

    def inject(self, kind: str) -> str:
        f, r = self.fleet, self.rng
        if kind == "worker":
            return f.kill_worker(r.randrange(len(f.workers)))
        if kind == "decisions":
            return f.restart_decisions(r.uniform(0.5, 1.5) * self.down)
        if kind == "broker":
            return f.restart_broker(r.uniform(0.5, 1.5) * self.down)
        return f.freeze_coordinator(r.uniform(0.5, 1.5) * self.freeze)


def tally(fleet: SoakFleet, problems: int) -> dict[str, Any]:
    """Decided problems, publications per decision (the events stream: one entry per publication) with their
    times, and the reason of every problem not published, from the coordinator's JSON."""
    client = fleet.decisions.client()
    s = fleet.settings
    decided: dict[str, str] = {}
    for digest in client.hkeys(s.fingerprints_key):
        decided.update(client.hgetall(s.problems_key(digest)))
    counts: dict[str, int] = {}
    times: list[float] = []
    for entry_id, entry in client.xrange(s.events_key):
        counts[entry["field"]] = counts.get(entry["field"], 0) + 1
        times.append(int(entry_id.split("-")[0]) / 1000.0)
    client.close()
    reasons: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError):
        document = json.loads((fleet.directory / "tune.json").read_text())
        for d in document["decisions"]:
            if d["error"] is not None or d["record"] is None:
                reasons[d["workload"]] = d["error"] or "no record"
    lost = problems - len(decided)
    if lost and not reasons:
        log = (fleet.directory / "tune.log").read_text(errors="replace")[-2000:]
        reasons["(coordinator)"] = f"exit {fleet.coordinator.returncode if fleet.coordinator else '?'}: {log}"
    duplicated = {k: n for k, n in counts.items() if n > 1}
    unpublished = sorted(set(decided.values()) - set(counts))
    return {"problems": problems, "decided": len(decided), "lost": lost, "lost_reasons": reasons,
            "publications": sum(counts.values()), "duplicated": len(duplicated), "unpublished_fields": unpublished,
            "publication_times": times}


def faults_json(faults: list[Fault]) -> list[dict[str, Any]]:
    return [asdict(f) for f in faults]


def run_soak(directory: Path, problems: int, pace_ms: int, seed: int, every: float, broker: str = "redis",
             freeze: float = 5.0, down: float = 2.0, sample_every: float = 10.0, timeout: float = 3600.0,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """One soak: the fleet up, the coordinator started, faults injected until it exits (or ``timeout``); the
    tally, the faults, and (seconds, coordinator kB, workers kB) RSS samples every ``sample_every`` seconds."""
    fleet = SoakFleet(directory, broker)
    try:
        fleet.start(problems)
        catalog = paced_catalog(directory / "soak.toml", problems, pace_ms)
        started_utc, started = time.time(), time.monotonic()
        coordinator = fleet.start_coordinator(catalog)

        def logged(fault: Fault) -> None:
            log(f"  fault at {fault.at:7.1f} s ({fault.utc} UTC) {fault.kind:<11} {fault.detail} "
                f"(handled in {fault.took:.1f} s)")

        injector = Injector(fleet, seed, every, started, logged, freeze=freeze, down=down)
        injector.start()
        samples: list[tuple[float, int, int]] = []
        next_sample = started + sample_every  # the first sample once the coordinator has loaded its catalog
        while coordinator.poll() is None and time.monotonic() - started < timeout:
            if time.monotonic() >= next_sample:
                samples.append((round(time.monotonic() - started, 1), *fleet.rss()))
                next_sample += sample_every
            with contextlib.suppress(subprocess.TimeoutExpired):
                coordinator.wait(0.5)  # polls the coordinator, with the soak's deadline
        wall = time.monotonic() - started
        injector.stop.set()
        injector.join(600)
        finished = coordinator.poll() is not None
        counted = tally(fleet, problems)
        return {**counted, "broker": broker, "seed": seed, "pace_ms": pace_ms, "wall_seconds": round(wall, 1),
                "finished": finished, "coordinator_exit": coordinator.returncode, "started_utc": started_utc,
                "faults": faults_json(injector.faults),
                "injector_error": repr(injector.error) if injector.error is not None else None,
                "rss_samples": samples}
    finally:
        fleet.close()
