"""README.md's code blocks run as written (doctest-style).

Python blocks run in order, as one script, in a fresh folder; shell blocks run with bash in a fresh folder (or
the repository root, where the block is marked so); a block that cannot run here (a GPU, a Docker engine,
servers that do not exit) carries an HTML comment with the reason on the line before it. Every block is either
run or marked. What a block's comments say it prints is checked by shape (names, verdicts, counts), never by a
speed. The relative links of the README and of the pages it sends readers to name files and headings that exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARK = re.compile(r"^<!-- readme-test: (?:skip: (?P<reason>.*\S)|(?P<root>run in the repository root)) -->$")
FENCE = re.compile(r"^```(?P<language>\S*)$")
STANDINGS = {"None", "faster", "not_faster", "undecided"}
SAMPLE = "# prints, for example:"


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README: its language, text, first line (1-based) and marker."""

    language: str
    text: str
    line: int
    skip: str | None = None
    in_root: bool = False


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block of ``text``, with the marker comment of the line right before its fence."""
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
        assert end is not None, f"README.md:{i + 1}: a code block that is never closed"
        mark = MARK.match(lines[i - 1]) if i > 0 else None
        found.append(Block(fence["language"], "\n".join(lines[i + 1:end]) + "\n", i + 1,
                           mark["reason"] if mark else None, bool(mark and mark["root"])))
        i = end + 1
    return found


BLOCKS = readme_blocks(README.read_text())


def run_python(script: str, cwd: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "FARM_ALLOW_UNSIGNED"}  # as a user runs it (conftest.py)
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def stats_of(line: str) -> dict[str, int]:
    assert line.startswith("Stats("), line
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def sample_lines(block: Block) -> list[str]:
    """The output a block's ``# prints, for example:`` comment shows."""
    lines = block.text.splitlines()
    start = lines.index(SAMPLE)
    return [line.removeprefix("#").strip() for line in lines[start + 1:]]


def test_every_readme_block_is_python_or_shell_and_is_run_or_marked_with_its_reason():
    assert BLOCKS, "README.md has no code blocks"
    for block in BLOCKS:
        assert block.language in {"python", "sh"}, f"README.md:{block.line}: a ```{block.language} block"
        if block.skip is None and block.language == "sh":
            # a block that needs a GPU or a Docker engine must say so instead of failing here
            assert not re.search(r"cuda:\d|docker|compose |gpu-check(?! --dry-run)", block.text), (
                f"README.md:{block.line}: this block needs a GPU or Docker: mark it "
                "<!-- readme-test: skip: REASON -->")
    marks = [n for n, line in enumerate(README.read_text().splitlines(), 1) if line.startswith("<!-- readme-test")]
    attached = {block.line - 1 for block in BLOCKS if block.skip is not None or block.in_root}
    assert set(marks) == attached, "a readme-test comment that is malformed or not right before a code block"
    run = [block for block in BLOCKS if block.skip is None]
    assert {block.language for block in run} == {"python", "sh"}


def test_the_readme_python_blocks_run_in_order_and_print_what_their_comments_show(tmp_path):
    python = [block for block in BLOCKS if block.language == "python" and block.skip is None]
    script = "\n".join(block.text for block in python)
    sample = sample_lines(next(block for block in python if SAMPLE in block.text))

    first = run_python(script, tmp_path)
    chosen = [line for line in first if line.startswith("chosen: ")]
    assert len(chosen) == 1 and chosen[0].split()[1] in {"reference", "doubled"}, first
    stats = stats_of(next(line for line in first if line.startswith("Stats(")))
    assert (stats["misses"], stats["tunes"]) == (1, 1)

    tuned = first[first.index(next(line for line in first if line.startswith("Stats("))) + 1:]
    assert len(tuned) == len(sample), (tuned, sample)
    winner, ratio = tuned[0].split()
    rows = [line.split(" ", 3) for line in tuned[1:]]
    assert [row[0] for row in rows] == [line.split()[0] for line in sample[1:]] == ["reference", "doubled"]
    for name, standing, samples, note in rows:
        assert standing in STANDINGS and int(samples) >= 7, (name, standing, samples)
        assert note.startswith("selected") == (name == winner), (winner, name, note)
    doubled = rows[1]
    if winner == "reference":
        assert float(ratio) == 1.0 and doubled[1] != "faster"
    else:
        assert winner == "doubled" and float(ratio) < 1.0 and doubled[1] == "faster"

    # Run again in the same folder: the decision comes from .farm-cache/, no search, as the README says.
    again = run_python(script, tmp_path)
    assert not [line for line in again if line.startswith("chosen: ")], again
    stats = stats_of(next(line for line in again if line.startswith("Stats(")))
    assert (stats["disk_hits"], stats["tunes"], stats["misses"]) == (1, 0, 0)


@pytest.mark.parametrize("block", [block for block in BLOCKS if block.language == "sh" and block.skip is None],
                         ids=lambda block: f"line{block.line}")
def test_a_readme_shell_block_runs_as_written_and_writes_what_it_names(block, tmp_path):
    cwd = ROOT if block.in_root else tmp_path
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    env.pop("FARM_ALLOW_UNSIGNED", None)  # the suite's development mode (tests/conftest.py): a user has none
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "Traceback" not in done.stderr
    for written in re.findall(r"--out (\S+)", block.text):
        assert (cwd / written).exists(), f"README.md:{block.line}: {written} was not written"


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (lower case, punctuation dropped, spaces -> -)."""
    anchors = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", ["README.md", "docs/benchmarks.md", "docs/contract.md", "docs/decisions.md",
                                  "docs/archives.md"])
def test_every_relative_link_of_the_page_names_a_file_and_heading_that_exist(page):
    path = ROOT / page
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{page}: link to {target}: no such file"
        if anchor:
            assert anchor in heading_anchors(linked), f"{page}: link to {target}: no such heading"


KEYS_INIT = re.compile(r"farm keys init(?P<args>[^#\n]*)")
SIGNING_KEY = re.compile(r"--signing-key (?P<path>\S+)")


@pytest.mark.parametrize("block", [b for b in BLOCKS if "--signing-key" in b.text], ids=lambda b: f"line{b.line}")
def test_every_signing_key_a_readme_block_signs_with_is_created_by_an_earlier_step_of_it(block):
    """A reader runs a block's lines in order: the key it signs with comes from its own `farm keys init`."""
    created: set[str] = set()
    for line in block.text.splitlines():
        for found in SIGNING_KEY.finditer(line):
            assert found["path"] in created, f"README.md:{block.line}: --signing-key {found['path']} that no step creates"
        made = KEYS_INIT.search(line)
        if made is not None:
            args = made["args"].split()
            directory = args[args.index("--dir") + 1] if "--dir" in args else "farm-keys"
            name = args[args.index("--name") + 1] if "--name" in args else "farm"
            created.add(f"{directory.rstrip('/')}/{name}.key")


def test_the_readmes_incremental_claim_states_its_precondition():
    """A grown space evaluates only its new configs after a complete exhaustive search only (docs/spaces.md)."""
    text = " ".join(README.read_text().split())
    claim = text.index("evaluates only its new configs")
    assert "complete exhaustive search" in text[claim:claim + 300], text[claim:claim + 300]
