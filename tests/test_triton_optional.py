"""farm_triton without torch or triton: importing it works; a Triton feature says how to install them.
(The adapter itself is tested in the Triton tier, tests/triton: ``python3 tools/dev.py test --triton``.)"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["torch"] = None  # as if neither were installed
sys.modules["triton"] = None
import farm_triton
from farm.errors import TuneFailure
for use in (lambda: farm_triton.autotune(configs=[], key=[]), lambda: farm_triton.harvest(),
            lambda: farm_triton.operation("x", None, inputs=None, grid=None, outputs=(), reference=0)):
    try:
        use()
    except TuneFailure as e:
        print(e.kind.name, str(e).splitlines()[0])
print("decided", type(farm_triton.decided("x")).__name__)
"""


def test_farm_triton_imports_without_torch_and_a_triton_feature_says_how_to_install_it() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4, done.stdout
    for line in lines[:3]:
        assert line.startswith("UNAVAILABLE") and "pip install torch" in line and "dev.py test --triton" in line
    assert lines[3] == "decided Decided"  # a hook can be built before torch is (it imports nothing)
