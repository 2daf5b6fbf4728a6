"""kombu on its py-amqp transport (the stack Celery uses) against the broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kombu
import pytest

from tests.integration.conftest import Target


@pytest.fixture
def kombu_conn(amqp_target: Target) -> Iterator[kombu.Connection]:
    connection = kombu.Connection(f"pyamqp://guest:guest@{amqp_target.host}:{amqp_target.port}//",
                                  connect_timeout=10)
    connection.connect()
    try:
        yield connection
    finally:
        connection.release()


def _drain(connection: kombu.Connection, received: list[Any], count: int) -> None:
    for _ in range(200):
        if len(received) >= count:
            return
        try:
            connection.drain_events(timeout=0.1)
        except TimeoutError:
            continue


def test_producer_consumer_with_json(kombu_conn: kombu.Connection, uid: str) -> None:
    exchange = kombu.Exchange(f"kombu-x-{uid}", type="direct", auto_delete=True)
    queue = kombu.Queue(f"kombu-q-{uid}", exchange, routing_key="task", auto_delete=True)
    received: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        received.append(body)
        message.ack()

    with kombu.Consumer(kombu_conn, [queue], callbacks=[on_message], accept=["json"]):
        producer = kombu.Producer(kombu_conn)
        for i in range(5):
            producer.publish({"n": i}, exchange=exchange, routing_key="task", serializer="json",
                             declare=[queue], retry=False)
        _drain(kombu_conn, received, 5)
    assert received == [{"n": i} for i in range(5)]


def test_simple_queue_get_and_ack(kombu_conn: kombu.Connection, uid: str) -> None:
    simple = kombu_conn.SimpleQueue(f"kombu-simple-{uid}")
    try:
        simple.put({"hello": "world"}, serializer="json")
        message = simple.get(block=True, timeout=10)
        assert message.payload == {"hello": "world"}
        message.ack()
        assert simple.qsize() == 0
    finally:
        simple.close()
        kombu_conn.default_channel.queue_delete(simple.queue.name)


def test_reject_requeue_then_ack(kombu_conn: kombu.Connection, uid: str) -> None:
    simple = kombu_conn.SimpleQueue(f"kombu-requeue-{uid}")
    try:
        simple.put("again")
        first = simple.get(timeout=10)
        first.requeue()
        second = simple.get(timeout=10)
        assert second.payload == "again"
        assert second.delivery_info["redelivered"] is True
        second.ack()
    finally:
        simple.close()
        kombu_conn.default_channel.queue_delete(simple.queue.name)


def test_topic_routing_and_qos(kombu_conn: kombu.Connection, uid: str) -> None:
    exchange = kombu.Exchange(f"kombu-t-{uid}", type="topic", auto_delete=True)
    queue = kombu.Queue(f"kombu-tq-{uid}", exchange, routing_key="logs.#", auto_delete=True)
    received: list[Any] = []
    consumer = kombu.Consumer(kombu_conn, [queue], callbacks=[lambda body, msg: received.append(msg)],
                              accept=["json"])
    consumer.qos(prefetch_count=2)
    with consumer:
        producer = kombu.Producer(kombu_conn, exchange=exchange, serializer="json")
        for key in ("logs.a", "logs.b.c", "metrics.x", "logs.d"):
            producer.publish({"key": key}, routing_key=key, declare=[queue], retry=False)
        _drain(kombu_conn, received, 2)
        assert len(received) == 2  # prefetch 2, nothing acked yet
        for message in received:
            message.ack()
        _drain(kombu_conn, received, 3)
        received[-1].ack()
    assert [m.payload["key"] for m in received] == ["logs.a", "logs.b.c", "logs.d"]


def test_durable_queue_declared_by_kombu_is_durable(kombu_conn: kombu.Connection, uid: str) -> None:
    queue = kombu.Queue(f"kombu-durable-{uid}", kombu.Exchange(f"kombu-dx-{uid}", type="fanout"), durable=True)
    bound = queue(kombu_conn.channel())
    bound.declare()
    try:
        name, message_count, _consumers = bound.queue_declare(passive=True)
        assert (name, message_count) == (f"kombu-durable-{uid}", 0)
    finally:
        bound.delete()
        bound.exchange.delete()
