"""Signed archives, the reading side: Ed25519 signatures of ``manifest.json`` checked against trusted keys
(docs/archives.md, "Signatures"); signing them is the archive tools' (``farm_archives.signing``).

``cryptography`` is imported lazily: ``import farm`` never needs it.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from farm.errors import ArchiveError, FarmError
from farm.stores.archive.files import read_regular
from farm.trustedkeys import KEY_TYPE, PublicKey, parse_trusted_keys

SIGNATURE_FILE = "manifest.sig"
SIGNED_PREFIX = b"farm archive manifest v1\n"  # + the manifest's bytes: never valid for anything else
MAX_SIGNATURE_BYTES = 4096
TRUSTED_KEYS_ENV = "FARM_TRUSTED_KEYS"
ALLOW_UNSIGNED_ENV = "FARM_ALLOW_UNSIGNED"
UNSIGNED_WARNING = ("archive {folder} is UNSIGNED and accepted only because unsigned archives are allowed "
                    "(--allow-unsigned / FARM_ALLOW_UNSIGNED): for development only, never for a fleet")


def read_trusted_keys(path: Path | str) -> tuple[PublicKey, ...]:
    """The keys of a trusted-keys file (FarmError naming the file, or the line, when unusable)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FarmError(f"{path}: the trusted keys file is unreadable: {e}") from None
    return parse_trusted_keys(text, str(path))


@dataclass(frozen=True)
class Trust:
    """Which archives a reader accepts: those signed by one of ``keys`` (to revoke a key, remove it); unsigned
    ones only with ``allow_unsigned`` (development only: each is logged as a warning)."""

    keys: tuple[PublicKey, ...] = ()
    allow_unsigned: bool = False
    source: str = "no trusted keys are configured"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, trusted_keys: str | None = None,
                 allow_unsigned: bool = False) -> Trust:
        """``trusted_keys`` (else ``FARM_TRUSTED_KEYS``): a trusted-keys file, or key lines themselves (separated
        by newlines or commas); ``allow_unsigned`` or ``FARM_ALLOW_UNSIGNED=1``."""
        env = os.environ if env is None else env
        allow = allow_unsigned or env.get(ALLOW_UNSIGNED_ENV, "").strip().lower() in ("1", "true", "yes")
        value = trusted_keys if trusted_keys is not None else env.get(TRUSTED_KEYS_ENV, "")
        if not value.strip():
            return cls((), allow)
        if value.strip().startswith(KEY_TYPE):
            where = TRUSTED_KEYS_ENV if trusted_keys is None else "trusted keys"
            return cls(parse_trusted_keys(value.replace(",", "\n"), where), allow, f"the keys of {where}")
        return cls(read_trusted_keys(value), allow, f"the keys of {value}")

    def check(self, folder: Path, manifest: bytes) -> str | None:
        """The key id that signed ``manifest`` (the exact bytes of ``folder``'s manifest.json), or None for an
        unsigned archive under ``allow_unsigned`` (then log ``UNSIGNED_WARNING``); ArchiveError otherwise."""
        path = folder / SIGNATURE_FILE
        if not os.path.lexists(path):
            if self.allow_unsigned:
                return None
            raise ArchiveError(f"{path}: missing: the archive is unsigned and refused (sign archives with `farm "
                               f"archive export --signing-key`; --allow-unsigned accepts them, for development only)")
        key_id, signature = parse_signature(path, read_regular(path, limit=MAX_SIGNATURE_BYTES))
        key = next((k for k in self.keys if k.key_id == key_id), None)
        if key is None:
            raise ArchiveError(f"{path}: signed by key {key_id}, which is not a trusted key ({self.source}): "
                               f"refused")
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            Ed25519PublicKey.from_public_bytes(key.raw).verify(signature, SIGNED_PREFIX + manifest)
        except InvalidSignature:
            raise ArchiveError(f"{path}: the signature of key {key_id} does not match manifest.json: the archive "
                               f"was modified after it was signed") from None
        return key_id


def signature_text(key_id: str, signature: bytes) -> bytes:
    """The exact bytes of a manifest.sig."""
    body = {"algorithm": "ed25519", "key": key_id, "signature": base64.b64encode(signature).decode()}
    return (json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n").encode()


def parse_signature(path: Path, data: bytes) -> tuple[str, bytes]:
    """(key id, 64-byte signature) of a manifest.sig in its one exact form; ArchiveError naming it otherwise."""
    with suppress(ValueError, KeyError, TypeError):  # binascii.Error and UnicodeDecodeError are ValueErrors
        body = json.loads(data)
        key_id, signature = body["key"], base64.b64decode(body["signature"], validate=True)
        # the one exact text of these three members: any other member, spelling or encoding differs from it
        if isinstance(key_id, str) and len(signature) == 64 and signature_text(key_id, signature) == data:
            return key_id, signature
    raise ArchiveError(f"{path}: not a farm signature (expected exactly "
                       f"{{\"algorithm\":\"ed25519\",\"key\":KEY_ID,\"signature\":BASE64}} and a newline)")
