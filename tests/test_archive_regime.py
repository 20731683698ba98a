"""`farm archive import` across execution regimes (issue 34, item 5): an archive measured in the workers' regime
(one core) imported by a process with more is refused naming the fields that differ, as the archive and as this
machine have them, and the fix it proposes (the import in the archive's regime) works without ``--force``; the
application in that regime then reads the decision from the cache."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from servers import farm_env
from test_readme import BLOCKS

from farm.encoding import fields, split_fields
from farm.environment import fingerprint_differences

PART = "x86_64; a CPU; 2 logical cores"
FP = fields(["host", "cpu", PART, "Linux 6; openblas", "CPython 3.11", "0.1.0+ab", "", "cpus=2; blas=2 (openblas); openmp=2"])


def changed(fingerprint: str, index: int, value: str) -> str:
    parts = split_fields(fingerprint)
    parts[index] = value
    return fields(parts)


@pytest.mark.parametrize("other, expected", [
    (FP, []),
    (changed(FP, 7, "cpus=1; blas=1 (openblas); openmp=1"),
     [("cpus", "1", "2"), ("blas", "1 (openblas)", "2 (openblas)"), ("openmp", "1", "2")]),
    (changed(FP, 7, "cpus=2; blas=2 (openblas); openmp=2; OMP_SCHEDULE=static"), [("OMP_SCHEDULE", "static", "")]),
    (changed(FP, 5, "0.2.0+cd"), [("build", "0.2.0+cd", "0.1.0+ab")]),
    (changed(changed(FP, 3, "Linux 7; openblas"), 7, "cpus=1; blas=2 (openblas); openmp=2"),
     [("driver", "Linux 7; openblas", "Linux 6; openblas"), ("cpus", "1", "2")]),
    ("fp-a", [("fingerprint", "fp-a", FP)]),
])
def test_fingerprint_differences_name_each_field_as_each_side_has_it(other, expected):
    assert fingerprint_differences(other, FP) == expected


ONE_CORE = changed(FP, 7, "cpus=1; blas=1 (openblas); openmp=1")


@pytest.mark.parametrize("target, into, said", [
    (FP, Path("site"), ["measured with cpus=1, blas=1 (openblas), openmp=1 (fingerprint ", "this machine's runtime "
                        "fingerprint has cpus=2, blas=2 (openblas), openmp=2 (",
                        "(`taskset -c 0 farm archive import archives/x --into-cache site`)",
                        "or tune in this regime (`farm tune CATALOG --cache-dir site`)"]),
    (changed(FP, 7, "cpus=4; blas=1 (openblas); openmp=1"), None,
     ["measured with cpus=1 (", "the target fingerprint has cpus=4 (", "leave out --fingerprint) and run the "
      "applications in its regime (`taskset -c 0 python app.py`)"]),
    (changed(ONE_CORE, 5, "0.2.0+cd"), Path("site"),
     ["measured with build '0.1.0+ab' (", "has build '0.2.0+cd' (", "another device class, driver or build: tune on "
      "this machine (`farm tune CATALOG --cache-dir site`)"]),
    ("fp-b", None, ["the archive's fingerprint is ", "the target fingerprint is ", "(leave out --fingerprint), or "
                    "tune for the target"]),
])
def test_a_mismatch_names_the_fields_as_each_side_has_them_and_the_fix_before_force(target, into, said):
    from types import SimpleNamespace

    from farm.environment import fingerprint_digest
    from farm_archives.imports import mismatch_message

    archive = SimpleNamespace(path=Path("archives/x"), fingerprint=ONE_CORE, digest=fingerprint_digest(ONE_CORE))
    message = mismatch_message(archive, target, into)  # type: ignore[arg-type]
    assert message.startswith("archives/x: fingerprint mismatch: ") and "; nothing imported. Fix: " in message
    for part in said:
        assert part in message, message
    assert message.index("Fix: ") < message.index("--force (for the rare case"), message
    assert message.endswith("anyway, re-keying every decision to it"), message


def run(args: list[str], cwd, env=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, env=env or farm_env(), cwd=cwd, timeout=300)


def farm(*args: str) -> list[str]:
    return [sys.executable, "-m", "farm_cli", *args]


@pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and two CPUs: the workers' regime (one core) must differ from this one")
def test_an_import_in_another_regime_names_the_fields_and_the_fix_that_works(tmp_path):
    snippet = next(b for b in BLOCKS if b.language == "python" and "enable_stack_autotune" in b.text).text
    workers = tmp_path / "workers"
    workers.mkdir()
    tuned = run(["taskset", "-c", "0", sys.executable, "-c", snippet], workers)  # the workers' regime: one core
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    exported = run(farm("archive", "export", "--from-cache", ".farm-cache", "--out", "archives"), workers)
    assert exported.returncode == 0, exported.stderr
    (archive,) = (workers / "archives").iterdir()

    app = tmp_path / "app"
    cache = app / ".farm-cache"
    refused = run(farm("archive", "import", str(archive), "--into-cache", str(cache)), tmp_path)
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2, said
    mine = len(os.sched_getaffinity(0))
    assert "fingerprint mismatch" in said and "nothing imported" in said, said
    assert re.search(r"measured with cpus=1, blas=1 [^,]*, openmp=1 \(fingerprint \w+\), this machine's runtime "
                     rf"fingerprint has cpus={mine}, ", said), said
    assert "--force (for the rare case" in said and "re-keying every decision to it" in said, said
    assert not cache.exists()

    fix = re.search(r"`(taskset -c 0 farm archive import [^`]+)`", said)
    assert fix is not None, said
    command = shlex.split(fix.group(1))
    done = run(command[:3] + farm(*command[4:]), tmp_path)  # as written, `farm` being this interpreter's
    assert done.returncode == 0, done.stderr
    assert "1 decisions (1 new" in done.stdout and "overridden" not in done.stderr

    # The application, run in the regime the fix names, is served from the imported cache: no search.
    served = run(["taskset", "-c", "0", sys.executable, "-c", snippet], app)
    assert served.returncode == 0, served.stderr[-3000:]
    stats = next(line for line in served.stdout.splitlines() if line.startswith("Stats("))
    assert "disk_hits=1" in stats and "tunes=0" in stats, served.stdout

    forced = run(farm("archive", "import", str(archive), "--into-cache", str(tmp_path / "elsewhere"), "--force"),
                 tmp_path)
    assert forced.returncode == 0, forced.stderr
    warned = " ".join(forced.stderr.split())
    assert "fingerprint check overridden by --force" in warned and "(measured with cpus=1, blas=1" in warned, warned
    assert f"filed under cpus={mine}, " in warned, warned
