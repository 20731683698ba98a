"""`farm report` of a decision made in process (issue 34, item 8): the README's controller snippet, its cache
exported with `farm archive export --from-cache`, then `farm report`. Its record's meta holds only the search's
cost, so the report names the operation, workload and reference from the decision's cache key, as `farm archive
inspect` does."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from servers import farm_env
from test_readme import BLOCKS


def farm_cli(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", *args], capture_output=True, text=True,
                          env=farm_env(), cwd=cwd, timeout=300)


def test_the_report_of_an_in_process_decision_names_its_operation_workload_and_reference(tmp_path):
    snippet = next(b for b in BLOCKS if b.language == "python" and "enable_stack_autotune" in b.text)
    ran = subprocess.run([sys.executable, "-c", snippet.text], cwd=tmp_path, env=farm_env(), capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    (chosen,) = [line.split()[1] for line in ran.stdout.splitlines() if line.startswith("chosen: ")]

    exported = farm_cli("archive", "export", "--from-cache", ".farm-cache", "--out", "archives", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    done = farm_cli("report", "--archive", "archives", "--out", "report.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1 problems written" in done.stdout

    page = (tmp_path / "report.html").read_text()
    blob = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    assert blob is not None
    ((problem,),) = [f["problems"] for f in json.loads(blob.group(1))]
    # The README's set: TunableSet("scale"), reference `reference`, inputs np.ones(1024) (array_signature).
    assert (problem["operation"], problem["reference"], problem["winner"]) == ("scale", "reference", chosen)
    assert problem["workload"] == "numpy:<f8(1024,)s(1,)"
    # What the record keeps: the winner's ratio and verdict, and the reference it was measured against.
    shown = {c["name"]: c for c in problem["candidates"]}
    assert set(shown) == {"reference", chosen}
    assert shown[chosen]["ratio"] == problem["ratio"] and shown[chosen]["note"].startswith("selected")
    assert shown["reference"]["ratio"] == 1.0

    inspected = farm_cli("archive", "inspect", "archives", "--json", cwd=tmp_path)
    assert inspected.returncode == 0, inspected.stderr
    (row,) = json.loads(inspected.stdout)
    assert (row["operation"], row["workload"], row["reference"]) == ("scale", problem["workload"], "reference")


SPACED = '''
import numpy as np
import farm

blocked = farm.TunableSet("scale", signature=farm.array_signature)

@blocked.reference
def reference(x):
    return x * 2.0

@blocked.space(group=0, block=[16, 32, 64, 128], unroll=[1, 2, 4, 8], restrict="block * unroll <= 256")
def tiled(x, *, block, unroll):
    return x * 2.0

tuner = farm.enable_stack_autotune(farm.StackPolicy(samples=3, warmups=1), cache_directory=".farm-cache")
farm.try_execute_stack("scale", "cpu", farm.HostClient(0), blocked, (np.ones(256),))
print("chosen:", tuner.reports()[-1].winner)
'''


def test_the_report_of_an_in_process_space_search_shows_its_decision_once(tmp_path):
    """docs/spaces.md's decorated space, searched in process: the cache holds the decision and its family record
    (the index a grown space's next search reads); the report shows the one problem."""
    (tmp_path / "app.py").write_text(SPACED)
    ran = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, env=farm_env(), capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    (chosen,) = [line.split()[1] for line in ran.stdout.splitlines() if line.startswith("chosen: ")]
    exported = farm_cli("archive", "export", "--from-cache", ".farm-cache", "--out", "archives", cwd=tmp_path)
    assert exported.returncode == 0 and "exported 2 decisions" in exported.stdout, exported.stdout + exported.stderr
    done = farm_cli("report", "--archive", "archives", "--out", "report.html", cwd=tmp_path)
    assert done.returncode == 0 and "1 problems written" in done.stdout, done.stdout + done.stderr
    page = (tmp_path / "report.html").read_text()
    blob = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    assert blob is not None
    ((problem,),) = [f["problems"] for f in json.loads(blob.group(1))]
    assert (problem["operation"], problem["workload"], problem["reference"], problem["winner"]) == (
        "scale", "numpy:<f8(256,)s(1,)", "reference", chosen)
