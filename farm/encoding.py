"""The length-delimited text encoding every key of the farm is built from (no farm imports: the bottom layer)."""

from __future__ import annotations

from collections.abc import Iterable


def fields(parts: Iterable[str]) -> str:
    """Length-delimited encoding ``<len>:<text>`` per part, so ("ab", "c") and ("a", "bc") differ.

    The length counts UTF-8 bytes, so the encoding is unambiguous for any text.
    """
    return "".join(f"{len(p.encode())}:{p}" for p in parts)


def split_fields(text: str) -> list[str]:
    """Invert :func:`fields`. Raises ValueError for text that is not a length-delimited encoding."""
    if text.isascii():  # bytes are characters: split the text itself (the same steps, no encoding)
        return _split_ascii(text)
    data = text.encode()
    parts: list[str] = []
    at = 0
    while at < len(data):
        colon = data.find(b":", at)
        if colon < 0 or not data[at:colon].isdigit():
            raise ValueError(f"no field length at byte {at}")
        length = int(data[at:colon])
        start = colon + 1
        if start + length > len(data):
            raise ValueError(f"field at byte {at} runs past the end")
        parts.append(data[start : start + length].decode())
        at = start + length
    return parts


def _split_ascii(text: str) -> list[str]:
    parts: list[str] = []
    at = 0
    while at < len(text):
        colon = text.find(":", at)
        if colon < 0 or not text[at:colon].isdigit():
            raise ValueError(f"no field length at byte {at}")
        start = colon + 1
        end = start + int(text[at:colon])
        if end > len(text):
            raise ValueError(f"field at byte {at} runs past the end")
        parts.append(text[start:end])
        at = end
    return parts
