"""`farm tune` on a terminal (issue 15): a real pseudo-terminal shows a live bar that advances, and Ctrl-C (the
terminal's interrupt character, delivered as SIGINT by the line discipline) exits 130 with how to resume."""

from __future__ import annotations

import os
import pty
import re
import select
import sys
import time

from farm_helpers import write_catalog
from servers import farm_env

SLOW = "\n".join(f"""
[[problems]]
operation = "uxtest_slow"
workloads = [{{ n = {n}, dtype = "float64" }}]""" for n in range(16, 56, 4))


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def shown(seen: list[str]) -> str:
    """What the terminal received, without colours and cursor moves."""
    return ANSI.sub("", "".join(seen))


def read_until(fd: int, pattern: re.Pattern[str], seen: list[str], timeout: float) -> re.Match[str] | None:
    """Read the terminal until ``pattern`` matches what was shown (or the child exits, or the time is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                return pattern.search(shown(seen))
            if not chunk:
                return pattern.search(shown(seen))
            seen.append(chunk.decode(errors="replace"))
            found = pattern.search(shown(seen))
            if found:
                return found
    return None


def test_the_bar_advances_on_a_terminal_and_ctrl_c_exits_130_saying_how_to_resume(tmp_path):
    catalog = write_catalog(tmp_path / "c.toml", SLOW)
    env = farm_env({"TERM": "xterm", "COLUMNS": "200"})
    args = [sys.executable, "-m", "farm_cli", "tune", str(catalog), "--cache-dir", str(tmp_path / "cache"),
            "--kernels", "farm_uxops"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pseudo-terminal is its controlling terminal, as in an operator's shell
        os.chdir(tmp_path)
        os.execve(sys.executable, args, env)
    seen: list[str] = []
    try:
        first = read_until(fd, re.compile(r"([1-9]\d*)/10 problems"), seen, 120)
        assert first is not None, shown(seen)[-2000:]
        more = "|".join(str(n) for n in range(int(first.group(1)) + 1, 11))
        later = read_until(fd, re.compile(rf"\b({more})/10 problems"), seen, 120)
        assert later is not None, shown(seen)[-2000:]  # the bar advanced while the run went on
        os.write(fd, b"\x03")  # Ctrl-C
        read_until(fd, re.compile(r"farm: interrupted.*\n.*\n"), seen, 60)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = shown(seen)
    assert os.waitstatus_to_exitcode(status) == 130, text[-2000:]
    assert "farm: interrupted" in text and "rerun `farm tune" in text and "--run" in text
    assert text.count("run the same command again to resume") == 1, text[-2000:]  # the advice once
    assert "Traceback" not in text
