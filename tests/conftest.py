"""Shared fixtures. The server helpers (redis-server, farm workers) live in tests/servers.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import farm.interference
from farm import adapter
from farm.environment import clear_environment_memo


def cuda_available() -> bool:
    from farm.runtimes.cuda import device_count

    return device_count() > 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not cuda_available():
        skip = pytest.mark.skip(reason="no CUDA device (CuPy or a GPU is missing)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_controller(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Each test gets no installed controller, fresh environment probes and its own device-lock folder."""
    adapter._uninstall_for_tests()
    clear_environment_memo()
    monkeypatch.setenv("FARM_LOCK_DIR", str(tmp_path_factory.mktemp("locks")))
    for tag in ("FARM_AUTOTUNE_DRIVER_TAG", "FARM_AUTOTUNE_BUILD_TAG", "FARM_AUTOTUNE_CONTEXT_TAG"):
        monkeypatch.delenv(tag, raising=False)
    # Archives are refused unsigned by default (docs/archives.md, "Signatures"). The suite's archive tests are about
    # what archives hold, so they run in development mode; tests/test_signed_archives.py and tests/test_readme.py
    # unset it and prove the strict default, as a user meets it.
    monkeypatch.setenv("FARM_ALLOW_UNSIGNED", "1")
    for name in ("FARM_TRUSTED_KEYS", "FARM_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)
    # The host's scheduler must not decide a test: pairs timed in this process count no context switches
    # (tests/test_interference.py proves the real counter and a probe that sees switches).
    monkeypatch.setattr(farm.interference, "_switches", lambda: 0)
    yield
    adapter._uninstall_for_tests()
    clear_environment_memo()


sys.path.insert(0, str(Path(__file__).parent))  # tests/servers.py, tests/farm_testops.py
from servers import IN_CI  # noqa: E402


@pytest.fixture(scope="session")
def redis_srv(tmp_path_factory: pytest.TempPathFactory):
    """A private redis-server for the whole session (fails the run if redis-server is missing)."""
    from servers import redis_server

    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def redis_db(redis_srv):
    """Database 1 of the private server, emptied (with the broker's database 0) before the test."""
    client = redis_srv.client(1)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def rabbitmq_srv(tmp_path_factory: pytest.TempPathFactory):
    """A private RabbitMQ node for the whole session (rabbitmq.RabbitMQNode: own node name, ports, data, cookie);
    never the machine's RabbitMQ. Without rabbitmq-server the test skips, or fails when CI=true."""
    from rabbitmq import rabbitmq_node

    with rabbitmq_node(tmp_path_factory.mktemp("rabbitmq")) as node:
        yield node


@pytest.fixture(scope="session")
def chromium():
    """A real headless Chromium (tests/browser.py) for the session; skips without it, fails when CI=true."""
    from browser import HINT, binaries, headless_chromium

    if binaries() is None:
        message = f"chromium or chromedriver is not installed, so the page is not opened in a browser: {HINT}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    with headless_chromium() as session:
        yield session
