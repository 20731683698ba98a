"""The tests' private RabbitMQ node (tests/rabbitmq.py RabbitMQNode): never the machine's RabbitMQ, and a broker
that can be SIGKILLed and started again on its data, as the broker-fault tests need."""

from __future__ import annotations

import pytest
from servers import wait_for

pytestmark = pytest.mark.servers


def test_the_private_node_has_its_own_name_ports_data_and_cookie(rabbitmq_srv):
    node = rabbitmq_srv
    assert node.port != 5672 and node.name != "rabbit@localhost" and node.name.endswith("@localhost")
    assert node.env()["HOME"] == str(node.directory) and (node.directory / ".erlang.cookie").stat().st_mode & 0o077 == 0
    assert node.env()["ERL_EPMD_PORT"] != "4369" and str(node.dist_port) == node.env()["RABBITMQ_DIST_PORT"]
    assert str(node.directory) in node.env()["RABBITMQ_MNESIA_BASE"]
    assert node.name in node.ctl_run("status")  # rabbitmqctl reaches this node, and only through its own settings


def test_a_durable_message_survives_a_sigkill_and_a_restart_of_the_node(rabbitmq_srv):
    import amqp
    import kombu
    import kombu.exceptions

    node = rabbitmq_srv
    with node.vhost() as url:
        queue = kombu.Queue("survivor", durable=True, queue_arguments={"x-queue-type": "quorum"})
        with kombu.Connection(url) as connection, connection.Producer() as producer:
            producer.publish({"kept": True}, routing_key="survivor", declare=[queue], delivery_mode=2)
        assert node.queue_types(url.rsplit("/", 1)[1]) == {"survivor": "quorum"}
        node.kill()
        assert node.process is None
        node.start()

        def received() -> dict | None:  # a quorum queue elects its leader a moment after the node is up
            try:
                with kombu.Connection(url) as connection:
                    message = connection.SimpleQueue(queue).get(timeout=5)
                    message.ack()
                    return dict(message.payload)
            except (OSError, kombu.exceptions.KombuError, amqp.exceptions.AMQPError):
                return None

        assert wait_for(received, 90, "the durable message after the restart", interval=1.0) == {"kept": True}
