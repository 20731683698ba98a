"""The Celery configuration shared by workers and coordinators (a plain dict: no Celery import here).

JSON only, late acknowledgement, one prefetched task, task events on (Flower reads them), rejected-on-loss
redelivery (bounded by the farm's own attempt counter), result expiry, and a visibility timeout that outlasts
every hard time limit the coordinator will ask for (``Settings.check_limits``).

Brokers: Redis (``redis://``) or RabbitMQ (``amqp://``). With RabbitMQ the farm's queues are **quorum** queues
(replicated, durable, with a delivery limit): a consumer that dies returns its unacknowledged messages at once,
with no visibility timeout to wait out.
"""

from __future__ import annotations

from typing import Any

from farm_fleet.settings import Settings


def celery_config(settings: Settings) -> dict[str, Any]:
    # Abandoned (unacked) messages of a dead worker are swept back to their queue every `unacked_restore_interval`
    # seconds once older than the visibility timeout; kombu's default throttle would make that 100 s apart.
    transport = {
        "visibility_timeout": int(settings.visibility_timeout),
        "unacked_restore_interval": max(1, min(10, int(settings.visibility_timeout / 10))),
        "unacked_restore_throttle": 1,
    }
    config = {
        "broker_url": settings.broker_url,
        "result_backend": settings.redis_url or settings.broker_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "event_serializer": "json",
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": True,
        "result_expires": int(settings.result_ttl),
        "result_extended": True,
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "task_default_queue": "farm.default",
        "worker_hijack_root_logger": False,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
    }
    if is_amqp(settings.broker_url):
        config.update(amqp_config())
        url, tls = amqp_tls(str(settings.broker_url))
        if tls:
            config["broker_url"], config["broker_use_ssl"] = url, tls
    return config


_AMQP_TLS_KEYS = {"ssl_cert_reqs": "cert_reqs", "ssl_ca_certs": "ca_certs", "ssl_certfile": "certfile",
                  "ssl_keyfile": "keyfile"}


def amqp_tls(url: str) -> tuple[str, dict[str, Any]]:
    """An ``amqps://`` URL's TLS settings, given in its query as for ``rediss://`` (``ssl_cert_reqs=required``,
    ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``), as py-amqp's ``broker_use_ssl`` options, and the URL
    without them (kombu would hand the ``ssl_`` names to py-amqp, which knows them without the prefix)."""
    import ssl
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.scheme != "amqps" or not parts.query:
        return url, {}
    query = parse_qsl(parts.query, keep_blank_values=True)
    tls: dict[str, Any] = {_AMQP_TLS_KEYS[k]: v for k, v in query if k in _AMQP_TLS_KEYS}
    if "cert_reqs" in tls:
        tls["cert_reqs"] = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL,
                            "none": ssl.CERT_NONE}.get(str(tls["cert_reqs"]).lower(), ssl.CERT_REQUIRED)
    rest = urlencode([(k, v) for k, v in query if k not in _AMQP_TLS_KEYS])
    return urlunsplit(parts._replace(query=rest)), tls


def is_amqp(url: str | None) -> bool:
    return bool(url) and str(url).split("://", 1)[0] in ("amqp", "amqps", "pyamqp")


def amqp_config() -> dict[str, Any]:
    """RabbitMQ: every queue the farm declares (fingerprint and worker queues, the default one) is a quorum queue;
    Celery then turns off global QoS and delays retried tasks with RabbitMQ's native delayed delivery."""
    return {
        "task_default_queue_type": "quorum",
        "task_create_missing_queue_type": "quorum",
        "worker_detect_quorum_queues": True,
        "broker_transport_options": {"confirm_publish": True},
    }
