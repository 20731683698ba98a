"""``farm keys``: the farm's Ed25519 signing key pair for archives (docs/archives.md, "Signatures")."""

from __future__ import annotations

from pathlib import Path

import click

from farm_cli.errors import errors


@click.group()
def keys() -> None:
    """The Ed25519 key pair that signs archive manifests (docs/archives.md, "Signatures")."""


@keys.command("init")
@click.option("--dir", "--out", "directory", default="farm-keys", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Where to write NAME.key (private, mode 0600; a new directory gets mode 0700) and NAME.pub.")
@click.option("--name", default="farm", show_default=True, help="The key's file name and comment.")
def keys_init(directory: Path, name: str) -> None:
    """Create a new key pair; an existing key is never overwritten."""
    from farm_archives.signing import generate_keys

    with errors():
        private, public, key = generate_keys(directory, name)
        ignored = _keep_out_of_git(directory)
    click.echo(f"created key {key.key_id}: private key {private.resolve()} (mode 0600: sign with `farm archive "
               f"export --signing-key {private}`), public key {public} (trust it with FARM_TRUSTED_KEYS={public})")
    if ignored is not None:
        click.echo(f"{directory} is inside a git working tree: {ignored} keeps its private keys (*.key) out of "
                   f"commits; keep the key outside the tree (--dir) to be safe")
    click.echo(key.line())


GITIGNORE = "# private signing keys never go into git (written by farm keys init)\n*.key\n"


def _keep_out_of_git(directory: Path) -> Path | None:
    """In a git working tree, ``directory/.gitignore`` ignoring ``*.key`` (so ``git add .`` never stages a private
    key, whatever the repository's own .gitignore says); the file, or None outside a working tree."""
    here = directory.resolve()
    if not any((parent / ".git").exists() for parent in (here, *here.parents)):
        return None
    ignore = directory / ".gitignore"
    text = ignore.read_text() if ignore.exists() else ""
    if "*.key" not in text.splitlines():
        ignore.write_text(text + ("" if not text or text.endswith("\n") else "\n") + GITIGNORE)
    return ignore


@keys.command("show")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def keys_show(path: Path) -> None:
    """Print the key id and public key line of PATH: a private key, or a file of public keys."""
    from farm.stores.archive.signing import read_trusted_keys
    from farm_archives.signing import load_signing_key

    with errors():
        text = path.read_bytes()[:64] if path.is_file() else b""
        found = (load_signing_key(path).public,) if b"PRIVATE KEY" in text else read_trusted_keys(path)
    for key in found:
        click.echo(f"{key.key_id} {key.line()}")
