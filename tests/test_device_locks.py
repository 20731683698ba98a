"""Device locks on a host shared by several users (issue 12.4): a private per-user folder by default, created
0700 and checked to be ours; a lock that cannot be taken is BUSY (the reference), never a device failure."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FAST, FakeRunner, candidates, problem

from farm.engine import DecisionSource, StackTuner
from farm.errors import DeviceBusy
from farm.runtimes.base import lock_directory
from farm.runtimes.host import HostClient

NOBODY = 65534


@pytest.fixture
def default_locks(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No FARM_LOCK_DIR and no XDG_RUNTIME_DIR: the default folder under a world-writable temp dir of our own."""
    shared = Path(tempfile.mkdtemp(prefix="farm-lock-test-", dir="/tmp"))
    os.chmod(shared, 0o1777)  # like /tmp: every user may create entries, nobody may remove another's
    monkeypatch.delenv("FARM_LOCK_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)
    yield shared
    tempfile.tempdir = None
    shutil.rmtree(shared, ignore_errors=True)


def test_the_default_lock_folder_is_private_to_the_user(default_locks: Path) -> None:
    with HostClient(0).exclusive():
        pass
    folder = lock_directory()
    assert folder == default_locks / f"farm-locks-{os.geteuid()}"
    info = folder.stat()
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
    assert stat.S_IMODE((folder / "cpu-0.lock").stat().st_mode) == 0o600


def test_xdg_runtime_dir_is_preferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FARM_LOCK_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert lock_directory() == tmp_path / "farm-locks"


def test_a_lock_folder_left_open_by_us_is_closed_again(default_locks: Path) -> None:
    folder = default_locks / f"farm-locks-{os.geteuid()}"
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)
    with HostClient(0).exclusive():
        pass
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_symlinked_lock_folder_is_refused(default_locks: Path, tmp_path: Path) -> None:
    (default_locks / f"farm-locks-{os.geteuid()}").symlink_to(tmp_path)
    with pytest.raises(DeviceBusy, match="not a directory"), HostClient(0).exclusive():
        pass


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a folder owned by another user")
def test_a_lock_folder_planted_by_another_user_is_refused_not_used(default_locks: Path) -> None:
    folder = default_locks / f"farm-locks-{os.geteuid()}"
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY, NOBODY)
    with pytest.raises(DeviceBusy, match="belongs to uid 65534"), HostClient(0).exclusive():
        pass


def test_a_lock_that_cannot_be_taken_is_busy_for_the_controller_never_a_quarantine() -> None:
    tuner = StackTuner(FAST)
    runner = FakeRunner({0: DeviceBusy("cannot open device lock /x/cpu-0.lock: Permission denied")})
    decision = tuner.select(problem(), candidates(), 0, runner)
    assert (decision.source, decision.name) == (DecisionSource.BUSY, "ref")
    assert tuner.quarantined() == set()
    assert tuner.stats().busy_fallbacks == 1
    # Once the lock can be taken again, the same key is tuned as usual.
    assert tuner.select(problem(), candidates(), 0, FakeRunner({1: 0.5})).source is DecisionSource.TUNED


def _as_user(uid: int, shared: Path) -> dict[str, object]:
    """Take cpu:0's lock in a forked child running as ``uid`` (same default settings); return what it saw."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the other user, then use the lock exactly as a farm process would
        code = 1
        try:
            os.close(read)
            os.setgid(uid)
            os.setuid(uid)
            tempfile.tempdir = None
            with HostClient(0).exclusive():
                folder = lock_directory()
                out = {"folder": str(folder), "uid": folder.stat().st_uid,
                       "mode": stat.S_IMODE(folder.stat().st_mode)}
            os.write(write, json.dumps(out).encode())
            code = 0
        except BaseException as e:
            with contextlib.suppress(Exception):
                os.write(write, json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        data: dict[str, object] = json.loads(pipe.read() or "{}")
    os.waitpid(pid, 0)
    return data


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as a second user")
def test_two_users_on_one_host_each_get_their_own_locks(default_locks: Path) -> None:
    with HostClient(0).exclusive():  # the first user holds cpu:0 in its own folder...
        other = _as_user(NOBODY, default_locks)  # ...and a second user's tuning is not blocked or broken by it
    assert "error" not in other, other
    assert other["folder"] == str(default_locks / f"farm-locks-{NOBODY}")
    assert other["uid"] == NOBODY and other["mode"] == 0o700
