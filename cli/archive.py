"""``farm archive``: Parquet archives of decisions: export, import, inspect, merge, diff (docs/archives.md)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from farm.errors import FarmError
from farm_cli.errors import REDIS_SCHEMES, check_url, errors
from farm_fleet.settings import Settings

REDIS_HELP = "{} this Redis URL (the farm's decisions database); default FARM_REDIS_URL unless {} is given."


@click.group()
def archive() -> None:
    """Parquet archives of decisions: export, import, inspect, merge, diff (docs/archives.md)."""


@contextlib.contextmanager
def _archive_errors() -> Iterator[None]:
    """Farm errors, and an unreachable Redis or unwritable directory, as one line and exit status 2. Commands that
    need only files never import redis (it is an optional extra): its errors are caught only once it is loaded."""
    with errors():
        try:
            yield
        except Exception as error:
            redis = sys.modules.get("redis")
            if isinstance(error, OSError) or (redis is not None and isinstance(error, redis.RedisError)):
                raise FarmError(f"{type(error).__name__}: {error}") from error
            raise


def _archive_redis(url: str) -> Any:
    from farm.stores.redis import RedisDecisions, connect

    check_url(url, "Redis", "--redis", "FARM_REDIS_URL", REDIS_SCHEMES)
    # A whole archive is one transaction: allow the server time to apply it.
    return RedisDecisions(client=connect(url, timeout=600.0), settings=Settings.from_env(redis_url=url))


def _redis_source(ctx: click.Context, redis_url: str | None, other: Any) -> str | None:
    """FARM_REDIS_URL stands in for --redis only when the other source was not given on the command line."""
    if other is not None and ctx.get_parameter_source("redis_url") is ParameterSource.ENVIRONMENT:
        return None
    return redis_url


def _one_source(**given: Any) -> None:
    options = {f"--{k.replace('_', '-')}": v for k, v in given.items()}
    named = [k for k, v in options.items() if v is not None]
    if len(named) != 1:
        raise FarmError(f"give exactly one of {' or '.join(options)}" + (f" (got {' and '.join(named)})" if named else ""))


def _signing_option(f: Any) -> Any:
    return click.option("--signing-key", "--key", "signing_key", type=click.Path(dir_okay=False, path_type=Path),
                        envvar="FARM_SIGNING_KEY", show_envvar=True, help="Sign each archive's manifest with this private key (`farm keys "
                                               "init`). Without one the archives are UNSIGNED, which importers "
                                               "refuse.")(f)


def _trust_options(f: Any) -> Any:
    f = click.option("--allow-unsigned", is_flag=True,
                     help="Accept UNSIGNED archives (development only; each is reported). A bad signature or an "
                          "untrusted key is refused even so. FARM_ALLOW_UNSIGNED=1 does the same.")(f)
    return click.option("--trusted-keys", envvar="FARM_TRUSTED_KEYS", show_envvar=True,
                        help="The public keys whose archives are accepted: a file of key lines (`farm keys init` "
                             "writes NAME.pub), or the key lines themselves, comma-separated.")(f)


def _signer(path: Path | None) -> Any:
    """The signing key of ``path``; None without one (the command then warns: ``_unsigned_written``)."""
    from farm_archives.signing import load_signing_key

    return None if path is None else load_signing_key(path)


def _unsigned_written(signer: Any) -> None:
    if signer is None:
        click.echo("farm: warning: no signing key (--signing-key / FARM_SIGNING_KEY): the archives were written "
                   "UNSIGNED, and importers refuse them without --allow-unsigned", err=True)


def _trust(trusted_keys: str | None, allow_unsigned: bool) -> Any:
    from farm.stores.archive import Trust

    if allow_unsigned:
        click.echo("farm: warning: --allow-unsigned: UNSIGNED archives are accepted: for development only, never "
                   "for a fleet", err=True)
    return Trust.from_env(trusted_keys=trusted_keys or "", allow_unsigned=allow_unsigned)


def _report_unsigned(archives: Any) -> None:
    from farm.stores.archive.signing import UNSIGNED_WARNING

    for a in archives:
        if a.signer is None:
            click.echo(f"farm: warning: {UNSIGNED_WARNING.format(folder=a.path)}", err=True)


def _console() -> Any:
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160)


@archive.command("export")
@click.option("--redis", "redis_url", envvar="FARM_REDIS_URL", show_envvar=True,
              help=REDIS_HELP.format("Export from", "--from-cache"))
@click.option("--from-cache", type=click.Path(file_okay=False, path_type=Path),
              help="Export from a local cache directory (the embedded farm's --cache-dir) instead.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Archive directory: one <fingerprint digest>/ folder is written per fingerprint.")
@click.option("--fingerprint", help="Only this fingerprint (digest, digest prefix or full text).")
@_signing_option
@click.pass_context
def archive_export(ctx: click.Context, redis_url: str | None, from_cache: Path | None, out: Path,
                   fingerprint: str | None, signing_key: Path | None) -> None:
    """Write the decisions of every fingerprint (or one) to OUT/<digest>/, atomically per fingerprint, each
    archive's manifest signed with --signing-key."""
    from farm_archives.export import export_cache, export_redis

    redis_url = _redis_source(ctx, redis_url, from_cache)
    with _archive_errors():
        _one_source(redis=redis_url, from_cache=from_cache)
        signer = _signer(signing_key)
        if redis_url is not None:
            redis = _archive_redis(redis_url)
            try:
                results = export_redis(redis, out, fingerprint, signer=signer)
            finally:
                redis.client.close()
        else:
            assert from_cache is not None
            results = export_cache(from_cache, out, fingerprint, signer=signer)
    for r in results:
        w = r.written
        click.echo(f"exported {w.decisions} decisions ({w.trials} trial rows) of fingerprint {r.digest} to {w.path} "
                   f"({w.bytes} bytes, {'signed by key ' + signer.key_id if signer else 'UNSIGNED'})")
        for key_id, count in sorted(r.provenance.items()):
            click.echo(f"  {count} of them imported from archives signed by key {key_id} (manifest 'provenance')")
        for reason in r.skipped:
            click.echo(f"farm: warning: skipped decision {reason}", err=True)
    if not results:
        click.echo("no fingerprints to export")
    else:
        _unsigned_written(signer)


@archive.command("import")
@click.argument("archive_dir", type=click.Path(path_type=Path))
@click.option("--redis", "redis_url", envvar="FARM_REDIS_URL", show_envvar=True,
              help=REDIS_HELP.format("Import into", "--into-cache"))
@click.option("--into-cache", type=click.Path(file_okay=False, path_type=Path),
              help="Import into this local cache directory (a runtime's cache_directory) instead.")
@click.option("--fingerprint", help="With --redis: the target fingerprint (digest, prefix or full text); "
                                    "default: each archive's own.")
@click.option("--device", default="cpu:0", show_default=True,
              help="With --into-cache: the device (cpu:N, cuda:N) whose runtime fingerprint the archive must match.")
@click.option("--force", is_flag=True, help="For the rare case where an archive's measurements are known to hold "
                                            "under another fingerprint: import despite a fingerprint mismatch, "
                                            "re-keying every decision to the target fingerprint (they were measured "
                                            "in the archive's regime; the refusal names the fields that differ and "
                                            "the usual fix). Never overrides a corrupt archive.")
@_trust_options
@click.pass_context
def archive_import(ctx: click.Context, archive_dir: Path, redis_url: str | None, into_cache: Path | None,
                   fingerprint: str | None, device: str, force: bool, trusted_keys: str | None,
                   allow_unsigned: bool) -> None:
    """Import ARCHIVE_DIR (one archive folder or a folder of them): every signature is checked against the trusted
    keys and everything verified first, then all of it is written at once, or nothing is."""
    from farm_archives.imports import import_cache, import_redis, load_archives

    redis_url = _redis_source(ctx, redis_url, into_cache)
    with _archive_errors():
        _one_source(redis=redis_url, into_cache=into_cache)
        archives = load_archives(archive_dir, _trust(trusted_keys, allow_unsigned))
        _report_unsigned(archives)
        if redis_url is not None:
            redis = _archive_redis(redis_url)
            try:
                results = import_redis(archives, redis, fingerprint, force)
            finally:
                redis.client.close()
            where = "Redis"
        else:
            assert into_cache is not None
            if fingerprint is not None:
                raise FarmError("--fingerprint applies to --redis; with --into-cache the target is --device's")
            from farm.environment import runtime_environment
            from farm.runtimes import client_for

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
            measured = "" if r.differences is None else (f" (measured with {r.differences[0]}; filed under "
                                                         f"{r.differences[1]})")
            click.echo(f"farm: warning: fingerprint check overridden by --force: archive {r.digest} was re-keyed to "
                       f"fingerprint {r.target_digest}{measured}", err=True)
        for note in r.notes:
            click.echo(f"farm: warning: {note}", err=True)


@archive.command("inspect")
@click.argument("archive_dir", type=click.Path(path_type=Path))
@click.option("--operation", help="Only decisions of this operation (an error if the archive has none).")
@click.option("--json", "as_json", is_flag=True, help="Print the decisions as JSON instead of a table.")
def archive_inspect(archive_dir: Path, operation: str | None, as_json: bool) -> None:
    """Verify ARCHIVE_DIR and show its decisions."""
    from farm_archives.operations import inspect_rows, inspect_table, read_archives
    from farm_coordinator.catalog import workload_label

    with _archive_errors():
        archives = read_archives(archive_dir)
        rows = inspect_rows(archives, None)
        if operation is not None:
            known = sorted({r["operation"] for r in rows})
            if operation not in known:
                raise FarmError(f"--operation {operation!r}: {archive_dir} has no decisions of it (operations: "
                                f"{', '.join(known) or 'none'})")
            rows = [r for r in rows if r["operation"] == operation]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    else:
        _console().print(inspect_table(archives, rows, workload_label))


@archive.command("merge")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@_signing_option
@_trust_options
def archive_merge(out: Path, inputs: tuple[Path, ...], signing_key: Path | None, trusted_keys: str | None,
                  allow_unsigned: bool) -> None:
    """Merge archives of one fingerprint into OUT/<digest>/ under the replacement rule. A signed merge vouches for
    its inputs: each must then be signed by a trusted key (or be allowed unsigned)."""
    from farm_archives.operations import merge_archives

    with _archive_errors():
        if len(inputs) < 2:
            raise FarmError("merge needs OUT and at least two archives")
        signer = _signer(signing_key)
        trust = _trust(trusted_keys, allow_unsigned) if signer is not None or trusted_keys or allow_unsigned else None
        result = merge_archives(inputs, out, signer=signer, trust=trust)
    w = result.written
    click.echo(f"merged {result.inputs} archives ({result.decisions_in} decisions) into {w.path}: {w.decisions} "
               f"decisions, {result.replaced} replaced under the replacement rule, {w.trials} trial rows")
    _unsigned_written(signer)


@archive.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON instead of a table.")
def archive_diff(a: Path, b: Path, as_json: bool) -> None:
    """What changed from archive A to archive B: new, dropped and changed winners, and the same winners with
    another ratio, verification or confirmation (a new creation time alone is no change)."""
    from farm_archives.operations import diff_archives, diff_table
    from farm_coordinator.catalog import workload_label

    with _archive_errors():
        diff = diff_archives(a, b)
    if as_json:
        click.echo(json.dumps(diff.to_json(), indent=1))
    else:
        _console().print(diff_table(diff, workload_label))
