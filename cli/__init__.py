"""``farm``: the command line. Each command parses its options and calls one library function.

The CLI is the composition root: it is the one place that wires the coordinator to the workers' task code (the
embedded farm), so that ``coordinator`` and ``workers`` never import each other. Exit status: 0 all done, 1 some
problems failed, 2 bad usage, configuration or an unreachable server, 130 on Ctrl-C (``farm_cli.errors``).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from farm.errors import FarmError
from farm_cli.devices import check_device
from farm_cli.errors import BROKER_SCHEMES, EXIT_FAILED, EXIT_INTERRUPTED, REDIS_SCHEMES, check_url, errors
from farm_cli.logs import LEVELS, setup_logging
from farm_cli.parts import celery_parts, compile_stage, embedded_parts, reachable
from farm_fleet.settings import Settings

if TYPE_CHECKING:  # types only
    from farm_coordinator.ports import Parts, RunObserver

KERNELS_HELP = ("Import operations from this module (repeatable; it must be importable: installed, or on "
                "PYTHONPATH). Also loaded: the farm.kernels entry points.")
ENVIRONMENT = """\b
Environment variables (the options' defaults):
  FARM_BROKER_URL         the Celery broker (redis://host:6379/0)
  FARM_REDIS_URL          the decisions/results Redis (redis://host:6379/1)
  FARM_FLOWER_BASIC_AUTH  Flower's user:password[,user:password]
  FARM_PREFIX, FARM_LOCK_DIR and the other FARM_* settings: docs/farm.md
"""


# Modules of the optional extras (pyproject.toml) -> the extra that installs them.
EXTRA_MODULES = {"celery": "farm", "kombu": "farm", "redis": "farm", "packaging": "farm", "pyarrow": "farm",
                 "flower": "farm", "tornado": "farm", "cryptography": "farm", "cupy": "cuda"}


class _FarmGroup(click.Group):
    """A missing optional dependency is one line naming the install command, not a traceback; bad usage (a missing
    option, an unknown one) is one ``farm: error:`` line like every other error, with exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as error:
            click.echo(f"farm: error: {usage_problem(error)}", err=True)
            sys.exit(2)
        except ModuleNotFoundError as error:
            module = (error.name or "").partition(".")[0]
            if module not in EXTRA_MODULES:
                raise
            extra = EXTRA_MODULES[module]
            click.echo(f"farm: error: this command needs {module}, which is not installed: "
                       f"pip install 'tuning-farm[{extra}]'", err=True)
            sys.exit(2)


def usage_problem(error: click.UsageError) -> str:
    """The line for a usage error: a missing option names its environment variable too (``farm status`` with
    nothing configured: ``missing --redis (or FARM_REDIS_URL)``), and where to read more."""
    names: list[str] = []
    ctx = error.ctx
    while ctx is not None and ctx.parent is not None:  # the subcommands, however the program was started
        names.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    command = " ".join(["farm", *names])
    param = getattr(error, "param", None)
    if isinstance(error, click.MissingParameter) and isinstance(param, click.Option):
        option = max(param.opts, key=len)
        variable = f" (or {param.envvar})" if isinstance(param.envvar, str) else ""
        what = f": {param.help.rstrip('.')}" if param.help else ""
        return f"{command}: missing {option}{variable}{what}; see `{command} --help`"
    return f"{command}: {error.format_message().rstrip('.')}; see `{command} --help`"


# What a click option decorates (the command's callback), kept precise so commands stay typed.
_Command = TypeVar("_Command", bound=Callable[..., Any])


def _broker(required: bool = False, **kw: Any) -> Callable[[_Command], _Command]:
    return click.option("--broker", envvar="FARM_BROKER_URL", show_envvar=True, required=required, **kw)


def _redis(required: bool = False, help: str = "Decisions/results Redis URL.") -> Callable[[_Command], _Command]:
    return click.option("--redis", "redis_url", envvar="FARM_REDIS_URL", show_envvar=True, required=required,
                        help=help)


def _check(broker: str | None, redis_url: str | None) -> None:
    check_url(broker, "broker", "--broker", "FARM_BROKER_URL", BROKER_SCHEMES)
    check_url(redis_url, "Redis", "--redis", "FARM_REDIS_URL", REDIS_SCHEMES)


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160)


@click.group(cls=_FarmGroup, epilog=ENVIRONMENT)
@click.version_option(package_name="tuning-farm")
def main() -> None:
    """A distributed kernel-autotuning farm: tune once per GPU model, reuse everywhere."""


@main.command(epilog=ENVIRONMENT)
@click.argument("catalog", type=click.Path(dir_okay=False, path_type=Path), required=False)
@_broker(help="Celery broker URL; without it the embedded farm runs here.")
@_redis(help="Decisions/results Redis URL (with --broker).")
@click.option("--fingerprint", help="Only this fingerprint (digest or prefix).")
@click.option("--force", is_flag=True, help="Re-tune problems that already have a decision.")
@click.option("--no-priors", is_flag=True, help="Search every space from nothing: no other fingerprints' decisions "
              "of the same problem family seed it (docs/spaces.md, Priors).")
@click.option("--priors-from", "priors_from", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="Archive directory (farm archive export) where priors are looked up too, after the decision store "
                   "(repeatable).")
@click.option("--kernels", "kernels", multiple=True, help=KERNELS_HELP)
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".farm-cache"),
              show_default=True, help="Embedded farm: where decisions are written (the runtime's cache_directory).")
@click.option("--device", "devices", multiple=True, default=("cpu:0",), show_default=True,
              help="Embedded farm: local devices to tune on (repeatable): cpu:N, cuda:N, replay:PATH[#N].")
@click.option("--run", "run_id", help="Run id (default: a new one).")
@click.option("--timeout", type=float, help="Give up on groups without a result after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the decisions as JSON instead of a table.")
@click.option("--loglevel", type=click.Choice(LEVELS, case_sensitive=False), default="INFO", show_default=True)
@click.option("--log-json", is_flag=True, help="Log JSON lines on stderr (progress, warnings) for log collectors.")
@click.option("--from-fleet", is_flag=True, help="Tune what applications reported missing or regressed (the reports "
              "stream in --redis); CATALOG, if given, supplies only the [policy]. See docs/farm.md, Fleet feedback.")
@click.option("--arch", help="Compile the CUDA spaces for this architecture (sm_90) before sending their trials "
              "(default: each CUDA fingerprint's). See docs/compile.md.")
@click.option("--kernel-cache-dir", type=click.Path(file_okay=False, path_type=Path), help="Kernel cache directory "
              "for that compile stage (default: the fleet's Redis; embedded: $FARM_KERNEL_CACHE or ~/.cache/farm/kernels).")
@click.option("--budget-device-seconds", "run_budget", type=float, help="Spend at most this many device seconds on "
              "the whole run, each on the problem where the fleet saves the most (default: the catalog's [policy] "
              "run_budget, else no limit). See docs/farm.md, The run budget.")
def tune(catalog: Path | None, broker: str | None, redis_url: str | None, fingerprint: str | None, force: bool,
         kernels: tuple[str, ...], cache_dir: Path, devices: tuple[str, ...], run_id: str | None,
         timeout: float | None, as_json: bool, loglevel: str, log_json: bool, from_fleet: bool, arch: str | None,
         kernel_cache_dir: Path | None, no_priors: bool, run_budget: float | None,
         priors_from: tuple[str, ...]) -> None:
    """Tune every problem of CATALOG on the fleet (or, without --broker, on this machine).

    Exit status 0 when every problem has a decision, 1 when some failed (rerun the same command to retry them;
    --force re-tunes decided ones too), 2 for a bad catalog, option or unreachable server, 130 on Ctrl-C."""
    from rich.console import Console

    from farm_cli import summary as report
    from farm_cli.progress import LogProgress, TerminalProgress
    from farm_coordinator.catalog import load_catalog, parse_run_budget
    from farm_coordinator.ports import RunOptions
    from farm_coordinator.run import new_run_id
    from farm_coordinator.run import tune as run_tune
    from farm_coordinator.runlog import RedisRunLog

    setup_logging(loglevel, log_json)
    run_id = run_id or new_run_id()
    stderr = Console(stderr=True)
    progress: RunObserver = TerminalProgress(stderr) if stderr.is_terminal and not log_json else LogProgress()
    again = f"rerun `farm tune {catalog}` with the same options (add --run {run_id} to continue this run)"
    parts: Parts | None = None
    with errors(interrupted_hint=f"run the same command again to resume ({again}): finished groups are reused and "
                                 "published decisions are kept"):
        try:
            settings = Settings.from_env(broker_url=broker, redis_url=redis_url)
            _check(broker, redis_url)
            if catalog is None and not from_fleet:
                raise click.UsageError("give a CATALOG (or --from-fleet)")
            if from_fleet and not broker:
                raise click.UsageError("--from-fleet tunes for the fleet: give --broker and --redis (or FARM_BROKER_URL "
                                       "and FARM_REDIS_URL)")
            if not broker:
                for device in devices:
                    check_device(device)
            if arch is not None:
                from farm_kernels.cuda.compile import check_arch

                check_arch(arch)  # before the catalog and the servers, as farm compile does
            cat = load_catalog(catalog, kernels) if catalog is not None and not from_fleet else None
            budget = parse_run_budget(run_budget, "farm tune", "--budget-device-seconds")
            parts = celery_parts(settings) if broker else embedded_parts(settings, devices, cache_dir, kernels)
            if isinstance(parts.runlog, RedisRunLog):  # a fleet run: count into the farm's metrics (farm metrics)
                from farm_coordinator.metrics import RunMetrics

                progress = RunMetrics(parts.runlog.client, settings, progress)
            parts = replace(parts, precompile=compile_stage(settings, bool(broker), arch, kernel_cache_dir, devices),
                            observer=progress)
            if from_fleet:
                from farm_cli.feedback import from_fleet as tune_fleet_reports

                tune_fleet_reports(catalog, settings, parts, kernels, run_id, timeout, as_json)
                return
            assert cat is not None
            options = RunOptions(run=run_id, force=force, fingerprint=fingerprint, timeout=timeout,
                                 priors=not no_priors, prior_archives=priors_from, budget_device_seconds=budget)
            summary = run_tune(cat, parts, settings, options)
        except BaseException as e:
            interrupted = isinstance(e, KeyboardInterrupt) or getattr(e, "exit_code", None) == 130
            _abandon(parts, run_id, progress, "interrupted" if interrupted else "failed")
            raise
        rows = report.rows(summary, parts.sink, cat.policy)  # the records are read back from the sink
        if as_json:
            for piece in report.as_json(summary, rows, parts.sink):
                click.echo(piece, nl=False)
            click.echo()
    failed = report.failures(rows)
    with contextlib.suppress(Exception):  # a note only: the fleet may be gone by now
        targets = parts.fleet.targets()
        for line in report.not_tuned(cat, {t.device_kind for t in targets}, {t.digest for t in targets}):
            click.echo(f"farm: note: {line}", err=True)
    if not as_json:
        console = _console()
        console.print(report.table(summary, rows))
        click.echo(report.LEGEND)
        where = "Redis" if broker else str(cache_dir)
        click.echo(f"{summary.published} decisions published to {where} in {summary.wall_seconds:.1f}s "
                   f"({summary.tasks} group tasks: {summary.ran} group results ran, {summary.reused} reused; "
                   f"{summary.decided_before} problems reused from earlier runs"
                   f"{', add --force to re-tune them' if summary.decided_before else ''})")
        click.echo(report.cost_line(summary))
        for line in report.budget_lines(summary):
            click.echo(line)
    for line in failed:
        click.echo(f"farm: failed: {line}", err=True)
    if failed:
        click.echo(f"farm: {len(failed)} problems failed: fix the cause, then {again} to retry only them", err=True)
        sys.exit(EXIT_FAILED)


def _abandon(parts: Parts | None, run_id: str, progress: Any, state: str) -> None:
    """Best effort: record the run as not running any more, so `farm status` does not show it running."""
    from farm_coordinator.runlog import RedisRunLog

    runlog = parts.runlog if parts is not None else None
    if not isinstance(runlog, RedisRunLog):  # the embedded farm keeps no run log
        return
    try:
        counts = progress.counts
        runlog.update(run_id, counts.groups, counts.settled.get("published", 0), state=state)
        runlog.client.expire(runlog.settings.run_key(run_id), int(runlog.settings.result_ttl))
    except Exception:  # the server that failed the run may be the one holding the run log
        pass


@main.command(epilog=ENVIRONMENT)
@click.option("--device", help="cuda:N, cpu:N or replay:PATH[#N] (a Kernel Tuner cache file served as the device; "
              "docs/farm.md, Replay workers); required unless --compile")
@_broker(required=True)
@_redis(required=True)
@click.option("--kernels", "kernels", multiple=True, help=KERNELS_HELP)
@click.option("--loglevel", type=click.Choice(LEVELS, case_sensitive=False), default="INFO", show_default=True)
@click.option("--log-json", is_flag=True, help="Log JSON lines on stderr instead of text.")
@click.option("--cores", help="Cores this worker owns: a count (2: cpu:N takes the Nth block of 2) or a CPU list "
              "(0-3, 0,2); every thread pool is limited to them. Default: CPU N alone (cpu:N).")
@click.option("--compile", "compile_queue", is_flag=True, help="Serve the compile queue instead (NVRTC on this "
              "machine's CPU cores, no GPU: farm compile --broker); --cores is then the process count.")
def worker(device: str | None, broker: str, redis_url: str, kernels: tuple[str, ...], loglevel: str, log_json: bool,
           cores: str | None, compile_queue: bool) -> None:
    """Run one worker process pinned to DEVICE (or, with --compile, a compile worker)."""
    from farm_workers.worker import run_worker

    setup_logging(loglevel, log_json)
    with errors():
        _check(broker, redis_url)
        if compile_queue:
            import os

            from farm_workers.compile import run_compile_worker

            count = int(cores) if cores and cores.isdigit() else len(os.sched_getaffinity(0))
            sys.exit(run_compile_worker(Settings.from_env(broker_url=broker, redis_url=redis_url), count,
                                        loglevel.upper()))
        if device is None:
            raise click.UsageError("--device is required (or --compile)")
        check_device(device, cores)  # bad usage is reported before any server is asked
        settings = Settings.from_env(broker_url=broker, redis_url=redis_url)
        sys.exit(run_worker(device, settings, kernels, loglevel.upper(), cores=cores,
                            check_servers=lambda: reachable(settings)))


@main.command(epilog=ENVIRONMENT)
@_redis(required=True)
@_broker(help="Broker URL (a Redis one adds queue depths).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts (numbers as numbers) instead of tables.")
def status(redis_url: str, broker: str | None, as_json: bool) -> None:
    """Workers per fingerprint and their state, queue depths, decisions, and tuning runs with progress."""
    from farm.stores.redis import connect
    from farm_coordinator.status import collect, render

    with errors():
        _check(broker, redis_url)
        settings = Settings.from_env(redis_url=redis_url, broker_url=broker)
        try:
            client = connect(redis_url, timeout=5.0)
            broker_client = connect(broker, timeout=5.0) if broker and broker.startswith("redis") else None
            data = collect(client, settings, broker_client)
        except Exception as e:  # redis-py's connection errors share no base class with OSError
            if type(e).__module__.startswith("redis") or isinstance(e, OSError):
                raise FarmError(f"cannot reach Redis: {e}") from e
            raise
    if as_json:
        click.echo(json.dumps(numbers(data), indent=1, sort_keys=True))
    else:
        _console().print(render(data))


@main.command(epilog=ENVIRONMENT)
@_redis(required=True)
@click.argument("problem_id")
@click.argument("candidate", required=False)
def unban(redis_url: str, problem_id: str, candidate: str | None) -> None:
    """Lift the fleet's ban of CANDIDATE (default: every banned candidate) for PROBLEM_ID (`farm status` lists
    them): later runs of the problem may try and choose it again."""
    from farm.stores.redis import connect
    from farm_coordinator.bans import RedisBans

    with errors():
        settings = Settings.from_env(redis_url=redis_url)
        client = connect(redis_url, timeout=5.0)
        bans = RedisBans(client, settings)
        lifted = sum(bans.lift(str(digest), problem_id, candidate) for digest in client.hkeys(settings.fingerprints_key))
        if not lifted:
            raise FarmError(f"no ban of {candidate or 'any candidate'} for problem {problem_id} (see `farm status`)")
    click.echo(f"{lifted} ban(s) lifted for problem {problem_id}")


NUMERIC = {"pid": int, "updated": float, "started": float, "groups": int, "done": int, "published": int,
           "partial": int}


def numbers(data: Any) -> Any:
    """The status with the numbers Redis hands back as text (pid, times, counts) turned into JSON numbers."""
    if isinstance(data, list):
        return [numbers(item) for item in data]
    if not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        if key in NUMERIC and isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = NUMERIC[key](float(value)) if NUMERIC[key] is int else float(value)
        out[key] = numbers(value)
    return out


@main.command()
@click.option("--archive", "archive", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="An archive directory (one <digest>/ folder or a folder of them).")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The HTML file to write.")
@click.option("--title", help="The page title (default: names the archive and its device models).")
@click.option("--kernels", "kernels", multiple=True, help=KERNELS_HELP + " Labels their workloads as `farm tune` does.")
@click.option("--catalog", type=click.Path(dir_okay=False, path_type=Path), help="Weigh each problem's saving by "
              "this catalog's weights (default: 1 each). See docs/farm.md, The run budget.")
def report(archive: Path, out: Path, title: str | None, kernels: tuple[str, ...], catalog: Path | None) -> None:
    """Write a self-contained HTML report of an archive's decisions: why each kernel won, and what the searches
    bought (the fleet time saved per hour, weighted)."""
    from farm_coordinator.report import catalog_weights, write_report

    bought: list[str] = []
    with errors():
        weights = catalog_weights(catalog, kernels) if catalog is not None else None
        count = write_report(archive, out, title, kernels, weights, bought)
    for line in bought:
        click.echo(line)
    click.echo(f"{count} problems written to {out}")


@main.command(context_settings={"ignore_unknown_options": True}, epilog=ENVIRONMENT)
@_broker(required=True, help="The farm's Celery broker URL.")
@click.option("--address", default="127.0.0.1", show_default=True)
@click.option("--port", default=5555, show_default=True, type=int)
@click.option("--basic-auth-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A file holding user:password[,user:password] (default: FARM_FLOWER_BASIC_AUTH).")
@click.argument("flower_args", nargs=-1, type=click.UNPROCESSED)
def flower(broker: str, address: str, port: int, basic_auth_file: Path | None, flower_args: tuple[str, ...]) -> None:
    """Run Flower against the farm's broker, with basic authentication required.

    Credentials come from FARM_FLOWER_BASIC_AUTH or --basic-auth-file, never from the command line (where `ps`
    would show them); authentication options among Flower's own arguments are refused."""
    from farm_workers.flower import credentials, run_flower

    with errors():
        _check(broker, None)
        sys.exit(run_flower(broker, address, port, credentials(basic_auth_file), flower_args))


@main.command(epilog=ENVIRONMENT)
@_redis(required=True)
@_broker(help="Broker URL (a Redis one adds queue depths).")
@click.option("--address", default="127.0.0.1", show_default=True)
@click.option("--port", default=9808, show_default=True, type=int)
def metrics(redis_url: str, broker: str | None, address: str, port: int) -> None:
    """Serve the farm's Prometheus metrics on http://ADDRESS:PORT/metrics (docs/farm.md, Metrics)."""
    from farm_coordinator.metrics import serve

    with errors():
        _check(broker, redis_url)
        serve(Settings.from_env(redis_url=redis_url, broker_url=broker), address, port)


from farm_cli import archive as _archive  # noqa: E402  (registers `farm archive`)

main.add_command(_archive.archive)

from farm_cli import keys as _keys  # noqa: E402  (registers `farm keys`)

main.add_command(_keys.keys)

from farm_cli import compile as _compile  # noqa: E402  (registers `farm compile`)

main.add_command(_compile.compile_command)

from farm_cli import catalog as _catalog  # noqa: E402  (registers `farm catalog`)

main.add_command(_catalog.catalog)

if __name__ == "__main__":
    main()

__all__ = ["EXIT_INTERRUPTED", "celery_parts", "embedded_parts", "main"]
