"""`farm flower` for real: Flower on a free loopback port against the private redis-server and a real `farm worker`.

Without credentials the dashboard and the API answer 401; with them the API lists the worker, and a finished
trial task (``farm.run_groups:<operation>``, sent by the coordinator) appears with that one name and its state.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from farm_helpers import Fleet, fleet, write_catalog
from servers import free_port, start_worker, wait_for, wait_worker_ready

from farm.errors import ConfigError
from farm_workers.flower import check_basic_auth, credentials, flower_argv, run_flower

USER, PASSWORD = "operator", "s3cret-flower-pass"
KERNELS = ("farm_testops", "farm_uxops")  # farm_uxops: uxtest_broken, whose reference fails every group
SCALE = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 200, dtype = "float64" }]
"""


@dataclass
class Flower:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, auth: tuple[str, str] | None = (USER, PASSWORD), method: str = "GET") -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            headers = {}
            if auth is not None:
                headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
            connection.request(method, path, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, (path, status, body[:500])
        return json.loads(body)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def flower_process(f: Fleet, directory: Path) -> Iterator[Flower]:
    port = free_port()
    log = directory / "flower.log"
    args = [sys.executable, "-m", "farm_cli", "flower", "--broker", f.broker, "--address", "127.0.0.1",
            "--port", str(port)]  # the credentials come from the environment, never the command line
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                   env={**f.env, "FARM_FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}"}, cwd=directory,
                                   start_new_session=True)
    flower = Flower(port, process, log)
    try:
        def answers() -> bool:
            if process.poll() is not None:
                pytest.fail(f"farm flower exited with {process.returncode}:\n{flower.output()[-4000:]}")
            try:
                return flower.get("/healthcheck", auth=None)[0] == 200
            except OSError:
                return False

        wait_for(answers, 60, "Flower to answer on its port")
        yield flower
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture(scope="module")
def farm_with_flower(redis_srv, tmp_path_factory):
    directory = tmp_path_factory.mktemp("flower")
    with fleet(redis_srv, directory, ()) as f:
        worker = start_worker("cpu:0", f.broker, f.results_url, directory, f.env, kernels=KERNELS)
        f.workers.append(worker)
        wait_worker_ready(worker, f.client(), f.settings.prefix)
        with flower_process(f, directory) as flower:
            yield f, flower


def nodename(f: Fleet) -> str:
    client = f.client()
    try:
        (key,) = list(client.scan_iter(match=f"{f.settings.prefix}:worker:*"))
        return str(client.hget(key, "hostname"))
    finally:
        client.close()


# -------------------------------------------------------------------------------------- without a server


@pytest.mark.parametrize("value", ["", "   ", "operator", ":pw", "operator:", "a:b,", "a:b,,c:d", " a:b", "a b:c"])
def test_an_empty_or_malformed_basic_auth_is_refused_naming_the_variable_and_never_the_password(value):
    with pytest.raises(ConfigError) as refused:
        run_flower("redis://127.0.0.1:1/0", "127.0.0.1", 5555, value, ())
    message = str(refused.value)
    assert "FARM_FLOWER_BASIC_AUTH" in message and "--basic-auth" in message
    for secret in ("pw", ":b", "c:d"):
        if secret in value:
            assert secret not in message


def test_well_formed_credentials_are_accepted_one_or_several():
    assert check_basic_auth("operator:pw") == ["operator:pw"]
    assert check_basic_auth("a:x:y,b:z") == ["a:x:y", "b:z"]  # a password may hold a colon
    assert flower_argv("0.0.0.0", 5555, "a:x", ["--url-prefix=flower"]) == [
        "flower", "--address=0.0.0.0", "--port=5555", "--basic-auth=a:x", "--url-prefix=flower"]


@pytest.mark.parametrize("option", [
    "--basic-auth=x:y", "--basic_auth=x:y", "-basic_auth=guest:guest", "-basic-auth=x:y", "---basic_auth=x:y",
    "--Basic_Auth=x:y", "--basic-auth", "--auth=.*@example.com", "-auth=.*", "--auth_provider=x", "--conf=evil.py",
    "--oauth2_key=k",
])
def test_flower_options_cannot_replace_the_credentials_in_any_spelling(option):
    with pytest.raises(ConfigError, match="only through FARM_FLOWER_BASIC_AUTH / --basic-auth-file"):
        flower_argv("127.0.0.1", 5555, "a:x", ["--url-prefix=flower", option])


def test_flower_refuses_authentication_from_flowers_own_environment_variables(monkeypatch):
    monkeypatch.setenv("FLOWER_BASIC_AUTH", "guest:guest")
    with pytest.raises(ConfigError, match="FLOWER_BASIC_AUTH"):
        flower_argv("127.0.0.1", 5555, "a:x", [])


def test_credentials_come_from_the_environment_or_a_file_never_both(tmp_path):
    assert credentials(None, {"FARM_FLOWER_BASIC_AUTH": "a:x"}) == "a:x"
    secret = tmp_path / "auth"
    secret.write_text("# flower users\nb:y,c:z\n")
    assert credentials(secret, {}) == "b:y,c:z"
    with pytest.raises(ConfigError, match="not both"):
        credentials(secret, {"FARM_FLOWER_BASIC_AUTH": "a:x"})
    with pytest.raises(ConfigError, match="required"):
        credentials(None, {})
    with pytest.raises(ConfigError, match="cannot read"):
        credentials(tmp_path / "missing", {})


def test_farm_flower_without_credentials_exits_with_an_error_before_starting(tmp_path):
    from farm_cli import main

    env = {"FARM_FLOWER_BASIC_AUTH": ""}
    missing = CliRunner().invoke(main, ["flower", "--broker", "redis://127.0.0.1:1/0"], env=env)
    assert missing.exit_code == 2 and "FARM_FLOWER_BASIC_AUTH" in missing.output
    bad = tmp_path / "auth"
    bad.write_text("nopass\n")
    malformed = CliRunner().invoke(main, ["flower", "--broker", "redis://127.0.0.1:1/0", "--basic-auth-file", str(bad)],
                                   env=env)
    assert malformed.exit_code == 2
    assert "farm: error:" in malformed.output and "FARM_FLOWER_BASIC_AUTH" in malformed.output
    flag = CliRunner().invoke(main, ["flower", "--broker", "redis://127.0.0.1:1/0", "--basic-auth", "a:b"], env=env)
    assert flag.exit_code == 2  # no credentials on the command line: `ps` would show them


# ------------------------------------------------------------------------------------------- with servers


@pytest.mark.servers
def test_flower_answers_401_to_the_dashboard_and_the_api_without_valid_credentials(farm_with_flower):
    f, flower = farm_with_flower
    worker = nodename(f)
    for path in ("/", "/workers", "/tasks", "/broker", "/api/workers", "/api/tasks", "/api/task/types"):
        for auth in (None, (USER, "wrong-password"), ("intruder", PASSWORD)):
            status, _ = flower.get(path, auth=auth)
            assert status == 401, (path, auth, status)
    # No control action either: the worker is still there afterwards.
    status, _ = flower.get(f"/api/worker/shutdown/{worker}", auth=None, method="POST")
    assert status == 401
    assert f.workers[0].process.poll() is None
    assert flower.get("/", auth=(USER, PASSWORD))[0] == 200


@pytest.mark.servers
def test_flower_lists_the_worker_with_credentials(farm_with_flower):
    f, flower = farm_with_flower
    worker = nodename(f)
    listed = wait_for(lambda: worker in flower.json("/api/workers?refresh=1"), 30, "/api/workers to list the worker")
    assert listed
    workers = flower.json("/api/workers")
    queues = {q["name"] for q in workers[worker]["active_queues"]}
    assert any(q.startswith("farm.fp.") for q in queues) and any(q.startswith("farm.worker.") for q in queues)
    assert "farm.run_groups" in workers[worker]["registered"]


@pytest.mark.servers
def test_a_finished_trial_task_appears_in_flower_with_its_name_and_state(farm_with_flower, tmp_path):
    from farm_coordinator.catalog import load_catalog
    from farm_coordinator.run import tune

    f, flower = farm_with_flower
    worker = nodename(f)
    # Flower has the worker's heartbeat events, so its event receiver is subscribed before the task is sent.
    wait_for(lambda: flower.json("/api/workers?status=1").get(worker), 30, "Flower to receive the worker's events")

    catalog = load_catalog(write_catalog(tmp_path / "c.toml", SCALE), ("farm_testops",))
    summary = tune(catalog, f.coordinator(), f.settings)
    assert summary.published == 1

    def finished() -> list[dict[str, Any]]:
        tasks = flower.json("/api/tasks")
        return [t for t in tasks.values() if t.get("name") == "farm.run_groups:farmtest_scale"
                and t.get("state") == "SUCCESS"]

    tasks = wait_for(finished, 30, "the trial task to appear in /api/tasks as SUCCESS")
    assert all(t["worker"] == worker for t in tasks)
    # Named per operation, so Flower's pages and metrics split by operation, and by that one name from the
    # coordinator's task-sent event to the worker's task-succeeded (issue 34, item 12): never the bare farm.run_groups.
    types = flower.json("/api/task/types")["task-types"]
    assert "farm.run_groups:farmtest_scale" in types and "farm.run_groups" not in types, types
    sent = [t for t in flower.json("/api/tasks").values() if t.get("worker") is None]
    assert sent == [], sent  # every task Flower saw sent was received by the worker under the same name


@pytest.mark.servers
def test_a_group_that_failed_in_the_farm_is_a_failure_in_flower_with_the_groups_error(farm_with_flower, tmp_path):
    from farm_coordinator.catalog import load_catalog
    from farm_coordinator.run import tune

    f, flower = farm_with_flower
    worker = nodename(f)
    wait_for(lambda: flower.json("/api/workers?status=1").get(worker), 30, "Flower to receive the worker's events")
    broken = '[[problems]]\noperation = "uxtest_broken"\nworkloads = [{ n = 64, dtype = "float64" }]\n'
    catalog = load_catalog(write_catalog(tmp_path / "c.toml", broken), KERNELS)
    summary = tune(catalog, f.coordinator(), f.settings)
    assert summary.published == 0 and summary.failed  # the farm saw the failure ...

    def failed() -> list[dict[str, Any]]:
        tasks = flower.json("/api/tasks")
        return [t for t in tasks.values() if t.get("name") == "farm.run_groups:uxtest_broken"
                and t.get("state") == "FAILURE"]

    (task, *_) = wait_for(failed, 90, "the failed group's task to appear in /api/tasks as FAILURE")  # ... Flower too
    assert "groups failed in the farm" in str(task.get("exception")) and "reference" in str(task.get("exception"))
    assert "Traceback" not in f.workers[0].output()  # an expected outcome, logged as one line
