"""Code identity: the text of a callable that is the same in every process (part of a tunable set's checksum)."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable
from types import CodeType
from typing import Any

from farm.errors import TuneFailure
from farm.identity import fields


def code_text(fn: Callable[..., Any]) -> str:
    """The source of ``fn`` without its decorators (or :func:`code_object_text` when no source is available),
    the same in every process. A ``functools.partial`` is its function's text plus its bound arguments; a
    callable object is its class's source. Raises INVALID_INPUT when no process-independent text exists.
    Decorators are left out so a grown space keeps its code identity (docs/kernels.md, "Identity")."""
    target = inspect.unwrap(fn)
    if isinstance(target, functools.partial):
        bound = repr(target.args) + repr(sorted(target.keywords.items()))
        if " at 0x" in bound:
            raise TuneFailure.invalid(f"partial of {target.func!r} binds arguments without a stable repr: {bound}")
        return fields([code_text(target.func), bound])
    if not (inspect.isfunction(target) or inspect.ismethod(target) or inspect.isclass(target)) and callable(target):
        target = type(target)
    try:
        return _undecorated(inspect.getsource(target))
    except (OSError, TypeError):
        code: CodeType | None = getattr(target, "__code__", None)
        if code is not None:
            return code_object_text(code)
        text = repr(target)
        if " at 0x" in text:
            raise TuneFailure.invalid(f"no stable code identity for {text}: pass identity= or use a def") from None
        return text


def _undecorated(source: str) -> str:
    """``source`` from its ``def`` or ``class`` line on, when it is one decorated definition; else unchanged (a
    lambda's source is the lines around it, not a statement)."""
    try:
        body = ast.parse(textwrap.dedent(source)).body
    except SyntaxError:
        return source
    node = body[0] if len(body) == 1 else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or not node.decorator_list:
        return source
    return "".join(source.splitlines(keepends=True)[node.lineno - 1:])


def code_object_text(code: CodeType) -> str:
    """A function's identity without its source (``python -c``, ``exec``, a prompt): its bytecode, names and
    constants (nested code by its own text, sets sorted), the same in every process of one Python version."""
    return fields([code.co_code.hex(), fields(code.co_names), fields(code.co_varnames),
                   fields(_constant(c) for c in code.co_consts)])


def _constant(value: object) -> str:
    if isinstance(value, CodeType):
        return "code" + code_object_text(value)
    if isinstance(value, frozenset):
        return "frozenset" + fields(sorted(_constant(v) for v in value))
    if isinstance(value, tuple):
        return "tuple" + fields(_constant(v) for v in value)
    return repr(value)
