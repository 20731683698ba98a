"""docs/architecture.md stays the map: its "Every module" section lists every package and module of the product
(farm/, kernels/, fleet/, workers/, coordinator/, cli/, triton_adapter/) once, and nothing that is gone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_imports import ROOT, modules

PAGE = ROOT / "docs" / "architecture.md"
SECTION = "## Every module"
ENTRY = re.compile(r"^- `([A-Za-z0-9_.]+)`:")


def listed(text: str) -> list[str]:
    """The modules the page's "Every module" section lists, in order (one ``- `name`: ...`` line each)."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    body = text[start:] if end < 0 else text[start:end]
    return [m.group(1) for line in body.splitlines() if (m := ENTRY.match(line))]


def summary(path: Path) -> str:
    """A module's docstring, its first sentence, as a line of the page."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "WHAT IT HOLDS"
    first = " ".join(doc.split("\n\n")[0].split())
    return re.split(r"(?<=\.)\s+(?=[A-Z`(:])", first)[0].rstrip(".").replace("``", "`")


def test_the_listing_is_read_from_its_section_only() -> None:
    text = "# A\n- `outside`: no\n## Every module\n### `p`\n- `p`: one\n- `p.q`: two\n  more\n## Next\n- `after`: no\n"
    assert listed(text) == ["p", "p.q"]


def test_docs_architecture_lists_every_module_once_and_nothing_that_is_gone() -> None:
    names = listed(PAGE.read_text(encoding="utf-8"))
    known = modules()
    missing = [f"- `{name}`: {summary(path)}" for name, path in sorted(known.items()) if name not in names]
    gone = [name for name in names if name not in known]
    twice = sorted({name for name in names if names.count(name) > 1})
    assert not missing, (f"docs/architecture.md, section {SECTION!r}: add these lines under their package's heading "
                         "(edit the text to say the module's concept):\n" + "\n".join(missing))
    assert not gone, f"docs/architecture.md, section {SECTION!r}: remove the lines of modules that are gone: {gone}"
    assert not twice, f"docs/architecture.md, section {SECTION!r}: listed twice: {twice}"
