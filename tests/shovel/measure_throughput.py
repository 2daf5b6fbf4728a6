"""Measure shovel throughput (run by hand, not a test): a backlog of persistent 100 B messages moved by a dynamic
shovel (on-confirm, prefetch 1000) from one broker to another, raftmq -> raftmq and RabbitMQ -> RabbitMQ.

    .venv/bin/python -m tests.shovel.measure_throughput --messages 20000 --rounds 3

Each round starts two fresh single-node brokers of one kind, preloads the source queue (durable, publisher
confirms), defines the shovel on the source node (raftmq: PUT /api/parameters/shovel; RabbitMQ 3.10:
`rabbitmqctl set_parameter shovel` with the rabbitmq_shovel plugin), and times from the definition to the moment
the destination queue holds every message (polled every 50 ms). Messages/s = messages / that time, so the shovel's
start-up (two connections, declares) is included. Both brokers of a pair run on this machine. With `--clusters`,
raftmq's source and destination are two local 3-node clusters (the shovel is defined on the source's first node and
runs on whichever node holds its lease); RabbitMQ's stay single nodes.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterator

import pika

from bench.brokers import free_port, rabbitmq_cluster, raftmq_cluster, raftmq_node
from bench.client import Endpoint
from deploy.node_plan import plan_ports

BODY = b"x" * 100


def preload(endpoint: Endpoint, queue: str, messages: int) -> None:
    params = pika.ConnectionParameters(endpoint.host, endpoint.port, credentials=pika.PlainCredentials("guest", "guest"))
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        for _ in range(messages):
            ch.basic_publish("", queue, BODY, props)


def ready(endpoint: Endpoint, queue: str) -> int:
    params = pika.ConnectionParameters(endpoint.host, endpoint.port, credentials=pika.PlainCredentials("guest", "guest"))
    with pika.BlockingConnection(params) as conn:
        try:
            return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
        except pika.exceptions.ChannelClosedByBroker:
            return 0


def definition(src: Endpoint, dest: Endpoint) -> dict[str, object]:
    return {"src-uri": f"amqp://guest:guest@{src.host}:{src.port}", "src-queue": "shovel-src",
            "dest-uri": f"amqp://guest:guest@{dest.host}:{dest.port}", "dest-queue": "shovel-dst",
            "ack-mode": "on-confirm", "src-prefetch-count": 1000}


def timed_move(src: Endpoint, dest: Endpoint, messages: int, define: Callable[[], None]) -> float:
    preload(src, "shovel-src", messages)
    started = time.monotonic()
    define()
    with pika.BlockingConnection(pika.ConnectionParameters(
            dest.host, dest.port, credentials=pika.PlainCredentials("guest", "guest"))) as conn:
        ch = conn.channel()
        while True:
            try:
                if ch.queue_declare("shovel-dst", passive=True).method.message_count >= messages:
                    return messages / (time.monotonic() - started)
            except pika.exceptions.ChannelClosedByBroker:
                ch = conn.channel()
            time.sleep(0.05)


@contextlib.contextmanager
def raftmq_pair() -> Iterator[tuple[Endpoint, Endpoint, int]]:
    mport = free_port()
    with raftmq_node(extra_args=("--management-port", str(mport))) as src, raftmq_node() as dest:
        yield src, dest, mport


@contextlib.contextmanager
def raftmq_cluster_pair() -> Iterator[tuple[Endpoint, Endpoint, int]]:
    with raftmq_cluster(3) as source, raftmq_cluster(3) as target:
        src = source.nodes[0].endpoint
        yield src, target.nodes[0].endpoint, plan_ports(src.port)["management"]


def raftmq_round(messages: int, clusters: bool = False) -> float:
    with (raftmq_cluster_pair() if clusters else raftmq_pair()) as (src, dest, mport):
        def define() -> None:
            body = json.dumps({"value": definition(src, dest)}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{mport}/api/parameters/shovel/%2F/bench", body,
                                             method="PUT", headers={"content-type": "application/json"})
            request.add_header("authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
            for _ in range(100):
                try:
                    urllib.request.urlopen(request, timeout=10).close()
                    return
                except OSError:
                    time.sleep(0.1)  # the management port opens just after AMQP
            raise RuntimeError("the management API never answered")

        return timed_move(src, dest, messages, define)


def rabbitmq_round(messages: int) -> float:
    with rabbitmq_cluster(1, plugins=("rabbitmq_shovel",)) as source, rabbitmq_cluster(1) as target:
        src, dest = source.endpoints[0], target.endpoints[0]

        def define() -> None:
            done = source.ctl("set_parameter", "shovel", "bench", json.dumps(definition(src, dest)))
            if done.returncode != 0:
                raise RuntimeError(done.stderr)

        return timed_move(src, dest, messages, define)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker", choices=("raftmq", "rabbitmq", "both"), default="both")
    parser.add_argument("--clusters", action="store_true", help="raftmq between two local 3-node clusters")
    args = parser.parse_args()
    kinds = ["raftmq", "rabbitmq"] if args.broker == "both" else [args.broker]
    for kind in kinds:
        rates = [raftmq_round(args.messages, args.clusters) if kind == "raftmq" else rabbitmq_round(args.messages)
                 for _ in range(args.rounds)]
        print(f"{kind}: {args.messages} x 100 B persistent, on-confirm: "
              f"{', '.join(f'{r:.0f}' for r in rates)} msg/s (median {statistics.median(rates):.0f})", flush=True)


if __name__ == "__main__":
    main()
