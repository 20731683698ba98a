"""Restriction expressions of a tuning space: a whitelist interpreter over ``ast``, never ``eval``."""

from __future__ import annotations

import pytest

from farm.errors import FailureKind, RestrictionError, TuneFailure
from farm.restrict import compile_restriction

NAMES = ("block", "unroll", "layout", "vector")


def holds(text: str, **config: object) -> bool:
    base: dict[str, object] = {"block": 32, "unroll": 2, "layout": "row", "vector": True}
    base.update(config)
    return compile_restriction(text, NAMES, "space 'tiled'")(base)  # type: ignore[arg-type]


@pytest.mark.parametrize("text, expected", [
    ("block * unroll <= 256", True),
    ("block * unroll > 64", False),
    ("block % 32 == 0 and unroll in (1, 2, 4)", True),
    ("block // unroll == 16", True),
    ("not vector or block >= 32", True),
    ("16 <= block < 32", False),
    ("layout == 'row'", True),
    ("layout in ['col', 'tile']", False),
    ("layout not in ('col',)", True),
    ("min(block, 64) == 32 and max(unroll, 3, 1) == 3", True),
    ("block ** 2 == 1024", True),
    ("(block if vector else 0) == 32", True),
    ("-block + 64 == 32", True),
    ("block / unroll == 16.0", True),
])
def test_an_expression_of_the_grammar_evaluates_like_python(text: str, expected: bool) -> None:
    assert holds(text) is expected


@pytest.mark.parametrize("text, why", [
    ("block.__class__", "Attribute"),
    ("().__class__.__bases__[0].__subclasses__()", "calls something other than min or max"),
    ("__import__('os').system('true')", "calls something other than min or max"),
    ("open('/etc/passwd')", "calls something other than min or max"),
    ("len(layout) > 1", "calls something other than min or max"),
    ("layout[0] == 'r'", "Subscript"),
    ("(lambda: 1)()", "calls something other than min or max"),
    ("(lambda: 1) == block", "Lambda"),
    ("[b for b in (1, 2)]", "ListComp"),
    ("{'a': 1}", "Dict"),
    ("f'{block}'", "JoinedStr"),
    ("(x := 1)", "NamedExpr"),
    ("min(*[1, 2])", "starred"),
    ("max(block, key=abs)", "keywords"),
    ("warp == 32", "'warp', which is not a parameter"),
    ("block *", "is not an expression"),
    ("block = 3", "is not an expression"),
    ("", "non-empty"),
    ("x" * 3000, "longer than"),
    ("1" + " + 1" * 300, "more than"),
    ("block < 1" + "0" * 100, "constant"),
    ("__builtins__ == 1", "not a parameter"),
    ("b'bytes' == block", "constant"),
])
def test_a_hostile_or_invalid_expression_is_invalid_input_naming_the_space_and_expression(text: str, why: str) -> None:
    with pytest.raises(TuneFailure) as caught:
        compile_restriction(text, NAMES, "space 'tiled'")
    assert caught.value.kind is FailureKind.INVALID_INPUT
    assert "space 'tiled'" in caught.value.message and why in caught.value.message
    assert repr(text)[:40] in caught.value.message


@pytest.mark.parametrize("text", [
    "block ** 65 > 0",
    "block < 10 ** 200",
    "2 ** 64 ** 64 > 0",
    "block ** block ** block > 0",
    "(block * 2 ** 60) ** 60 > 0",
    "layout * 1000000 == ''",
    "'%0999999d' % block == ''",
    "block / (unroll - 2) > 0",
])
def test_an_expression_that_would_explode_or_fails_is_refused_when_evaluated(text: str) -> None:
    predicate = compile_restriction(text, NAMES, "space 'tiled'")
    with pytest.raises(RestrictionError, match="space 'tiled': restriction"):
        predicate({"block": 32, "unroll": 2, "layout": "row", "vector": True})


def test_a_parameter_named_like_a_function_is_refused() -> None:
    with pytest.raises(TuneFailure, match="shadows a function"):
        compile_restriction("min > 1", ("min",), "space 's'")
