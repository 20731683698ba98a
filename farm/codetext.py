"""Code identity: the text of a callable that is the same in every process (part of a tunable set's checksum)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import CodeType
from typing import Any

from farm.errors import TuneFailure
from farm.identity import fields


def code_text(fn: Callable[..., Any]) -> str:
    """The source of ``fn`` (or its bytecode and constants when no source is available), the same in every
    process. A ``functools.partial`` is its function's text plus its bound arguments; a callable object is its
    class's source. Raises INVALID_INPUT when no process-independent text exists."""
    target = inspect.unwrap(fn)
    if isinstance(target, functools.partial):
        bound = repr(target.args) + repr(sorted(target.keywords.items()))
        if " at 0x" in bound:
            raise TuneFailure.invalid(f"partial of {target.func!r} binds arguments without a stable repr: {bound}")
        return fields([code_text(target.func), bound])
    if not (inspect.isfunction(target) or inspect.ismethod(target) or inspect.isclass(target)) and callable(target):
        target = type(target)
    try:
        return inspect.getsource(target)
    except (OSError, TypeError):
        code: CodeType | None = getattr(target, "__code__", None)
        if code is not None:
            return code.co_code.hex() + repr(code.co_consts)
        text = repr(target)
        if " at 0x" in text:
            raise TuneFailure.invalid(f"no stable code identity for {text}: pass identity= or use a def") from None
        return text
