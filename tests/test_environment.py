"""Environment identity: a device CLASS fingerprint, deployment tags, and session-only identities."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm import environment
from farm.environment import (
    BUILD_TAG,
    CONTEXT_TAG,
    DRIVER_TAG,
    build_identity,
    clear_environment_memo,
    fingerprint_digest,
    probe_environment,
    runtime_environment,
    session_identity,
)
from farm.identity import DEFAULT_CONTEXT
from farm.runtimes.host import HostClient

ROOT = Path(__file__).resolve().parent.parent


class NoDriverClient(HostClient):
    def driver_fingerprint(self) -> str | None:
        return None


def test_the_fingerprint_names_the_device_class_not_its_index() -> None:
    assert runtime_environment(HostClient(0)) == runtime_environment(HostClient(1))
    assert "cpu:0" not in runtime_environment(HostClient(0)).fingerprint


def test_a_host_with_a_known_driver_and_build_is_persistent() -> None:
    env = runtime_environment(HostClient(0))
    assert env.persistent is True
    assert build_identity() in env.fingerprint and "session-only" not in env.fingerprint
    assert env.execution_context == DEFAULT_CONTEXT


def test_the_build_identity_is_the_version_plus_a_source_hash() -> None:
    version, _, digest = build_identity().partition("+")
    assert version and len(digest) == 20 and int(digest, 16) >= 0


@pytest.mark.parametrize("tag", [DRIVER_TAG, BUILD_TAG])
def test_driver_and_build_tags_change_the_fingerprint(tag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = probe_environment(HostClient(0))
    monkeypatch.setenv(tag, "deploy-42")
    after = probe_environment(HostClient(0))
    assert after.fingerprint != before.fingerprint and "deploy-42" in after.fingerprint
    assert after.persistent is True


def test_the_context_tag_sets_the_execution_context_not_the_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    before = probe_environment(HostClient(0))
    monkeypatch.setenv(CONTEXT_TAG, "shared-8-gpu-node")
    after = probe_environment(HostClient(0))
    assert after.execution_context == "shared-8-gpu-node"
    assert after.fingerprint == before.fingerprint


def test_an_empty_context_tag_means_the_default_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONTEXT_TAG, "")
    assert probe_environment(HostClient(0)).execution_context == DEFAULT_CONTEXT


def test_without_a_driver_identity_the_environment_is_session_only() -> None:
    env = probe_environment(NoDriverClient(0))
    assert env.persistent is False
    assert session_identity() in env.fingerprint


def test_a_driver_tag_asserts_a_driver_that_could_not_be_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DRIVER_TAG, "driver 550.54")
    env = probe_environment(NoDriverClient(0))
    assert env.persistent is True
    assert "driver 550.54" in env.fingerprint and "session-only" not in env.fingerprint


def test_an_unavailable_build_identity_makes_the_environment_session_only(monkeypatch: pytest.MonkeyPatch) -> None:
    known = probe_environment(HostClient(0))
    monkeypatch.setattr(environment, "build_identity", lambda: environment.UNAVAILABLE)
    env = probe_environment(HostClient(0))
    assert env.persistent is False
    assert session_identity() in env.fingerprint
    assert env.fingerprint != known.fingerprint


def session_fingerprint_in_a_new_process() -> str:
    script = (
        "from farm import environment\n"
        "environment.build_identity = lambda: environment.UNAVAILABLE\n"
        "from farm.runtimes.host import HostClient\n"
        "print(environment.probe_environment(HostClient(0)).fingerprint)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_session_only_fingerprint_is_unique_to_its_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "build_identity", lambda: environment.UNAVAILABLE)
    here = probe_environment(HostClient(0)).fingerprint
    assert session_fingerprint_in_a_new_process() != here
    assert probe_environment(HostClient(0)).fingerprint == here  # stable within the process


def test_probing_is_memoized_until_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    first = runtime_environment(HostClient(0))
    monkeypatch.setenv(BUILD_TAG, "later")
    assert runtime_environment(HostClient(0)) is first  # tags must be set before first use
    clear_environment_memo()
    assert runtime_environment(HostClient(0)) != first


def test_the_digest_is_sixteen_hex_digits_of_the_fingerprint() -> None:
    env = runtime_environment(HostClient(0))
    assert env.digest == fingerprint_digest(env.fingerprint) and len(env.digest) == 16
    assert int(env.digest, 16) >= 0


def test_the_build_identity_hashes_the_package_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "probe_kernels_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kernel.cu").write_text("__global__ void k() {}")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(environment, "BUILD_PACKAGES", ("probe_kernels_pkg",))
    uncached = environment.build_identity.__wrapped__
    before = uncached()
    (package / "kernel.cu").write_text("__global__ void k() { /* changed */ }")
    assert uncached() != before
    (package / "notes.txt").write_text("not source")
    after = uncached()
    (package / "notes.txt").write_text("still not source")
    assert uncached() == after


def test_the_build_identity_is_unavailable_when_no_package_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "BUILD_PACKAGES", ("no_such_package_for_farm_tests",))
    assert environment.build_identity.__wrapped__() == environment.UNAVAILABLE
