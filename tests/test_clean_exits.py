"""Clean exits: `farm archive` commands end with their own status (or one line for a missing extra), never an abort
in pyarrow's shutdown, and the farm's Redis clients are closed (no ResourceWarning at exit), proven in fresh
interpreters."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from servers import farm_env

import farm_archives
from farm.environment import fingerprint_digest
from farm.identity import Candidate, Problem, Scope, cache_key, fields, key_environment, split_fields
from farm.policy import StackPolicy
from farm.stores import archive as arc
from farm.stores.base import DecisionRecord

FP = fields(["host-numpy", "cpu", "model A", "driver 1", "cpython", "build 1", "", "opts"])


def archive(parent: Path, workloads: tuple[str, ...]) -> Path:
    entries = []
    for w in workloads:
        key = cache_key(Problem(Scope.OPERATOR, "scale", FP, w, persistent=True),
                        [Candidate("ref"), Candidate("fast")], 0, StackPolicy())
        meta = {"run": "r", "operation": split_fields(key)[2], "fingerprint": fingerprint_digest(key_environment(key))}
        entries.append(arc.ArchiveEntry(DecisionRecord(key, 1, 0, "fast", True, 0.5, time.time(), meta), None, ()))
    return farm_archives.write_archive(parent, FP, entries).path


def python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=farm_env(), cwd=cwd,
                          timeout=120)


def test_archive_commands_exit_with_their_status_and_never_abort_at_shutdown(tmp_path):
    a = archive(tmp_path / "a", ("n=1", "n=2"))
    b = archive(tmp_path / "b", ("n=2", "n=3"))
    for _ in range(8):  # the abort was a race: several fresh processes of each command
        for command in (["diff", str(a), str(b)], ["inspect", str(a), "--json"]):
            done = python("-m", "farm_cli", "archive", *command, cwd=tmp_path)
            assert (done.returncode, "terminate called" in done.stderr) == (0, False), done.stderr
            assert done.stdout.strip()  # the output was flushed before the exit
    missing = python("-m", "farm_cli", "archive", "inspect", str(tmp_path / "none"), cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr


def test_the_exit_after_pyarrow_keeps_the_status_and_flushes_the_output(tmp_path):
    script = ("import sys, pyarrow; from farm_cli.exit import finish; sys.stdout.write('out'); "
              "sys.stderr.write('err'); finish(3)")
    done = python("-c", script, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out", "err")
    message = python("-c", "import pyarrow; from farm_cli.exit import finish; finish('bad thing')", cwd=tmp_path)
    assert (message.returncode, message.stderr.strip()) == (1, "bad thing")
    plain = python("-c", "from farm_cli.exit import finish; finish(None)", cwd=tmp_path)
    assert plain.returncode == 0


RUNTIME_SCRIPT = """
import gc, sys
import farm
from farm.identity import Candidate, Problem, Scope
from farm.stores.redis import RedisDecisions

url = sys.argv[1]
store = RedisDecisions(url)
store.fingerprints()
tuner = farm.StackTuner(farm.StackPolicy(mode=farm.Mode.CACHE_ONLY), fleet=[url])
from farm.feedback import FleetReporter
tuner.feedback = FleetReporter(url)
problem = Problem(Scope.OPERATOR, "scale", "host-env", "n=1", persistent=True)
from fakes import FakeRunner
tuner.select(problem, [Candidate("ref"), Candidate("fast")], 0, FakeRunner())
del store, tuner
gc.collect()
print("done")
"""


def _clean(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_the_farms_redis_clients_leave_no_unclosed_socket_at_exit(redis_srv, tmp_path):
    """Fresh interpreters in development mode with ResourceWarning an error: a runtime with a Redis fleet tier
    and fleet feedback, and the CLI's Redis commands, end with every socket closed (an unclosed one is reported
    on stderr at exit, where no test run would see it)."""
    url = redis_srv.url(5)
    strict = ["-X", "dev", "-W", "error::ResourceWarning"]
    _clean(python(*strict, "-c", RUNTIME_SCRIPT, url, cwd=tmp_path))
    for command in (["status", "--redis", url], ["archive", "export", "--redis", url, "--out", "out"]):
        _clean(python(*strict, "-m", "farm_cli", *command, cwd=tmp_path))
    archive(tmp_path / "a", ("n=1",))
    imported = python(*strict, "-m", "farm_cli", "archive", "import", str(tmp_path / "a"), "--redis", url,
                      "--allow-unsigned", cwd=tmp_path)
    _clean(imported)
    assert "imported archive" in imported.stdout


def test_an_import_without_cryptography_is_one_line_naming_the_install_command(tmp_path):
    key = farm_archives.load_signing_key(farm_archives.generate_keys(tmp_path / "keys", "k")[0])
    folder = farm_archives.write_archive(tmp_path / "a", FP, [], signer=key).path
    script = ("import sys; sys.modules['cryptography'] = None; from farm_cli import main; "
              "main(args=sys.argv[1:], prog_name='farm')")
    done = python("-c", script, "archive", "import", str(folder), "--into-cache", str(tmp_path / "c"),
                  "--trusted-keys", key.public.line(), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == ("farm: error: this command needs cryptography, which is not installed: "
                           "pip install 'tuning-farm[farm]'\n")
