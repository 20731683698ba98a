"""Safe restriction expressions of a tuning space: parsed with ``ast``, evaluated by a whitelist interpreter.

A restriction such as ``"block * unroll <= 256"`` is never given to ``eval``: its grammar (docs/spaces.md,
``restrict``) is checked before any trial runs, and evaluation bounds exponents, integers and strings.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

from farm.errors import RestrictionError, TuneFailure

Value = int | float | bool | str

MAX_EXPRESSION_CHARS = 2000
MAX_NODES = 200
MAX_EXPONENT = 64
MAX_INT_BITS = 256

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
_CALLS: dict[str, Callable[..., Any]] = {"min": min, "max": max}


def compile_restriction(text: str, names: tuple[str, ...], where: str) -> Callable[[Mapping[str, Value]], bool]:
    """Check ``text`` against the grammar and the parameter ``names``; return a predicate over a config.
    Raises INVALID_INPUT naming ``where`` (the space) and the expression for anything outside them."""
    def invalid(why: str) -> TuneFailure:
        return TuneFailure.invalid(f"{where}: restriction {text!r} {why}")

    if not isinstance(text, str) or not text.strip():
        raise invalid("must be a non-empty string")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise invalid(f"is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise invalid(f"is not an expression: {e.msg}") from None
    for count, node in enumerate(ast.walk(tree), 1):
        if count > MAX_NODES:
            raise invalid(f"has more than {MAX_NODES} parts")
        _check(node, names, invalid)

    def predicate(config: Mapping[str, Value]) -> bool:
        try:
            return bool(_eval(tree.body, config))
        except (RestrictionError, ArithmeticError, TypeError, ValueError) as e:
            why = str(e) if isinstance(e, RestrictionError) else f"{type(e).__name__}: {e}"
            message = f"{where}: restriction {text!r} failed for {dict(config)}: {why}"
            raise RestrictionError(message) from None

    return predicate


_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp, ast.Compare,
    ast.IfExp, ast.Constant, ast.Name, ast.Load, ast.Tuple, ast.List, ast.Call, *_BINARY, *_COMPARE,
)


def _check(node: ast.AST, names: tuple[str, ...], invalid: Callable[[str], TuneFailure]) -> None:
    if not isinstance(node, _ALLOWED):
        raise invalid(f"uses {type(node).__name__}, which restrictions do not allow")
    if isinstance(node, ast.Name) and node.id not in names and node.id not in _CALLS:
        raise invalid(f"names {node.id!r}, which is not a parameter (parameters: {', '.join(names)})")
    if isinstance(node, ast.Name) and node.id in _CALLS and node.id in names:
        raise invalid(f"names parameter {node.id!r}, which shadows a function")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _CALLS:
            raise invalid("calls something other than min or max")
        if node.keywords or not node.args or any(isinstance(a, ast.Starred) for a in node.args):
            raise invalid("calls min/max with keywords, starred or no arguments")
    if isinstance(node, ast.Constant):
        value = node.value
        if not isinstance(value, (int, float, str)) or (isinstance(value, int) and value.bit_length() > MAX_INT_BITS):
            raise invalid(f"has a constant {value!r} outside the grammar")


def _eval(node: ast.expr, config: Mapping[str, Value]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in _CALLS:
            raise RestrictionError(f"{node.id} is a function, not a value")
        return config[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(e, config) for e in node.elts)
    if isinstance(node, ast.BoolOp):  # short-circuits; the result is a bool
        holds = all if isinstance(node.op, ast.And) else any
        return holds(_eval(v, config) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, config)
        if isinstance(node.op, ast.Not):
            return not value
        return _bounded(-value if isinstance(node.op, ast.USub) else +value)
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, config), _eval(node.right, config)
        if isinstance(node.op, ast.Pow) and (not isinstance(right, (int, float)) or abs(right) > MAX_EXPONENT):
            raise RestrictionError(f"exponent {right!r} is above the limit of {MAX_EXPONENT}")
        if isinstance(node.op, (ast.Mult, ast.Mod)) and (isinstance(left, str) or isinstance(right, str)):
            raise RestrictionError("strings cannot be multiplied or formatted")
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Compare):
        left = _eval(node.left, config)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _eval(comparator, config)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, config) else node.orelse, config)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return _CALLS[node.func.id](*(_eval(a, config) for a in node.args))
    raise RestrictionError(f"cannot evaluate {type(node).__name__}")  # refused by _check already


def _bounded(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise RestrictionError(f"an intermediate integer exceeds {MAX_INT_BITS} bits")
    if isinstance(value, str) and len(value) > MAX_EXPRESSION_CHARS:
        raise RestrictionError("an intermediate string is too long")
    return value
