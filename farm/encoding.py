"""The length-delimited text encoding every key of the farm is built from (no farm imports: the bottom layer)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import AnyStr


def fields(parts: Iterable[str]) -> str:
    """``<len>:<text>`` per part, the length in UTF-8 bytes, so ("ab", "c") and ("a", "bc") differ."""
    return "".join(f"{len(p.encode())}:{p}" for p in parts)


def split_fields(text: str) -> list[str]:
    """Invert :func:`fields`. Raises ValueError for text that is not a length-delimited encoding."""
    if text.isascii():  # bytes are characters: split the text itself (the same steps, no encoding)
        return [text[start:end] for start, end in field_spans(text, ":")]
    data = text.encode()  # decoded as split, so errors come in order
    return [data[start:end].decode() for start, end in field_spans(data, b":")]


def field_spans(data: AnyStr, colon: AnyStr) -> Iterator[tuple[int, int]]:
    """The (start, end) of each field's text in an encoding, lazily; ``colon`` is ``":"`` or ``b":"`` to match
    ``data``. Raises ValueError (as the iteration reaches it) for a malformed field."""
    at = 0
    while at < len(data):
        mark = data.find(colon, at)
        if mark < 0 or not data[at:mark].isdigit():
            raise ValueError(f"no field length at byte {at}")
        start = mark + 1
        end = start + int(data[at:mark])
        if end > len(data):
            raise ValueError(f"field at byte {at} runs past the end")
        yield start, end
        at = end
