"""Each Celery app made by create_app owns its worker side: its settings, the context its tasks run in, and the
signal hooks act for the app whose task (or pool process) they are about, never for "the app created last"."""

from __future__ import annotations

from types import SimpleNamespace

from celery import Celery

from farm_fleet.results import RedisResults
from farm_fleet.settings import Settings
from farm_workers.app import FarmWorker, create_app, farm_worker


def settings(prefix: str) -> Settings:
    return Settings(prefix=prefix, redis_url="redis://127.0.0.1:1/0")  # never connected to: clients are lazy


def test_each_app_builds_its_context_from_its_own_settings() -> None:
    first, second = create_app(settings("first")), create_app(settings("second"))
    a, b = farm_worker(first), farm_worker(second)
    assert a is not None and b is not None and a is not b
    ctx_a, ctx_b = a.context(), b.context()
    assert (ctx_a.settings.prefix, ctx_b.settings.prefix) == ("first", "second")
    assert isinstance(ctx_b.results, RedisResults) and ctx_b.results.settings.prefix == "second"
    assert a.context() is ctx_a and a.built is ctx_a  # built once per app in a process


def test_an_app_not_made_by_create_app_has_no_worker_side() -> None:
    assert farm_worker(Celery("other", set_as_current=False)) is None


def test_a_task_signal_acts_for_the_app_of_its_task(monkeypatch) -> None:
    import farm_workers.app as worker_app

    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(FarmWorker, "set_state", lambda self, state: seen.append((self.settings.prefix, state)))
    first, second = create_app(settings("first")), create_app(settings("second"))
    worker_app._busy(sender=SimpleNamespace(app=first))
    worker_app._idle(sender=SimpleNamespace(app=second))
    worker_app._busy(sender=SimpleNamespace(app=Celery("other", set_as_current=False)))
    assert seen == [("first", "busy"), ("second", "healthy")]


def test_a_new_pool_process_releases_orphans_with_the_settings_of_the_app_it_serves(monkeypatch) -> None:
    from celery import _state

    import farm_workers.app as worker_app

    released: list[str] = []
    monkeypatch.setattr(FarmWorker, "release_orphan", lambda self: released.append(self.settings.prefix))
    served, created_last = create_app(settings("served")), create_app(settings("created-last"))
    previous = _state.get_current_app()
    served.set_current()  # as Celery does in a pool process before worker_process_init
    try:
        worker_app._release_orphan()
    finally:
        previous.set_current()
    assert released == ["served"] and farm_worker(created_last) is not None
