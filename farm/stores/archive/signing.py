"""Signed archives: Ed25519 signatures of ``manifest.json`` (docs/archives.md, "Signatures").

The manifest holds the sha256 and size of every data file, so one signature over its exact bytes covers the whole
archive: a changed byte in a data file fails its sha256, one in the manifest fails the signature, one in the
signature file fails its strict format or the signature. The signature is the file ``manifest.sig`` beside the
manifest: the canonical JSON of ``{"algorithm": "ed25519", "key": <key id>, "signature": <base64>}`` and a newline,
nothing else (any other spelling of it is refused). The signed message is ``SIGNED_PREFIX`` followed by the
manifest's bytes, so a farm signature can never be replayed as a signature of anything else.

A public key is one line, ``farm-ed25519 <base64 of the 32 raw bytes> [comment]`` (``farm.trustedkeys``); its key
id is the first 16 hex digits of the sha256 of the raw bytes. A private key is a PKCS#8 PEM file that only its owner may read (mode 0600,
written so by :func:`generate_keys`, refused otherwise by :func:`load_signing_key`). ``cryptography`` is imported
lazily: ``import farm`` never needs it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.atomicfile import fsync_directory
from farm.errors import ArchiveError, FarmError
from farm.trustedkeys import KEY_TYPE, PublicKey, parse_trusted_keys

SIGNATURE_FILE = "manifest.sig"
SIGNED_PREFIX = b"farm archive manifest v1\n"
MAX_SIGNATURE_BYTES = 4096
TRUSTED_KEYS_ENV = "FARM_TRUSTED_KEYS"
ALLOW_UNSIGNED_ENV = "FARM_ALLOW_UNSIGNED"
SIGNING_KEY_ENV = "FARM_SIGNING_KEY"
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
    """Which archives a reader accepts: those signed by one of ``keys``; unsigned ones only with
    ``allow_unsigned`` (development only, and each one is logged as a warning). A bad signature, or a signature
    by a key not in ``keys`` (a revoked key is one removed from the list), is always refused."""

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
        """The key id that signed ``manifest`` (the exact bytes of ``folder``'s manifest.json); None for an
        unsigned archive accepted under ``allow_unsigned`` (the caller says so loudly: ``UNSIGNED_WARNING``).
        ArchiveError naming the file otherwise."""
        from farm.stores.archive.files import read_regular

        path = folder / SIGNATURE_FILE
        if not os.path.lexists(path):
            if self.allow_unsigned:
                return None
            raise ArchiveError(f"{path}: missing: the archive is unsigned and refused (sign archives with `farm "
                               f"archive export --signing-key`; --allow-unsigned accepts them, for development only)")
        key_id, signature = parse_signature(path, read_regular(path, limit=MAX_SIGNATURE_BYTES))
        known = {k.key_id: k for k in self.keys}
        key = known.get(key_id)
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
    try:
        body = json.loads(data)
        key_id, signature = body["key"], base64.b64decode(body["signature"], validate=True)
        exact = body["algorithm"] == "ed25519" and set(body) == {"algorithm", "key", "signature"} and isinstance(
            key_id, str) and len(signature) == 64 and signature_text(key_id, signature) == data
    except (ValueError, KeyError, TypeError, binascii.Error):
        exact = False
    if not exact:
        raise ArchiveError(f"{path}: not a farm signature (expected exactly "
                           f"{{\"algorithm\":\"ed25519\",\"key\":KEY_ID,\"signature\":BASE64}} and a newline)")
    return key_id, signature


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key that signs archive manifests (``write_archive(..., signer=key)``)."""

    private: Any
    public: PublicKey
    path: Path | None = None

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def signature_for(self, manifest: bytes) -> bytes:
        """The manifest.sig bytes for the exact bytes of a manifest.json."""
        return signature_text(self.key_id, self.private.sign(SIGNED_PREFIX + manifest))


def load_signing_key(path: Path | str) -> SigningKey:
    """The private key of a PEM file readable by its owner only; FarmError naming the file otherwise."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    try:
        mode = os.stat(path).st_mode
        data = path.read_bytes()
    except OSError as e:
        raise FarmError(f"{path}: the signing key is unreadable: {e}") from None
    if stat.S_IMODE(mode) & 0o077:
        raise FarmError(f"{path}: mode {stat.S_IMODE(mode):04o}: a signing key must be readable by its owner only "
                        f"(chmod 600 {path})")
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise FarmError(f"{path}: not an unencrypted PEM private key: {e}") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise FarmError(f"{path}: a {type(private).__name__}, not an Ed25519 private key")
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return SigningKey(private, PublicKey(raw, path.stem), path)


def signing_key_from_env(path: Path | str | None = None, env: Mapping[str, str] | None = None) -> SigningKey | None:
    """The key of ``path``, else of ``FARM_SIGNING_KEY``; None when neither is given."""
    env = os.environ if env is None else env
    chosen = path if path is not None else env.get(SIGNING_KEY_ENV) or None
    return None if chosen is None else load_signing_key(chosen)


def generate_keys(directory: Path | str, name: str = "farm") -> tuple[Path, Path, PublicKey]:
    """Create ``directory/NAME.key`` (the private key, mode 0600; a new directory gets mode 0700) and
    ``NAME.pub`` (its public key line, a trusted-keys file of one key). An existing key is never overwritten; each
    file appears complete or not at all."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    directory = Path(directory)
    if not name or "/" in name or name.startswith("."):
        raise FarmError(f"--name {name!r}: a key name is a plain file name")
    private_path, public_path = directory / f"{name}.key", directory / f"{name}.pub"
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise FarmError(f"{path}: exists: a key is never overwritten (remove it first, or choose another --name)")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    public = PublicKey(raw, name)
    _create(private_path, pem, 0o600)
    _create(public_path, (public.line() + "\n").encode(), 0o644)
    fsync_directory(directory)
    return private_path, public_path, public


def _create(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` with ``mode`` from its creation on (no moment with wider permissions), complete or absent:
    written into a temporary name, then linked into place (which fails if the path appeared meanwhile)."""
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        os.fchmod(fd, mode)  # the umask never narrows or widens what the key file needs
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.link(temp, path)
    except FileExistsError:
        raise FarmError(f"{path}: exists: a key is never overwritten") from None
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(temp)
