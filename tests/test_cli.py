"""The operator's experience (issue 15): exit codes, one-line errors, --help, the tune summary, archive commands,
JSON status and logs. Real `farm` processes (python -m farm_cli) and a private redis-server where a server is needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from farm_helpers import write_catalog
from servers import farm_env, free_port

from farm_cli import main, numbers

SCALE = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 2000, dtype = "float64" }, { n = 13, dtype = "float64" }]
"""
BROKEN = """
[[problems]]
operation = "uxtest_broken"
workloads = [{ n = 16, dtype = "float64" }]
"""
KERNELS = ("--kernels", "farm_testops", "--kernels", "farm_uxops")


def farm(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", *args], capture_output=True, text=True,
                          env=farm_env(env), cwd=cwd, timeout=timeout)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The whole of stderr, which must be one ``farm: error:`` line (no traceback)."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("farm: error: "), done.stderr
    return lines[0]


# -- farm tune: exit status and summary --------------------------------------------------------------------------


def test_tune_exits_1_when_a_problem_fails_and_says_why_and_how_to_retry(tmp_path):
    catalog = write_catalog(tmp_path / "c.toml", SCALE + BROKEN)
    done = farm("tune", str(catalog), "--cache-dir", str(tmp_path / "cache"), *KERNELS, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "3 problems: 2 tuned and published, 0 reused, 1 failed" in " ".join(done.stdout.split())
    assert "the reference stays" in done.stdout  # the columns are explained
    assert "farm: failed:" in done.stderr and "the reference itself is broken" in done.stderr
    assert "rerun `farm tune" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_rerun_of_a_finished_catalog_prints_the_decisions_it_reused(tmp_path):
    catalog = write_catalog(tmp_path / "c.toml", SCALE)
    cache = str(tmp_path / "cache")
    first = farm("tune", str(catalog), "--cache-dir", cache, "--json", *KERNELS, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = farm("tune", str(catalog), "--cache-dir", cache, "--json", *KERNELS, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)
    assert (data["published"], data["reused"], data["failed"]) == (0, 2, 0)
    assert {d["source"] for d in data["decisions"]} == {"reused"}
    assert {d["record"]["name"] for d in data["decisions"]} == {"vectorized"}
    assert {d["workload"] for d in data["decisions"]} == {"n=2000 float64", "n=13 float64"}
    table = farm("tune", str(catalog), "--cache-dir", cache, *KERNELS, cwd=tmp_path)
    assert "reused" in table.stdout and "vectorized" in table.stdout and "--force" in table.stdout


def test_progress_is_logged_as_json_lines_without_a_terminal(tmp_path):
    catalog = write_catalog(tmp_path / "c.toml", SCALE)
    done = farm("tune", str(catalog), "--cache-dir", str(tmp_path / "cache"), "--log-json", *KERNELS, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    progress = [r for r in records if r["logger"] == "farm.coordinator"]
    assert progress and progress[-1]["progress"]["published"] == 2 and progress[-1]["level"] == "INFO"
    assert progress[-1]["progress"]["trials"] == progress[-1]["progress"]["trials_total"] > 0


def test_an_undecodable_catalog_is_one_line_naming_the_file(tmp_path):
    catalog = tmp_path / "latin1.toml"
    catalog.write_bytes(b"# caf\xe9\n[[problems]]\n")
    assert "latin1.toml" in one_line_error(farm("tune", str(catalog), cwd=tmp_path))


def test_a_kernels_module_that_cannot_be_imported_is_named(tmp_path):
    catalog = write_catalog(tmp_path / "c.toml", SCALE)
    line = one_line_error(farm("tune", str(catalog), "--kernels", "no_such_ops_module", cwd=tmp_path))
    assert "no_such_ops_module" in line and "cannot import" in line


# -- connection problems: one line, exit 2 ------------------------------------------------------------------------


@pytest.mark.parametrize(("broker", "expected"), [
    ("redis//host", "is not a URL"),
    ("http://127.0.0.1:1/", "unsupported broker scheme 'http'"),
    ("redis://", "names no host"),
])
def test_a_malformed_broker_url_is_one_line(tmp_path, broker, expected):
    catalog = write_catalog(tmp_path / "c.toml", SCALE)
    for command in (["tune", str(catalog), *KERNELS], ["worker", "--device", "cpu:0"]):
        line = one_line_error(farm(*command, "--broker", broker, "--redis", "redis://127.0.0.1:1/1", cwd=tmp_path))
        assert expected in line and "FARM_BROKER_URL" in line


def test_a_dead_broker_is_one_line_for_tune_and_worker(redis_srv, tmp_path):
    catalog = write_catalog(tmp_path / "c.toml", SCALE)
    dead = f"redis://127.0.0.1:{free_port()}/0"
    for command in (["tune", str(catalog), *KERNELS], ["worker", "--device", "cpu:0"]):
        line = one_line_error(farm(*command, "--broker", dead, "--redis", redis_srv.url(1), cwd=tmp_path))
        assert "cannot reach the broker" in line


def test_a_dead_decisions_redis_is_one_line_for_tune_worker_and_status(redis_srv, tmp_path):
    catalog = write_catalog(tmp_path / "c.toml", SCALE)
    dead = f"redis://127.0.0.1:{free_port()}/1"
    for command in (["tune", str(catalog), *KERNELS], ["worker", "--device", "cpu:0"]):
        line = one_line_error(farm(*command, "--broker", redis_srv.url(0), "--redis", dead, cwd=tmp_path))
        assert "cannot reach the decisions Redis" in line
    assert "cannot reach Redis" in one_line_error(farm("status", "--redis", dead, cwd=tmp_path))


# -- --help, options ---------------------------------------------------------------------------------------------


def test_help_shows_the_environment_variables():
    for command in ([], ["tune"], ["worker"], ["status"], ["flower"]):
        shown = CliRunner().invoke(main, [*command, "--help"]).output
        for variable in ("FARM_BROKER_URL", "FARM_REDIS_URL", "FARM_FLOWER_BASIC_AUTH"):
            assert variable in shown, (command, variable)


def test_loglevel_is_a_choice():
    done = CliRunner().invoke(main, ["worker", "--device", "cpu:0", "--broker", "redis://h/0", "--redis", "redis://h/1",
                                     "--loglevel", "LOUD"])
    assert done.exit_code == 2 and "'LOUD' is not one of" in done.output


def test_status_json_gives_numbers_as_numbers():
    data = {"runs": [{"run": "r1", "pid": "12", "started": "1.5", "done": "3", "state": "running"}],
            "workers": [{"pid": "7", "updated": "2.25", "worker_id": "w"}]}
    assert numbers(data) == {"runs": [{"run": "r1", "pid": 12, "started": 1.5, "done": 3, "state": "running"}],
                             "workers": [{"pid": 7, "updated": 2.25, "worker_id": "w"}]}


# -- farm archive ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """An embedded run's cache, exported twice (the second after a forced re-run with the same winners)."""
    tmp = tmp_path_factory.mktemp("archive")
    catalog = write_catalog(tmp / "c.toml", SCALE)
    cache = str(tmp / "cache")
    assert farm("tune", str(catalog), "--cache-dir", cache, *KERNELS, cwd=tmp).returncode == 0
    assert farm("archive", "export", "--from-cache", cache, "--out", str(tmp / "a"), cwd=tmp).returncode == 0
    assert farm("tune", str(catalog), "--cache-dir", cache, "--force", *KERNELS, cwd=tmp).returncode == 0
    assert farm("archive", "export", "--from-cache", cache, "--out", str(tmp / "b"), cwd=tmp).returncode == 0
    return tmp


def test_inspect_of_an_unknown_operation_is_an_error_naming_the_known_ones(exported):
    line = one_line_error(farm("archive", "inspect", str(exported / "a"), "--operation", "farmtest_scal",
                               cwd=exported))
    assert "farmtest_scal" in line and "operations: farmtest_scale" in line


def test_inspect_labels_workloads_as_tune_does(exported):
    done = farm("archive", "inspect", str(exported / "a"), *(), cwd=exported)
    assert done.returncode == 0
    assert "n=2000 float64" in done.stdout and "dtype=" not in done.stdout


def test_diff_ignores_a_new_creation_time_and_shows_only_real_changes(exported):
    (a,), (b,) = (exported / "a").iterdir(), (exported / "b").iterdir()
    done = farm("archive", "diff", str(a), str(b), "--json", cwd=exported)
    assert done.returncode == 0, done.stderr
    diff = json.loads(done.stdout)
    assert diff["changed"] == []
    for pair in diff["updated"]:  # a re-run's ratios may differ; an update is never about the time alone
        assert (pair["ratio_a"], pair["verified_a"]) != (pair["ratio_b"], pair["verified_b"])
    assert diff["unchanged"] + len(diff["updated"]) == 2
    same = farm("archive", "diff", str(a), str(a), cwd=exported)
    assert "0 updated, 2 unchanged" in " ".join(same.stdout.split())


def test_archive_export_reads_farm_redis_url_unless_a_cache_is_named(redis_srv, exported, tmp_path):
    env = {"FARM_REDIS_URL": redis_srv.url(1)}
    redis_srv.client(1).flushall()
    from_env = farm("archive", "export", "--out", str(tmp_path / "r"), cwd=tmp_path, env=env)
    assert from_env.returncode == 0, from_env.stderr
    assert "no fingerprints to export" in from_env.stdout
    from_cache = farm("archive", "export", "--from-cache", str(exported / "cache"), "--out", str(tmp_path / "c"),
                      cwd=tmp_path, env=env)
    assert from_cache.returncode == 0, from_cache.stderr
    assert "exported 2 decisions" in from_cache.stdout


def test_catalog_duplicates_are_found_with_defaults_filled_in(tmp_path):
    catalog = write_catalog(tmp_path / "c.toml", """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 16, dtype = "float64" }, { n = 16, dtype = "float64", seed = 0 }]
""")
    line = one_line_error(farm("tune", str(catalog), *KERNELS, cwd=tmp_path))
    assert "problems[0].workloads[1]" in line and "duplicates problems[0].workloads[0]" in line


@pytest.mark.servers
def test_a_worker_logs_json_lines_with_task_results_only_at_debug(redis_srv, tmp_path):
    import uuid

    from farm_helpers import WORKER_ENV
    from servers import wait_for, wait_worker_ready

    from farm_coordinator.catalog import load_catalog
    from farm_coordinator.run import RunOptions, tune
    from farm_fleet.settings import Settings

    prefix = f"t{uuid.uuid4().hex[:8]}"
    redis_srv.client(0).flushall()
    env = farm_env({**WORKER_ENV, "FARM_PREFIX": prefix})
    settings = Settings.from_env(env, broker_url=redis_srv.url(0), redis_url=redis_srv.url(1))

    def start(level: str):
        log = tmp_path / f"worker-{level}.log"
        args = [sys.executable, "-m", "farm_cli", "worker", "--device", "cpu:0", "--broker", settings.broker_url,
                "--redis", settings.redis_url, "--kernels", "farm_testops", "--log-json", "--loglevel", level]
        with open(log, "wb") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                                       start_new_session=True)
        from servers import WorkerProcess

        worker = WorkerProcess("cpu:0", process, log)
        wait_worker_ready(worker, redis_srv.client(1), prefix)
        return worker

    from farm_cli import celery_parts

    catalog = load_catalog(write_catalog(tmp_path / "c.toml", SCALE), ("farm_testops",))
    for level in ("INFO", "DEBUG"):
        worker = start(level)
        try:
            tune(catalog, celery_parts(settings), settings, RunOptions(force=True))
            wait_for(lambda w=worker: "succeeded in" in w.output(), 30, "the task's success line")
        finally:
            worker.stop()
        records = [json.loads(line) for line in worker.output().splitlines() if line.startswith("{")]
        assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
        done = [r for r in records if r["logger"] == "celery.app.trace" and "succeeded in" in r["message"]]
        assert done and all(r["level"] == "INFO" and "'names'" not in r["message"] for r in done)
        results = [r for r in records if r["logger"] == "farm.workers.results"]
        if level == "INFO":
            assert results == []
        else:
            assert results and all(r["level"] == "DEBUG" and "'names'" in r["message"] for r in results)


@pytest.mark.servers
def test_an_interrupted_fleet_run_exits_130_and_is_not_left_running_in_status(redis_srv, tmp_path):
    import signal
    import uuid

    from farm_helpers import WORKER_ENV
    from servers import start_worker, wait_for, wait_worker_ready

    prefix = f"t{uuid.uuid4().hex[:8]}"
    redis_srv.client(0).flushall()
    env = farm_env({**WORKER_ENV, "FARM_PREFIX": prefix})
    broker, results = redis_srv.url(0), redis_srv.url(1)
    worker = start_worker("cpu:0", broker, results, tmp_path / "w", env, kernels=("farm_testops", "farm_uxops"))
    try:
        wait_worker_ready(worker, redis_srv.client(1), prefix)
        slow = "\n".join(f'[[problems]]\noperation = "uxtest_slow"\nworkloads = [{{ n = {n}, dtype = "float64" }}]'
                         for n in range(16, 96, 4))
        catalog = write_catalog(tmp_path / "c.toml", slow)
        args = [sys.executable, "-m", "farm_cli", "tune", str(catalog), "--broker", broker, "--redis", results,
                *KERNELS, "--log-json"]
        coordinator = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                       cwd=tmp_path)

        def running() -> list[dict]:
            status = farm("status", "--json", "--redis", results, cwd=tmp_path, env={"FARM_PREFIX": prefix})
            runs = json.loads(status.stdout)["runs"] if status.returncode == 0 else []
            return [r for r in runs if r["state"] == "running" and r["done"] > 0]

        wait_for(running, 120, "the run to be running with groups done")
        coordinator.send_signal(signal.SIGINT)
        _, err = coordinator.communicate(timeout=120)
        assert coordinator.returncode == 130, err[-2000:]
        assert "farm: interrupted" in err and "rerun `farm tune" in err and "Traceback" not in err
        status = farm("status", "--json", "--redis", results, cwd=tmp_path, env={"FARM_PREFIX": prefix})
        (run,) = json.loads(status.stdout)["runs"]
        assert run["state"] == "interrupted"
        assert isinstance(run["pid"], int) and isinstance(run["done"], int) and isinstance(run["started"], float)
    finally:
        worker.stop()
