"""Signing archives: the farm's Ed25519 key pair and the signature of an archive's ``manifest.json``
(docs/archives.md, "Signatures"); checking signatures is the core's (``farm.stores.archive.signing``).

A private key is a PKCS#8 PEM file that only its owner may read (mode 0600, written so by :func:`generate_keys`,
refused otherwise by :func:`load_signing_key`). ``cryptography`` is imported lazily.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.atomicfile import fsync_directory
from farm.errors import FarmError
from farm.stores.archive.signing import SIGNED_PREFIX, signature_text
from farm.trustedkeys import PublicKey

SIGNING_KEY_ENV = "FARM_SIGNING_KEY"


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
