"""Exchange and queue federation with RabbitMQ 3.10 as the upstream and raftmq downstream, and RabbitMQ's own
federation plugin downstream of a raftmq upstream (the x-federation-upstream exchange type); real processes, pika.
Skipped when Debian's rabbitmq-server is not installed."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pika

from tests.federation.test_exchange_single import _links, _start
from tests.federation.test_queue_single import Consumer
from tests.link.conftest import Broker
from tests.shovel.helpers import count, ctl_call, drain, wait_until


def test_raftmq_downstream_of_a_rabbitmq_upstream(rabbitmq_broker: Broker, tmp_path: Path) -> None:
    exchange = f"fx-{uuid.uuid4().hex[:8]}"
    params = pika.ConnectionParameters(rabbitmq_broker.host, rabbitmq_broker.port,
                                       credentials=pika.PlainCredentials("guest", "guest"))
    with pika.BlockingConnection(params) as conn:
        conn.channel().exchange_declare(exchange, "topic", durable=True)
    node, mport = _start(tmp_path / "d", "raftmq-down")
    try:
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port)) as conn:
            ch = conn.channel()
            ch.exchange_declare(exchange, "topic", durable=True)
            ch.queue_declare("dq", durable=True)
            ch.queue_bind("dq", exchange, "k.#")
        code, out = ctl_call(mport, "set_parameter", "federation-upstream", "rabbit",
                             json.dumps({"uri": rabbitmq_broker.uri()}))
        assert code == 0, out
        code, out = ctl_call(mport, "set_policy", "fed", f"^{exchange}$",
                             json.dumps({"federation-upstream": "rabbit"}), "--apply-to", "exchanges")
        assert code == 0, out
        wait_until(lambda: [r for r in _links(mport) if r["status"] == "running"], 60, "the link never ran")
        queue = f"federation: {exchange} -> raftmq-down"

        def bound() -> bool:  # RabbitMQ shows the replayed binding as a queue binding of its exchange
            with pika.BlockingConnection(params) as conn:
                ch = conn.channel()
                ch.queue_declare(queue, passive=True)
                ch.confirm_delivery()
                ch.basic_publish(exchange, "k.probe", b"probe")
            return count(node.port, "dq") >= 1
        wait_until(bound, 60, "RabbitMQ's messages never reached raftmq")
        with pika.BlockingConnection(params) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for n in range(50):
                ch.basic_publish(exchange, "k.x", f"m{n}".encode(), pika.BasicProperties(delivery_mode=2))
            ch.basic_publish(exchange, "other", b"not bound")
        wait_until(lambda: count(node.port, "dq") >= 51, 60, "the 50 messages never arrived")
        got = drain(node.port, "dq")
        bodies = [b for b, _ in got if b != b"probe"]
        assert bodies == [f"m{n}".encode() for n in range(50)]
        hop = got[-1][1]["x-received-from"][0]
        assert hop["exchange"] == exchange and hop["cluster-name"]  # RabbitMQ's cluster_name

        def upstream_empty() -> bool:  # every message acked upstream (the acks follow the local confirms)
            with pika.BlockingConnection(params) as conn:
                return int(conn.channel().queue_declare(queue, passive=True).method.message_count) == 0
        wait_until(upstream_empty, 30, "messages left in RabbitMQ's upstream queue")
    finally:
        node.stop()


def test_raftmq_queue_downstream_of_a_rabbitmq_upstream(rabbitmq_broker: Broker, tmp_path: Path) -> None:
    """Queue federation: a raftmq queue with a consumer pulls from RabbitMQ's queue of the same name (RabbitMQ
    advertises consumer priorities and takes the link's x-priority -1 consumer)."""
    queue = f"fq-{uuid.uuid4().hex[:8]}"
    params = pika.ConnectionParameters(rabbitmq_broker.host, rabbitmq_broker.port,
                                       credentials=pika.PlainCredentials("guest", "guest"))
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for n in range(30):
            ch.basic_publish("", queue, f"r{n}".encode(), pika.BasicProperties(delivery_mode=2))
    node, mport = _start(tmp_path / "dq", "raftmq-qdown")
    try:
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port)) as conn:
            conn.channel().queue_declare(queue, durable=True)
        assert ctl_call(mport, "set_parameter", "federation-upstream", "rabbit",
                        json.dumps({"uri": rabbitmq_broker.uri()}))[0] == 0
        assert ctl_call(mport, "set_policy", "fedq", f"^{queue}$", json.dumps({"federation-upstream": "rabbit"}),
                        "--apply-to", "queues")[0] == 0
        wait_until(lambda: [r for r in _links(mport) if r["status"] == "running" and r["type"] == "queue"], 60,
                   "the queue link never ran")
        consumer = Consumer(node.port, queue)
        try:
            wait_until(lambda: consumer.pump() >= 30, 60, "RabbitMQ's messages never reached raftmq's consumer")
        finally:
            consumer.close()
        assert sorted(b for b, _ in consumer.got) == sorted(f"r{n}".encode() for n in range(30))
        hop = consumer.got[0][1]["x-received-from"][0]
        assert hop["queue"] == queue and hop["cluster-name"]  # RabbitMQ's cluster_name
        with pika.BlockingConnection(params) as conn:  # acked upstream (after the local confirms)
            wait_until(lambda: int(conn.channel().queue_declare(queue, passive=True).method.message_count) == 0,
                       30, "messages left in RabbitMQ's queue")
    finally:
        node.stop()


def test_rabbitmq_federation_plugin_downstream_of_a_raftmq_upstream(rabbitmq_broker: Broker, tmp_path: Path) -> None:
    """RabbitMQ's own federation plugin as the downstream: on raftmq it declares its upstream exchange of type
    x-federation-upstream (bound to the federated exchange) and a queue, and consumes; a message published on
    raftmq arrives once in RabbitMQ, with raftmq's hop in x-received-from."""
    assert rabbitmq_broker.rabbit is not None
    exchange = f"fx-{uuid.uuid4().hex[:8]}"
    node, mport = _start(tmp_path / "u", "raftmq-up")
    try:
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port)) as conn:
            conn.channel().exchange_declare(exchange, "direct", durable=True)
        params = pika.ConnectionParameters(rabbitmq_broker.host, rabbitmq_broker.port,
                                           credentials=pika.PlainCredentials("guest", "guest"))
        with pika.BlockingConnection(params) as conn:
            ch = conn.channel()
            ch.exchange_declare(exchange, "direct", durable=True)
            ch.queue_declare(f"{exchange}-q", durable=True)
            ch.queue_bind(f"{exchange}-q", exchange, "k")
        ctl = rabbitmq_broker.rabbit.ctl
        done = ctl("set_parameter", "federation-upstream", f"raftmq-{exchange}",
                   json.dumps({"uri": f"amqp://guest:guest@127.0.0.1:{node.port}"}))
        assert done.returncode == 0, done.stderr
        done = ctl("set_policy", f"fed-{exchange}", f"^{exchange}$",
                   json.dumps({"federation-upstream": f"raftmq-{exchange}"}), "--apply-to", "exchanges")
        assert done.returncode == 0, done.stderr
        try:
            def bound() -> bool:  # the plugin's binding replayed on raftmq: a probe published there arrives
                with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port)) as conn:
                    ch = conn.channel()
                    ch.confirm_delivery()
                    ch.basic_publish(exchange, "k", b"probe")
                with pika.BlockingConnection(params) as conn:
                    return int(conn.channel().queue_declare(f"{exchange}-q", passive=True)
                               .method.message_count) >= 1
            wait_until(bound, 90, "RabbitMQ's federation link never moved a message from raftmq")
            code, exchanges = ctl_call(mport, "list_exchanges")
            assert code == 0 and [x for x in exchanges if x["type"] == "x-federation-upstream"], exchanges
            with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port)) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                for n in range(20):
                    ch.basic_publish(exchange, "k", f"m{n}".encode(), pika.BasicProperties(delivery_mode=2))
                ch.basic_publish(exchange, "other", b"not bound")
            got: list[tuple[bytes, dict[str, object]]] = []

            def arrived() -> bool:
                with pika.BlockingConnection(params) as conn:
                    ch = conn.channel()
                    while (message := ch.basic_get(f"{exchange}-q", auto_ack=True))[0] is not None:
                        got.append((message[2], dict(message[1].headers or {})))
                return len([b for b, _ in got if b != b"probe"]) >= 20
            wait_until(arrived, 60, "the 20 messages never reached RabbitMQ")
            bodies = [b for b, _ in got if b != b"probe"]
            assert bodies == [f"m{n}".encode() for n in range(20)]  # once each, in order, nothing unbound
            hops = got[-1][1]["x-received-from"]
            assert isinstance(hops, list) and hops[0]["exchange"] == exchange
        finally:
            ctl("clear_policy", f"fed-{exchange}")
            ctl("clear_parameter", "federation-upstream", f"raftmq-{exchange}")
    finally:
        node.stop()
