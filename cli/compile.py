"""``farm compile``: the compile stage of a catalog's CUDA spaces, ahead of any GPU (farm_kernels.cuda.compile)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from farm_cli.errors import errors

KERNELS_HELP = "Import operations from this module (repeatable), as for farm tune."


@click.command("compile")
@click.argument("catalog", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--arch", required=True, help="The architecture to compile for (a fingerprint's: sm_80, sm_90).")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Kernel cache directory (default: $FARM_KERNEL_CACHE or ~/.cache/farm/kernels).")
@click.option("--redis", "redis_url", help="Store kernels in this Redis (the fleet's kernel cache) instead.")
@click.option("--broker", envvar="FARM_BROKER_URL", help="With --redis: compile on the fleet's compile queue "
              "(farm worker --compile) instead of this machine.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Fleet compile: seconds to wait.")
@click.option("--export", "export_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the catalog's kernels (cubins and verdicts) to this Parquet file for another site.")
@click.option("--processes", type=click.IntRange(min=1), help="Compile processes (default: the CPU cores).")
@click.option("--kernels", "kernels", multiple=True, help=KERNELS_HELP)
@click.option("--json", "as_json", is_flag=True,
              help='Print {"configs", "compiled", "cached", "infeasible", "failed", "seconds"} as JSON.')
def compile_command(catalog: Path, arch: str, cache_dir: Path | None, redis_url: str | None, broker: str | None,
                    timeout: float, export_path: Path | None, processes: int | None, kernels: tuple[str, ...],
                    as_json: bool) -> None:
    """Compile every config of CATALOG's CUDA spaces for ARCH with NVRTC on this machine's cores, prune those
    that exceed the architecture's resources, and store cubins and verdicts in the kernel cache."""
    from farm_coordinator.catalog import load_catalog
    from farm_kernels import registry
    from farm_kernels.cuda.compile import check_arch, ensure_compiled
    from farm_kernels.cuda.kcache import open_cache

    with errors():
        if cache_dir is not None and redis_url:
            raise click.UsageError("--cache-dir and --redis name two caches: give one")
        check_arch(arch)  # before the catalog: a typo in --arch is the first thing said
        loaded = load_catalog(catalog, kernels)
        names = dict.fromkeys(w.operation for w in loaded.workloads if "cuda" in w.devices)
        sets = [s for s in (registry.get(n).cuda for n in names) if s is not None]
        cache = open_cache(cache_dir, redis_url)
        if broker:
            if not redis_url:
                raise click.UsageError("--broker compiles on the fleet, whose kernel cache is --redis: give both")
            from farm_coordinator.compilefleet import compile_on_fleet
            from farm_fleet.settings import Settings
            from farm_kernels.cuda.compile import jobs_for

            summary = compile_on_fleet(jobs_for(sets, arch), Settings.from_env(broker_url=broker, redis_url=redis_url),
                                       timeout, cache)
        else:
            summary = ensure_compiled(sets, arch, cache, processes or len(os.sched_getaffinity(0)))
        if export_path is not None:
            from farm_kernels.cuda.karchive import export_kernels

            export_kernels(cache, summary.keys, export_path)
        if as_json:
            click.echo(json.dumps(summary.to_json()))
            return
        click.echo(f"{summary.configs} configs for {arch}: {summary.compiled} compiled, {summary.cached} cached, "
                   f"{summary.infeasible} infeasible, {summary.failed} failed in {summary.seconds:.1f} s "
                   f"(cache {cache.describe()})")
        for candidate, reason in summary.rejected().items():
            click.echo(f"  {candidate}: {reason.splitlines()[0]}")
