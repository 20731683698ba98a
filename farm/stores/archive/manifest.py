"""An archive's folders and its manifest, checked before anything else is read: what the runtime's archive tier
(``farm.stores.archive.store``) and every tool reading an archive open first.

The fields: docs/archives.md, "manifest.json". Schema 1, which predates signatures, is refused with one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from farm.environment import fingerprint_digest
from farm.stores.archive.files import read_regular
from farm.stores.archive.schema import DATA_FILES, MANIFEST_FILE, READABLE_VERSIONS, ArchiveError
from farm.stores.archive.signing import Trust

MAX_MANIFEST_BYTES = 1 << 20


class Manifest(dict[str, Any]):
    """A checked manifest.json; ``signer``: the key id whose signature of it was verified (None: not checked, or
    an unsigned archive accepted for development)."""

    signer: str | None = None


def is_archive(path: Path) -> bool:
    return os.path.lexists(path / MANIFEST_FILE)


def archive_folders(path: Path | str) -> list[Path]:
    """``path`` itself when it is one archive (holds manifest.json), else every archive folder directly inside it
    (hidden temp folders skipped), sorted. ArchiveError when the path is missing or holds no archive."""
    path = Path(path)
    if not path.is_dir():
        raise ArchiveError(f"{path}: no such archive directory")
    if is_archive(path):
        return [path]
    found = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".") and is_archive(p))
    if not found:
        raise ArchiveError(f"{path}: holds no archive (no {MANIFEST_FILE} in it or in its folders)")
    return found


def read_manifest(folder: Path, trust: Trust | None = None) -> Manifest:
    """Parse and check manifest.json (and first, given ``trust``, its signature on the very bytes parsed);
    ArchiveError naming the file and field otherwise."""
    path = folder / MANIFEST_FILE
    raw = read_regular(path, limit=MAX_MANIFEST_BYTES)
    signer = trust.check(folder, raw) if trust is not None else None
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ArchiveError(f"{path}: not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise ArchiveError(f"{path}: a {type(data).__name__}, not an object")
    version = data.get("schema_version")
    if version == 1 and not isinstance(version, bool):
        raise ArchiveError(f"{path}: archive schema 1 predates signatures; export it again from its source")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise ArchiveError(f"{path}: field 'schema_version' = {version!r}: this farm reads archive schema "
                           f"version {' and '.join(map(str, READABLE_VERSIONS))} only")
    fingerprint = data.get("fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise ArchiveError(f"{path}: field 'fingerprint' = {fingerprint!r}: must be the fingerprint text")
    digest = fingerprint_digest(fingerprint)
    if data.get("digest") != digest:
        raise ArchiveError(f"{path}: field 'digest' = {data.get('digest')!r} is not the digest of field "
                           f"'fingerprint' ({digest})")
    if folder.name != digest:
        raise ArchiveError(f"{path}: the folder is named {folder.name!r}, not after its fingerprint digest {digest}")
    rows = data.get("rows")
    if not isinstance(rows, dict):
        raise ArchiveError(f"{path}: field 'rows' = {rows!r}: must be an object")
    for name in ("decisions", "trials"):
        n = rows.get(name)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ArchiveError(f"{path}: field 'rows.{name}' = {n!r}: must be a count")
    sums = data.get("sha256")
    if not isinstance(sums, dict):
        raise ArchiveError(f"{path}: field 'sha256' = {sums!r}: must be an object")
    for name in DATA_FILES:
        value = sums.get(name)
        if not (isinstance(value, str) and len(value) == 64):
            raise ArchiveError(f"{path}: field 'sha256.{name}' = {value!r}: must be a sha256 hex digest")
    sizes = data.get("bytes")
    if not (isinstance(sizes, dict) and all(isinstance(sizes.get(n), int) and not isinstance(sizes.get(n), bool)
                                            and sizes[n] >= 0 for n in DATA_FILES)):
        raise ArchiveError(f"{path}: field 'bytes' = {sizes!r}: must hold the byte count of each file")
    manifest = Manifest(data)
    manifest.signer = signer
    return manifest
