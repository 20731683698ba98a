"""Public keys of archive signers, as lines of text (``farm-ed25519 <base64> [comment]``; docs/archives.md,
"Signatures"): what a trusted-keys file, ``FARM_TRUSTED_KEYS`` and ``StackPolicy.trusted_keys`` hold. Pure text
handling (no ``cryptography``), so the policy can check its keys without importing the archive package."""

from __future__ import annotations

import base64
import hashlib
from contextlib import suppress
from dataclasses import dataclass

from farm.errors import FarmError

KEY_TYPE = "farm-ed25519"


@dataclass(frozen=True)
class PublicKey:
    """An Ed25519 public key (32 raw bytes) and the comment of its line."""

    raw: bytes
    comment: str = ""

    @property
    def key_id(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()[:16]

    def line(self) -> str:
        """The key's line in a trusted-keys file."""
        text = f"{KEY_TYPE} {base64.b64encode(self.raw).decode()}"
        return f"{text} {self.comment}" if self.comment else text


def parse_public_key(line: str, where: str) -> PublicKey:
    """A ``farm-ed25519 <base64> [comment]`` line; FarmError naming ``where`` and the value otherwise."""
    parts = line.strip().split(None, 2)
    if len(parts) < 2 or parts[0] != KEY_TYPE:
        raise FarmError(f"{where}: {line.strip()[:40]!r} is not a public key (expected '{KEY_TYPE} <base64> "
                        f"[comment]', as `farm keys init` writes it)")
    raw = b""
    with suppress(ValueError):  # binascii.Error included
        raw = base64.b64decode(parts[1], validate=True)
    if len(raw) != 32:
        raise FarmError(f"{where}: {parts[1][:20]!r}… is not the base64 of a 32-byte Ed25519 public key")
    return PublicKey(raw, parts[2].strip() if len(parts) > 2 else "")


def parse_trusted_keys(text: str, where: str) -> tuple[PublicKey, ...]:
    """The keys of a trusted-keys text: one key a line; blank lines and ``#`` comments ignored."""
    lines = enumerate(text.splitlines(), 1)
    return tuple(parse_public_key(line, f"{where}: line {n}") for n, line in lines
                 if line.strip() and not line.lstrip().startswith("#"))
