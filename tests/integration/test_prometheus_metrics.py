"""Prometheus metrics (`GET /metrics`, `/metrics/per-object`) on real nodes in both modes, parsed with
prometheus_client's own parser: RabbitMQ's names, per-queue labels, counters that only grow while channels come
and go, and the dedicated listener (`prometheus_port`, RabbitMQ's 15692) that serves nothing else. In cluster mode
every node is scraped and the counters summed, as Prometheus would."""

from __future__ import annotations

import socket
from pathlib import Path

import pika
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import Target
from tests.integration.nodeproc import NodeProcess
from tests.integration.test_management_rabbitmqadmin import eventually
from tests.integration.test_vhost_limits import management_ports

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int, path: str = "/metrics") -> Samples:
    reply = requests.get(f"http://127.0.0.1:{port}{path}", timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    out: Samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def total(ports: list[int], name: str) -> float:
    return sum(scrape(port).get((name, ()), 0.0) for port in ports)


def test_metrics_have_rabbitmqs_names_and_per_object_labels(amqp_target: Target, uid: str) -> None:
    ports = management_ports(amqp_target)
    queue = f"prom-{uid}"
    with pika.BlockingConnection(amqp_target.params()) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for n in range(3):
            ch.basic_publish("", queue, f"m{n}".encode())
        samples = scrape(ports[0])
        for name in ("rabbitmq_queues", "rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked",
                     "rabbitmq_connections", "rabbitmq_channels", "rabbitmq_consumers",
                     "rabbitmq_global_messages_received_total", "rabbitmq_global_messages_delivered_total",
                     "rabbitmq_resident_memory_limit_bytes", "rabbitmq_disk_space_available_bytes"):
            assert (name, ()) in samples, name
        assert samples[("rabbitmq_queue_messages_ready", ())] >= 3
        labels = (("queue", queue), ("vhost", "/"))
        per_object = eventually("the queue's ready count", lambda: (
            found if (found := scrape(ports[-1], "/metrics/per-object")).get(
                ("rabbitmq_queue_messages_ready", labels)) == 3 else None))
        assert per_object[("rabbitmq_queue_messages", labels)] == 3
        if amqp_target.mode == "cluster":  # the queue's Raft group, on the nodes that host it
            assert any(("rabbitmq_raft_log_commit_index", labels) in scrape(p, "/metrics/per-object")
                       for p in ports)
        ch.queue_delete(queue)


def test_counters_only_grow_across_channel_churn(amqp_target: Target, uid: str) -> None:
    ports = management_ports(amqp_target)
    queue = f"prom-churn-{uid}"
    received = total(ports, "rabbitmq_global_messages_received_total")
    delivered = total(ports, "rabbitmq_global_messages_delivered_total")
    with pika.BlockingConnection(amqp_target.params()) as conn:
        conn.channel().queue_declare(queue, durable=True)
        for _ in range(5):  # channels open, publish, get and close: counters must not drop with them
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("", queue, b"x")
            assert ch.basic_get(queue, auto_ack=True)[0] is not None
            ch.close()
            now_received = total(ports, "rabbitmq_global_messages_received_total")
            assert now_received >= received
            received = now_received
        conn.channel().queue_delete(queue)
    assert total(ports, "rabbitmq_global_messages_delivered_total") >= delivered + 5


def test_the_prometheus_listener_serves_metrics_only(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    node = NodeProcess(tmp_path, extra_args=("--prometheus-port", str(port))).start()
    try:
        samples = eventually("the Prometheus listener", lambda: _try_scrape(port))
        assert ("rabbitmq_queues", ()) in samples and ("rabbitmq_connections", ()) in samples
        assert requests.get(f"http://127.0.0.1:{port}/api/overview", auth=("guest", "guest"),
                            timeout=10).status_code == 404
    finally:
        node.stop()


def _try_scrape(port: int) -> Samples | None:
    try:
        return scrape(port)
    except requests.ConnectionError:
        return None
