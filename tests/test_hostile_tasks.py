"""Hostile task messages (issue 12.1): a message never chooses what a worker imports. A real `farm worker` on a
private redis-server receives a task that names a module which would write a marker file when imported."""

from __future__ import annotations

import uuid

import pytest
from servers import farm_env, start_worker, wait_for, wait_worker_ready

from farm_fleet import presence
from farm_fleet.protocol import GROUP_TASK, STATUS_FAILED, GroupKey, GroupTask
from farm_fleet.results import RedisResults
from farm_fleet.settings import Settings

pytestmark = pytest.mark.servers

MARKER_MODULE = """
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("a task message made the worker import me")
"""


def test_a_task_naming_a_module_the_worker_lacks_fails_clearly_and_imports_nothing(redis_srv, tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "farmtest_marker.py").write_text(MARKER_MODULE)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    redis_srv.client(0).flushall()
    env = farm_env({"FARM_PREFIX": prefix})
    env["PYTHONPATH"] = f"{plugins}:{env['PYTHONPATH']}"  # importable on the worker: only a message could ask
    settings = Settings.from_env(env, broker_url=redis_srv.url(0), redis_url=redis_srv.url(1))
    client = redis_srv.client(1)
    worker = start_worker("cpu:0", settings.broker_url, settings.redis_url, tmp_path / "w", env)
    try:
        wait_worker_ready(worker, client, prefix)
        digest = presence.live_workers(client, settings)[0].fingerprint
        from celery import Celery

        from farm_fleet.celeryconf import celery_config

        app = Celery("hostile", set_as_current=False)
        app.conf.update(celery_config(settings))
        task = GroupTask("hostile-run", "p1", "g0", "farmtest_marker_op", "cpu", {"n": 8, "dtype": "float64"},
                         (("candidate", "1"),),
                         {}, digest, ("farmtest_marker",))
        app.send_task(GROUP_TASK, args=[[task.to_dict()]], queue=settings.fingerprint_queue(digest))
        results = RedisResults(client, settings)
        wait_for(lambda: results.get(GroupKey("hostile-run", "p1", "g0")) is not None, 60, "the hostile task's result")
        result = results.get(GroupKey("hostile-run", "p1", "g0"))
        assert result is not None and result.status == STATUS_FAILED
        assert "no operation 'farmtest_marker_op'" in (result.error or "")
        assert "farmtest_marker" in (result.error or "")
        assert not (plugins / "IMPORTED").exists()
        app.close()
    finally:
        worker.stop()
