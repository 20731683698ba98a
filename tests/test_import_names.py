"""The installed import names are the project's own: Hugging Face's `kernels` installed beside the farm changes nothing.

A fresh virtual environment gets a regular (non-editable) install of this checkout, then Hugging Face's
`kernels` distribution without its dependencies (exactly the state that made the old `import kernels` die with
"No module named 'huggingface_hub'"), and `farm tune` runs the example catalog from a directory outside the checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.install


def pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                   check=True, timeout=600)


def test_hugging_face_kernels_beside_the_farm_does_not_shadow_its_operations(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    pip(python, str(ROOT))
    pip(python, "--no-deps", "kernels")
    clash = subprocess.run([str(python), "-c", "import kernels"], capture_output=True, text=True, cwd=tmp_path)
    # Hugging Face's package is what `kernels` means in this environment (it fails without its dependencies).
    assert clash.returncode != 0 and "huggingface_hub" in clash.stderr, clash.stderr

    environ = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    out = subprocess.run(
        [str(env_dir / "bin" / "farm"), "tune", str(ROOT / "examples" / "catalog.toml"), "--json",
         "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True, cwd=tmp_path, env=environ, timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    decisions = json.loads(out.stdout)["decisions"]
    operations = {d["operation"] for d in decisions if d["record"] is not None}
    assert operations == {"matmul", "softmax", "reduce_sum", "transpose", "bias_gelu_fusion"}, operations
