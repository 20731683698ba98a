"""Import rules, read from the source with ``ast`` (function-level imports included):

- the core (``farm/``) never imports the fleet packages, the archive tools, Celery, kombu or Flower, not even
  lazily;
- the archive tools (``archive_tools/``, ``farm_archives``) import the core only;
- ``workers`` and ``coordinator`` never import each other (the CLI wires them together);
- no package has an import cycle;
- no product module is over 600 lines (the hard limit); one over 400 is listed as a smell to look at, never a
  reason to move code: a module holds one concept, whatever its size;
- nothing imports a bare ``kernels``/``workers``/``coordinator`` (the installed names are ``farm_*``);
- the core stays small enough to hold in one's head: ``farm/`` at most 9,000 lines (docs/architecture.md).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> installed import name (pyproject.toml, [tool.setuptools.package-dir])
PACKAGES = {"farm": "farm", "kernels": "farm_kernels", "fleet": "farm_fleet", "archive_tools": "farm_archives",
            "workers": "farm_workers", "coordinator": "farm_coordinator", "cli": "farm_cli", "triton_adapter": "farm_triton"}
FORBIDDEN_IN_CORE = ("farm_coordinator", "farm_workers", "farm_fleet", "farm_archives", "farm_cli", "celery", "kombu",
                     "flower")
# the archive tools: besides the core, only the standard library and third-party libraries (pyarrow, redis, rich)
FORBIDDEN_IN_ARCHIVES = ("farm_kernels", "farm_fleet", "farm_workers", "farm_coordinator", "farm_cli", "farm_triton",
                         "celery", "kombu", "flower")
BARE = ("kernels", "workers", "coordinator", "fleet", "archive_tools", "cli")
SMELL_LINES = 400  # a module longer than this is worth a look (printed by the test), not a failure
MAX_LINES = 600
CORE_LINES = 9_000  # farm/, every module together (docs/architecture.md, "The packages")
APART = (("farm_workers", "farm_coordinator"), ("farm_coordinator", "farm_workers"))  # (importer, never imported)


@cache
def modules() -> dict[str, Path]:
    """Every module of the product by its import name."""
    found: dict[str, Path] = {}
    for folder, name in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(absolute name, line) of every import in the file, at any depth; ``from a import b`` gives ``a.b`` when
    that is a module, else ``a``."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in modules() else base), node.lineno


def resolve(name: str) -> str | None:
    """The product module an import lands in (the longest known prefix), or None for a third-party name."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules():
            return ".".join(parts)
        parts.pop()
    return None


def graph() -> dict[str, set[str]]:
    return {m: {r for name, _ in imported(m, p) if (r := resolve(name)) is not None and r != m}
            for m, p in modules().items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_scan_sees_every_package_and_function_level_imports() -> None:
    assert {m.split(".")[0] for m in modules()} == set(PACKAGES.values())
    # farm_coordinator.plan imports farm_kernels.recorded inside a function: the graph must see that edge.
    assert "farm_kernels.recorded" in graph()["farm_coordinator.plan"]


def test_the_core_never_imports_the_fleet_celery_kombu_or_flower() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for module, path in modules().items() if module.split(".")[0] == "farm"
        for name, line in imported(module, path)
        if name.split(".")[0] in FORBIDDEN_IN_CORE
    ]
    assert offences == []


def test_the_archive_tools_import_the_core_only() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for module, path in modules().items() if module.split(".")[0] == "farm_archives"
        for name, line in imported(module, path)
        if name.split(".")[0] in FORBIDDEN_IN_ARCHIVES
    ]
    assert offences == []


def test_workers_and_coordinator_never_import_each_other() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for importer, forbidden in APART
        for module, path in modules().items() if module.split(".")[0] == importer
        for name, line in imported(module, path)
        if name.split(".")[0] == forbidden
    ]
    assert offences == []


def test_the_compile_sender_is_the_coordinators_own() -> None:
    # precompile imports it inside a function (where it once imported farm_workers.compile): the scan sees it
    assert "farm_coordinator.compilefleet" in graph()["farm_coordinator.precompile"]
    assert not any(m.startswith("farm_workers") for m in graph()["farm_coordinator.compilefleet"])


def test_no_package_has_an_import_cycle() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_imports_a_bare_package_name() -> None:
    offences = []
    for path in [*modules().values(), *(ROOT / "tests").glob("*.py"), *(ROOT / "bench").glob("*.py"),
                 *(ROOT / "examples").rglob("*.py")]:
        module = resolve_path(path)
        for name, line in imported(module, path):
            if name.split(".")[0] in BARE:
                offences.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    assert offences == []


def resolve_path(path: Path) -> str:
    for module, known in modules().items():
        if known == path:
            return module
    return path.stem


def oversized(limit: int = MAX_LINES) -> list[str]:
    return [f"{path.relative_to(ROOT)}: {n} lines" for path in modules().values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > limit]


def test_no_product_module_is_over_600_lines_and_those_over_400_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        for line in oversized(SMELL_LINES):
            print(f"\nover {SMELL_LINES} lines (a smell to look at, not an error): {line}")
    assert oversized() == []


def test_the_core_is_at_most_9000_lines() -> None:
    core = {path: len(path.read_text(encoding="utf-8").splitlines())
            for name, path in modules().items() if name.split(".")[0] == "farm"}
    assert len(core) > 40  # the scan found the core's modules
    biggest = ", ".join(f"{p.relative_to(ROOT)} {n}" for p, n in sorted(core.items(), key=lambda i: -i[1])[:5])
    assert sum(core.values()) <= CORE_LINES, f"farm/ is {sum(core.values())} lines (largest: {biggest})"
