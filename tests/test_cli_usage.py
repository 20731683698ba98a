"""Bad usage as a new user meets it: one `farm: error:` line that blames what was given and says what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import ROOT, farm_env, free_port

from farm.errors import ConfigError
from farm_cli.devices import check_device


def farm(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", *args], capture_output=True, text=True,
                          env=env or farm_env(), cwd=cwd, timeout=120)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("farm: error: ") and "Traceback" not in done.stderr
    return line


def test_farm_status_with_nothing_configured_is_a_farm_error_line_naming_the_option_and_its_variable():
    env = {k: v for k, v in farm_env().items() if not k.startswith("FARM_")}
    line = one_error_line(farm("status", env=env))
    assert "missing --redis (or FARM_REDIS_URL)" in line and "farm status --help" in line
    assert "unknown option" not in one_error_line(farm("status", "--bogus", env=env)).lower()


def test_a_cpu_this_process_cannot_use_is_refused_by_tune_and_worker_alike_blaming_device():
    beyond = f"cpu:{max(os.sched_getaffinity(0)) + 5}"
    dead = f"redis://127.0.0.1:{free_port()}"
    for args in (("tune", str(ROOT / "examples" / "catalog.toml"), "--device", beyond),
                 ("worker", "--device", beyond, "--broker", f"{dead}/0", "--redis", f"{dead}/1")):
        line = one_error_line(farm(*args))
        assert f"--device: field 'device' = '{beyond}'" in line and "is not available to this process" in line
        assert "cores" not in line.split("=", 1)[0]
    cases = [("cpu:3", {0, 1}, "device"), ("gpu:0", {0}, "device"), ("cpu:x", {0}, "device")]
    for device, cpus, field in cases:
        with pytest.raises(ConfigError) as caught:
            check_device(device, available=frozenset(cpus))
        assert caught.value.field == field
    check_device("cpu:1", available=frozenset({0, 1}))
    check_device("cuda:3", available=frozenset({0}))  # CUDA devices are probed later, by the runtime
    with pytest.raises(ConfigError) as caught:
        check_device("cpu:1", "4", available=frozenset({0, 1}))
    assert caught.value.field == "cores"


def test_a_kernels_module_in_the_current_folder_but_not_importable_says_to_set_pythonpath(tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "ops.py").write_text("")
    env = farm_env()
    env["PYTHONPATH"] = ""  # as the `farm` script runs: the current folder is not on the path
    done = subprocess.run([sys.executable, "-P", "-m", "farm_cli", "tune", str(ROOT / "examples" / "catalog.toml"),
                           "--kernels", "mypkg.ops"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    line = one_error_line(done)
    assert "No module named 'mypkg'" in line and "PYTHONPATH=." in line
    elsewhere = subprocess.run([sys.executable, "-P", "-m", "farm_cli", "tune", str(ROOT / "examples" / "catalog.toml"),
                                "--kernels", "nothere.ops"], capture_output=True, text=True, env=env, cwd=tmp_path,
                               timeout=120)
    assert "must be importable" in one_error_line(elsewhere)
