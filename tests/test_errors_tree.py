"""The error trees drawn in the docstrings of farm.errors and farm_fleet.errors are the real class trees."""

from __future__ import annotations

import inspect
import re
from types import ModuleType

import pytest

import farm.errors as errors
import farm_fleet.errors as fleet_errors
from farm.errors import FarmError

# One line of a drawn tree: the branch marks, a class name, optionally "(also Base, ...)", then its description.
LINE = re.compile(r"^(?P<marks>(?:[│ ]   )*)(?:[├└]── )?(?P<name>[A-Za-z]+)(?: \(also (?P<also>[A-Za-z, ]+)\))?(?:\s|$)")


def drawn(module: ModuleType) -> set[tuple[str, str | None, frozenset[str]]]:
    """(class, parent in the tree, the other bases it names) for each line of the module docstring's tree."""
    block = (module.__doc__ or "").split("```")[1]
    parents: list[str] = []
    found = set()
    for line in block.strip("\n").splitlines():
        match = LINE.match(line)
        assert match is not None, f"{module.__name__}: unreadable tree line {line!r}"
        depth = len(match["marks"]) // 4 + (0 if line[0].isalpha() else 1)
        del parents[depth:]
        also = frozenset(b.strip() for b in (match["also"] or "").split(",") if b.strip())
        found.add((match["name"], parents[-1] if parents else None, also))
        parents.append(match["name"])
    return found


def real(module: ModuleType) -> set[tuple[str, str | None, frozenset[str]]]:
    """The same, from the classes the module defines (and the root FarmError)."""
    found: set[tuple[str, str | None, frozenset[str]]] = {("FarmError", None, frozenset())}
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != module.__name__ or not issubclass(cls, FarmError) or cls is FarmError:
            continue
        farm_bases = [b for b in cls.__bases__ if issubclass(b, FarmError)]
        others = frozenset(b.__name__ for b in cls.__bases__ if not issubclass(b, FarmError))
        assert len(farm_bases) == 1, cls
        found.add((cls.__name__, farm_bases[0].__name__, others))
    return found


@pytest.mark.parametrize("module", [errors, fleet_errors], ids=lambda m: m.__name__)
def test_the_drawn_error_tree_is_the_class_tree(module: ModuleType) -> None:
    assert drawn(module) == real(module)


def test_a_tree_missing_a_class_or_misplacing_one_is_noticed() -> None:
    class Fake(ModuleType):
        pass

    fake = Fake("fake")
    fake.__doc__ = "```\nFarmError\n├── TuneFailure   x\n└── NvrtcError (also RuntimeError)   y\n```"
    assert drawn(fake) != real(errors)
    assert ("NvrtcError", "FarmError", frozenset({"RuntimeError"})) in drawn(fake)
    assert ("NvrtcError", "CudaToolError", frozenset({"RuntimeError"})) in real(errors)
