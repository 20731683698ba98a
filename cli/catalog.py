"""``farm catalog``: tools for catalogs. ``farm catalog weights FILE --catalog CATALOG`` imports how much fleet time
each workload is worth (coordinator/weights.py, docs/catalog.md "Weights")."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import click

from farm_cli.errors import EXIT_FAILED, errors

KERNELS_HELP = ("Import operations from this module (repeatable), as `farm tune --kernels` does: the catalog's "
                "operations must load.")


@click.group()
def catalog() -> None:
    """Catalog tools (docs/catalog.md)."""


@catalog.command("weights")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--catalog", "catalog_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The catalog whose workloads the rows weight.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The weights file to write (default: the one the catalog's [weights] table names, else "
                   "CATALOG's name with .weights.json, beside it).")
@click.option("--strict", is_flag=True, help="Rows the catalog does not have are an error (exit 1, nothing written).")
@click.option("--kernels", "kernels", multiple=True, help=KERNELS_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print what was imported as JSON.")
def weights(file: Path, catalog_path: Path, out: Path | None, strict: bool, kernels: tuple[str, ...],
            as_json: bool) -> None:
    """Import workload weights from FILE, a CSV or Parquet table of (operation, workload, calls[,
    seconds_per_call]) rows: weight = calls x seconds_per_call (calls alone without it). Writes the weights file
    and, when the catalog names none, adds `[weights] file = "..."` to the catalog so `farm tune` uses them."""
    from farm_coordinator.catalog import load_catalog, workload_label
    from farm_coordinator.weights_import import match, read_rows, write_weights

    with errors():
        table = _weights_table(catalog_path)
        cat = load_catalog(catalog_path, kernels, weights=False)  # its weights file may be missing or stale
        imported = match(cat.workloads, read_rows(file), str(file))
        named = table.get("file") if isinstance(table, dict) else None
        target = out or (catalog_path.parent / named if isinstance(named, str) else
                         catalog_path.with_name(f"{catalog_path.stem}.weights.json"))
        unknown = len(imported.unknown_operations) + len(imported.unknown_workloads)
        if strict and unknown:
            _print(imported, catalog_path, None, "", as_json, workload_label)
            click.echo(f"farm: error: {unknown} row(s) of {file} name workloads {catalog_path} does not have "
                       f"(--strict): nothing written", err=True)
            sys.exit(EXIT_FAILED)
        write_weights(target, imported)
        linked = _link(catalog_path, target, named)
        _print(imported, catalog_path, target, linked, as_json, workload_label)


def _weights_table(catalog_path: Path) -> Any:
    """The catalog's [weights] table (None without one); the catalog itself is validated by load_catalog."""
    try:
        return tomllib.loads(catalog_path.read_text(encoding="utf-8")).get("weights")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # load_catalog says what is wrong with it


def _link(catalog_path: Path, target: Path, named: Any) -> str:
    """Make the catalog read ``target``: add a [weights] table when it has none (appended: the rest of the file is
    kept byte for byte, written atomically); a line saying what the catalog reads."""
    from farm.atomicfile import write_atomic

    relative = _relative(target, catalog_path.parent)
    if named is None:
        text = catalog_path.read_text(encoding="utf-8")
        added = f'{"" if not text or text.endswith(chr(10)) else chr(10)}\n[weights]\nfile = {json.dumps(relative)}\n'
        tomllib.loads(text + added)  # still one valid TOML document
        write_atomic(catalog_path, (text + added).encode())
        return f'added [weights] file = {json.dumps(relative)} to {catalog_path}'
    if (catalog_path.parent / str(named)).resolve() != target.resolve():
        return f'note: {catalog_path} reads [weights] file = {json.dumps(named)}, not {target}: edit it to use these'
    return f"{catalog_path} reads it ([weights] file = {json.dumps(named)})"


def _relative(target: Path, folder: Path) -> str:
    try:
        return target.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return str(target.resolve())


def _print(imported: Any, catalog_path: Path, target: Path | None, linked: str, as_json: bool, label: Any) -> None:
    unknown = ([{"row": r.row, "operation": r.operation, "workload": r.workload, "reason": "unknown operation"}
                for r in imported.unknown_operations]
               + [{"row": r.row, "operation": r.operation, "workload": r.workload, "reason": "unknown workload"}
                  for r in imported.unknown_workloads])
    unknown.sort(key=lambda u: u["row"])
    unweighted = [{"operation": w.operation, "workload": label(w.operation, w.spec), "where": w.where,
                   "weight": w.weight} for w in imported.unweighted]
    if as_json:
        click.echo(json.dumps({"file": str(target) if target else None, "rows": imported.rows,
                               "weighted": [w.to_dict() for w in imported.weighted], "not_in_catalog": unknown,
                               "unweighted": unweighted}, indent=1, sort_keys=True))
        return
    total = sum(w.weight for w in imported.weighted) or 1.0
    click.echo(f"{imported.rows} row(s) of {imported.source}: {len(imported.weighted)} workload(s) of "
               f"{catalog_path} weighted, {len(unknown)} not in it")
    top = sorted(imported.weighted, key=lambda w: -w.weight)
    for w in top[:10]:
        click.echo(f"  {w.weight:>12.6g}  {100 * w.weight / total:5.1f} %  {w.operation} {w.label}")
    if len(top) > 10:
        click.echo(f"  ... and {len(top) - 10} more")
    for u in unknown:
        click.echo(f"row {u['row']}: {u['reason']}: {u['operation']} {u['workload']} (not in {catalog_path})")
    if unweighted:
        names = ", ".join(f"{u['operation']} {u['workload']} ({u['weight']:g})" for u in unweighted[:5])
        more = f" and {len(unweighted) - 5} more" if len(unweighted) > 5 else ""
        click.echo(f"{len(unweighted)} workload(s) of the catalog have no row and keep their catalog weight "
                   f"(default 1): {names}{more}")
    if target is not None:
        click.echo(f"wrote {target} ({len(imported.weighted)} weights); {linked}")
