"""``farm``: the command line. Each command parses its options and calls one library function.

The CLI is the composition root: it is the one place that wires the coordinator to the workers' task code (the
embedded farm), so that ``coordinator`` and ``workers`` never import each other.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from farm.errors import FarmError
from farm_fleet.settings import Settings

KERNELS_HELP = "Import operations from this module (repeatable); also discovered: the farm.kernels entry points."


@click.group()
@click.version_option(package_name="tuning-farm")
def main() -> None:
    """A distributed kernel-autotuning farm: tune once per GPU model, reuse everywhere."""


@main.command()
@click.argument("catalog", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--broker", envvar="FARM_BROKER_URL", help="Celery broker URL; without it the embedded farm runs here.")
@click.option("--redis", "redis_url", envvar="FARM_REDIS_URL", help="Decisions/results Redis URL (with --broker).")
@click.option("--fingerprint", help="Only this fingerprint (digest or prefix).")
@click.option("--force", is_flag=True, help="Re-tune problems that already have a decision.")
@click.option("--kernels", "kernels", multiple=True, help=KERNELS_HELP)
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".farm-cache"),
              show_default=True, help="Embedded farm: where decisions are written (the runtime's cache_directory).")
@click.option("--device", "devices", multiple=True, default=("cpu:0",), show_default=True,
              help="Embedded farm: local devices to tune on (repeatable).")
@click.option("--run", "run_id", help="Run id (default: a new one).")
@click.option("--timeout", type=float, help="Give up on groups without a result after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the decisions as JSON instead of a table.")
def tune(catalog: Path, broker: str | None, redis_url: str | None, fingerprint: str | None, force: bool,
         kernels: tuple[str, ...], cache_dir: Path, devices: tuple[str, ...], run_id: str | None,
         timeout: float | None, as_json: bool) -> None:
    """Tune every problem of CATALOG on the fleet (or, without --broker, on this machine)."""
    from rich.console import Console

    from farm_coordinator.catalog import load_catalog
    from farm_coordinator.run import summary_table
    from farm_coordinator.run import tune as run_tune

    settings = Settings.from_env(broker_url=broker, redis_url=redis_url)
    from farm_coordinator.run import RunInterrupted

    with _errors():
        cat = load_catalog(catalog, kernels)
        parts = _celery_parts(settings) if broker else _embedded_parts(settings, devices, cache_dir, kernels)
        try:
            summary = run_tune(cat, settings=settings, run=run_id, force=force, fingerprint=fingerprint,
                               timeout=timeout, **parts)
        except RunInterrupted as interrupted:
            click.echo(f"farm: {interrupted}", err=True)
            sys.exit(RunInterrupted.exit_code)
    if as_json:
        rows = [{"operation": a.problem.workload.operation, "spec": a.problem.workload.spec,
                 "fingerprint": a.problem.target.digest, "record": a.record.to_dict() if a.record else None,
                 "error": a.error} for a in summary.aggregates]
        click.echo(json.dumps({"run": summary.run, "decisions": rows}, indent=1))
    else:
        Console(width=None if sys.stdout.isatty() else 160).print(summary_table(summary))
        where = "Redis" if broker else str(cache_dir)
        click.echo(f"{summary.published} decisions published to {where} in {summary.wall_seconds:.1f}s "
                   f"({summary.tasks} group tasks: {summary.ran} ran, {summary.reused} reused; "
                   f"{len(summary.already_decided)} problems already decided, {len(summary.failed)} failed)")


@main.command()
@click.option("--device", required=True, help="cuda:N or cpu:N")
@click.option("--broker", envvar="FARM_BROKER_URL", required=True)
@click.option("--redis", "redis_url", envvar="FARM_REDIS_URL", required=True)
@click.option("--kernels", "kernels", multiple=True, help=KERNELS_HELP)
@click.option("--loglevel", default="INFO", show_default=True)
def worker(device: str, broker: str, redis_url: str, kernels: tuple[str, ...], loglevel: str) -> None:
    """Run one worker process pinned to DEVICE."""
    from farm_workers.worker import run_worker

    with _errors():
        sys.exit(run_worker(device, Settings.from_env(broker_url=broker, redis_url=redis_url), kernels, loglevel))


@main.command()
@click.option("--redis", "redis_url", envvar="FARM_REDIS_URL", required=True, help="Decisions/results Redis URL.")
@click.option("--broker", envvar="FARM_BROKER_URL", help="Broker URL (a Redis one adds queue depths).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of tables.")
def status(redis_url: str, broker: str | None, as_json: bool) -> None:
    """Workers per fingerprint and their state, queue depths, decisions, and tuning runs with progress."""
    from rich.console import Console

    from farm.stores.redis import connect
    from farm_coordinator.status import collect, render

    settings = Settings.from_env(redis_url=redis_url, broker_url=broker)
    with _errors():
        try:
            client = connect(redis_url, timeout=5.0)
            broker_client = connect(broker, timeout=5.0) if broker and broker.startswith("redis") else None
            data = collect(client, settings, broker_client)
        except Exception as e:  # redis-py's connection errors share no base class with OSError
            if type(e).__module__.startswith("redis") or isinstance(e, OSError):
                raise FarmError(f"cannot reach Redis: {e}") from e
            raise
    if as_json:
        click.echo(json.dumps(data, indent=1, sort_keys=True))
    else:
        Console(width=None if sys.stdout.isatty() else 160).print(render(data))


@main.command()
@click.option("--archive", "archive", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="An archive directory (one <digest>/ folder or a folder of them).")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The HTML file to write.")
def report(archive: Path, out: Path) -> None:
    """Write a self-contained HTML report of an archive's decisions: why each kernel won."""
    from farm_coordinator.report import write_report

    with _errors():
        count = write_report(archive, out)
    click.echo(f"{count} problems written to {out}")


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--broker", envvar="FARM_BROKER_URL", required=True, help="The farm's Celery broker URL.")
@click.option("--address", default="127.0.0.1", show_default=True)
@click.option("--port", default=5555, show_default=True, type=int)
@click.option("--basic-auth", envvar="FARM_FLOWER_BASIC_AUTH", required=True,
              help="user:password[,user:password]; Flower refuses every request without it.")
@click.argument("flower_args", nargs=-1, type=click.UNPROCESSED)
def flower(broker: str, address: str, port: int, basic_auth: str, flower_args: tuple[str, ...]) -> None:
    """Run Flower against the farm's broker, with basic authentication required."""
    from farm_workers.flower import run_flower

    with _errors():
        sys.exit(run_flower(broker, address, port, basic_auth, flower_args))


def _celery_parts(settings: Settings) -> dict[str, Any]:
    """The coordinator's parts for a Celery fleet: keyword arguments of ``farm_coordinator.run.tune``."""
    from celery import Celery

    from farm.stores.redis import RedisDecisions, connect
    from farm_coordinator.dispatch import CeleryDispatcher
    from farm_coordinator.fleet import RedisFleet
    from farm_coordinator.leases import RedisLeases
    from farm_coordinator.runlog import RedisRunLog
    from farm_coordinator.sinks import RedisSink
    from farm_fleet.celeryconf import celery_config
    from farm_fleet.results import RedisResults

    if not settings.redis_url:
        raise FarmError("--redis (or FARM_REDIS_URL) is required with --broker")
    app = Celery("farm-coordinator", set_as_current=False)
    app.conf.update(celery_config(settings))
    client = connect(settings.redis_url, timeout=10.0)
    results = RedisResults(client, settings)
    return {
        "fleet": RedisFleet(client, settings),
        "dispatcher": CeleryDispatcher(app, results, settings),
        "sink": RedisSink(RedisDecisions(client=client, settings=settings)),
        "leases": RedisLeases(client, settings),
        "results": results,
        "runlog": RedisRunLog(client, settings),
    }


def _embedded_parts(settings: Settings, devices: tuple[str, ...], cache_dir: Path,
                    kernels: tuple[str, ...]) -> dict[str, Any]:
    """The embedded farm's parts: local devices, in-process dispatch of the workers' task code, a cache dir."""
    from farm.runtimes.base import client_for
    from farm_coordinator.dispatch import LocalDispatcher
    from farm_coordinator.fleet import LocalFleet
    from farm_coordinator.sinks import DirectorySink
    from farm_fleet.protocol import GroupResult, GroupTask
    from farm_fleet.results import MemoryResults
    from farm_workers.tasks import WorkerContext, run_group

    results = MemoryResults()
    contexts = {}
    for device in devices:
        ctx = WorkerContext(client=client_for(device), results=results, settings=settings,
                            worker_id=f"local-{device.replace(':', '')}", kernels=kernels)
        contexts[ctx.worker_id] = ctx
    fleet = LocalFleet(list(contexts.values()))

    def execute(task: GroupTask, queue: str) -> GroupResult:
        return GroupResult.from_dict(run_group(task.to_dict(), fleet.context_for(task, queue)))

    return {"fleet": fleet, "dispatcher": LocalDispatcher(execute), "sink": DirectorySink(cache_dir)}


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Turn farm errors into a one-line message and exit status 2."""
    try:
        yield
    except FarmError as error:
        click.echo(f"farm: error: {error}", err=True)
        sys.exit(2)


# -- farm archive: Parquet archives of decisions (docs/archives.md) ---------------------------------------------


@main.group()
def archive() -> None:
    """Parquet archives of decisions: export, import, inspect, merge, diff (docs/archives.md)."""


@contextlib.contextmanager
def _archive_errors() -> Iterator[None]:
    """Farm errors, and an unreachable Redis or unwritable directory, as one line and exit status 2."""
    import redis

    with _errors():
        try:
            yield
        except (redis.RedisError, OSError) as error:
            raise FarmError(f"{type(error).__name__}: {error}") from error


def _archive_redis(url: str) -> Any:
    from farm.stores.redis import RedisDecisions, connect

    # A whole archive is one transaction: allow the server time to apply it.
    return RedisDecisions(client=connect(url, timeout=600.0), settings=Settings.from_env(redis_url=url))


def _one_source(**given: Any) -> None:
    options = {f"--{k.replace('_', '-')}": v for k, v in given.items()}
    named = [k for k, v in options.items() if v is not None]
    if len(named) != 1:
        raise FarmError(f"give exactly one of {' or '.join(options)}" + (f" (got {' and '.join(named)})" if named else ""))


@archive.command("export")
@click.option("--redis", "redis_url", help="Export from this Redis URL (the farm's decisions database).")
@click.option("--from-cache", type=click.Path(file_okay=False, path_type=Path),
              help="Export from a local cache directory (the embedded farm's --cache-dir) instead.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Archive directory: one <fingerprint digest>/ folder is written per fingerprint.")
@click.option("--fingerprint", help="Only this fingerprint (digest, digest prefix or full text).")
def archive_export(redis_url: str | None, from_cache: Path | None, out: Path, fingerprint: str | None) -> None:
    """Write the decisions of every fingerprint (or one) to OUT/<digest>/, atomically per fingerprint."""
    from farm_coordinator.archive import export_cache, export_redis

    with _archive_errors():
        _one_source(redis=redis_url, from_cache=from_cache)
        if redis_url is not None:
            results = export_redis(_archive_redis(redis_url), out, fingerprint)
        else:
            assert from_cache is not None
            results = export_cache(from_cache, out, fingerprint)
    for r in results:
        w = r.written
        click.echo(f"exported {w.decisions} decisions ({w.trials} trial rows) of fingerprint {r.digest} to {w.path} "
                   f"({w.bytes} bytes)")
        for reason in r.skipped:
            click.echo(f"farm: warning: skipped decision {reason}", err=True)
    if not results:
        click.echo("no fingerprints to export")


@archive.command("import")
@click.argument("archive_dir", type=click.Path(path_type=Path))
@click.option("--redis", "redis_url", help="Import into this Redis URL.")
@click.option("--into-cache", type=click.Path(file_okay=False, path_type=Path),
              help="Import into this local cache directory (a runtime's cache_directory) instead.")
@click.option("--fingerprint", help="With --redis: the target fingerprint (digest, prefix or full text); "
                                    "default: each archive's own.")
@click.option("--device", default="cpu:0", show_default=True,
              help="With --into-cache: the device (cpu:N, cuda:N) whose runtime fingerprint the archive must match.")
@click.option("--force", is_flag=True, help="Import despite a fingerprint mismatch, re-keying the decisions to the "
                                            "target fingerprint. Never overrides a corrupt archive.")
def archive_import(archive_dir: Path, redis_url: str | None, into_cache: Path | None, fingerprint: str | None,
                   device: str, force: bool) -> None:
    """Import ARCHIVE_DIR (one archive folder or a folder of them): everything is verified first, then all of it
    is written at once, or nothing is."""
    from farm_coordinator.archive import import_cache, import_redis, load_archives

    with _archive_errors():
        _one_source(redis=redis_url, into_cache=into_cache)
        archives = load_archives(archive_dir)
        if redis_url is not None:
            results = import_redis(archives, _archive_redis(redis_url), fingerprint, force)
            where = "Redis"
        else:
            assert into_cache is not None
            if fingerprint is not None:
                raise FarmError("--fingerprint applies to --redis; with --into-cache the target is --device's")
            from farm.environment import runtime_environment
            from farm.runtimes.base import client_for

            env = runtime_environment(client_for(device))
            if not env.persistent:
                raise FarmError(f"--device {device}: this machine's runtime environment is not persistent (no driver "
                                f"or build identity): the runtime never reads a cache directory for it")
            results = import_cache(archives, into_cache, env.fingerprint, force)
            where = str(into_cache)
    for r in results:
        click.echo(f"imported archive {r.digest} into {where}: {r.decisions} decisions ({r.new} new, {r.replaced} "
                   f"replaced, {r.kept} kept: the stored record won under the replacement rule)")
        if r.forced:
            click.echo(f"farm: warning: fingerprint check overridden by --force: archive {r.digest} was re-keyed to "
                       f"fingerprint {r.target_digest}", err=True)
        for note in r.notes:
            click.echo(f"farm: warning: {note}", err=True)


@archive.command("inspect")
@click.argument("archive_dir", type=click.Path(path_type=Path))
@click.option("--operation", help="Only decisions of this operation.")
@click.option("--json", "as_json", is_flag=True, help="Print the decisions as JSON instead of a table.")
def archive_inspect(archive_dir: Path, operation: str | None, as_json: bool) -> None:
    """Verify ARCHIVE_DIR and show its decisions."""
    from rich.console import Console

    from farm_coordinator.archive import inspect_rows, inspect_table, load_archives

    with _archive_errors():
        archives = load_archives(archive_dir)
        rows = inspect_rows(archives, operation)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    else:
        Console(width=None if sys.stdout.isatty() else 160).print(inspect_table(archives, rows))


@archive.command("merge")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
def archive_merge(out: Path, inputs: tuple[Path, ...]) -> None:
    """Merge archives of one fingerprint into OUT/<digest>/ under the replacement rule."""
    from farm_coordinator.archive import merge_archives

    with _archive_errors():
        if len(inputs) < 2:
            raise FarmError("merge needs OUT and at least two archives")
        result = merge_archives(inputs, out)
    w = result.written
    click.echo(f"merged {result.inputs} archives ({result.decisions_in} decisions) into {w.path}: {w.decisions} "
               f"decisions, {result.replaced} replaced under the replacement rule, {w.trials} trial rows")


@archive.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON instead of a table.")
def archive_diff(a: Path, b: Path, as_json: bool) -> None:
    """What changed from archive A to archive B: new, dropped and changed winners, with ratios."""
    from rich.console import Console

    from farm_coordinator.archive import diff_archives, diff_table

    with _archive_errors():
        diff = diff_archives(a, b)
    if as_json:
        click.echo(json.dumps(diff.to_json(), indent=1))
    else:
        Console(width=None if sys.stdout.isatty() else 160).print(diff_table(diff))


if __name__ == "__main__":
    main()
