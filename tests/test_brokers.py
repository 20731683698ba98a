"""Both brokers' configuration: Redis (visibility timeout) and RabbitMQ (quorum queues), and the optional
RabbitMQ compose file. The brokers at work are in test_faults.py (every scenario that spares the broker runs on
both)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from farm_fleet.celeryconf import celery_config, is_amqp
from farm_fleet.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("url, amqp", [
    ("redis://127.0.0.1:6379/0", False),
    ("amqp://guest:guest@127.0.0.1:5672/farm", True),
    ("pyamqp://127.0.0.1//", True),
    (None, False),
])
def test_a_rabbitmq_broker_gets_quorum_queues_and_a_redis_one_keeps_its_visibility_timeout(url, amqp):
    config = celery_config(Settings(broker_url=url, redis_url="redis://127.0.0.1:6379/1"))
    assert is_amqp(url) is amqp
    assert (config.get("task_create_missing_queue_type") == "quorum") is amqp
    assert (config.get("task_default_queue_type") == "quorum") is amqp
    assert ("visibility_timeout" in config["broker_transport_options"]) is not amqp
    assert config["task_acks_late"] and config["task_reject_on_worker_lost"]


def test_the_rabbitmq_compose_file_follows_the_compose_specification_and_moves_every_farm_service():
    from importlib.resources import files

    import jsonschema

    schema = json.loads(files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text())
    override = yaml.safe_load((ROOT / "compose.rabbitmq.yaml").read_text())
    assert [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(override)] == []
    base = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    farm_services = {name for name, s in base.items() if "FARM_BROKER_URL" in (s.get("environment") or {})}
    moved = {name for name, s in override["services"].items()
             if str((s.get("environment") or {}).get("FARM_BROKER_URL", "")).startswith("amqp://")}
    assert farm_services and farm_services <= moved
    assert override["services"]["rabbitmq"]["profiles"] == ["rabbitmq"]
