"""Measure shovel throughput (run by hand, not a test): a backlog of persistent 100 B messages moved by a dynamic
shovel (on-confirm, prefetch 1000) from one broker or cluster to another, side by side for several kinds of pair.

    .venv/bin/python -m tests.shovel.measure_throughput --messages 20000 --rounds 3

Kinds (`--kinds`, comma-separated; all by default, run in turn within each round so load swings hit all alike):
`raftmq-cluster` two local 3-node raftmq clusters (`raftmq cluster up`, no HAProxy), quorum source and destination
queues, `src-uri`/`dest-uri` listing every node of each cluster, the shovel defined through the source's first node
and run by whichever node holds its lease; `raftmq` two single `raftmq node`s, durable classic queues; `rabbitmq`
two private RabbitMQ 3.10 nodes with the rabbitmq_shovel plugin, durable classic queues; `rabbitmq-quorum` the same
two RabbitMQ nodes with quorum queues (`src-queue-args`/`dest-queue-args` name the type, rabbitmq-server#10501).

Each round starts the brokers fresh, preloads the source queue (until it holds every message), declares the empty destination
queue, defines the shovel (raftmq: PUT /api/parameters/shovel; RabbitMQ: `rabbitmqctl set_parameter shovel`) and
polls the destination queue's length every 50 ms. Printed per round: messages / (definition -> last message), so
start-up (lease claim, two connections, declares) counts; the start-up alone (definition -> first message); and
the moving rate after it (first -> last message). Medians over the rounds and the load average at the end follow.
RabbitMQ's start-up includes `rabbitmqctl`'s own (an Erlang VM booting: seconds, much more on a loaded machine), so
compare the moving rates; the overall figures favour raftmq by that much.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pika

from bench.brokers import free_port, rabbitmq_cluster, raftmq_cluster, raftmq_node
from bench.client import Endpoint
from deploy.node_plan import plan_ports

BODY = b"x" * 100
KINDS = ("raftmq-cluster", "raftmq", "rabbitmq", "rabbitmq-quorum")
QUORUM = {"x-queue-type": "quorum"}


@dataclass(frozen=True, slots=True)
class Pair:
    """Both sides of one round: where to preload and count, the URIs the shovel is given, how to define it."""

    src: Endpoint
    dest: Endpoint
    src_uris: list[str]
    dest_uris: list[str]
    define: Callable[[dict[str, object]], None]
    queue_args: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Result:
    overall: float  # msg/s, definition -> last message
    startup_s: float  # definition -> first message
    moving: float  # msg/s, first -> last message


def _connect(endpoint: Endpoint) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        endpoint.host, endpoint.port, credentials=pika.PlainCredentials("guest", "guest")))


def preload(endpoint: Endpoint, queue: str, messages: int, args: dict[str, str] | None) -> None:
    """`messages` persistent messages into the (declared) queue, published without waiting for each confirm (pika's
    blocking confirms would make it one Raft commit per message), then polled until the queue holds them all."""
    with _connect(endpoint) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments=args)
        props = pika.BasicProperties(delivery_mode=2)
        for _ in range(messages):
            ch.basic_publish("", queue, BODY, props)
        while ch.queue_declare(queue, passive=True).method.message_count < messages:
            time.sleep(0.1)


def _uri(endpoint: Endpoint) -> str:
    return f"amqp://guest:guest@{endpoint.host}:{endpoint.port}"


def definition(pair: Pair) -> dict[str, object]:
    value: dict[str, object] = {
        "src-uri": pair.src_uris, "src-queue": "shovel-src", "dest-uri": pair.dest_uris, "dest-queue": "shovel-dst",
        "ack-mode": "on-confirm", "src-prefetch-count": 1000}
    if pair.queue_args:
        value["src-queue-args"] = value["dest-queue-args"] = pair.queue_args
    return value


def timed_move(pair: Pair, messages: int) -> Result:
    preload(pair.src, "shovel-src", messages, pair.queue_args)
    preload(pair.dest, "shovel-dst", 0, pair.queue_args)
    started = time.monotonic()
    pair.define(definition(pair))
    first: float | None = None
    with _connect(pair.dest) as conn:
        ch = conn.channel()
        while True:
            try:
                ready = ch.queue_declare("shovel-dst", passive=True).method.message_count
            except pika.exceptions.ChannelClosedByBroker:
                ch, ready = conn.channel(), 0
            now = time.monotonic()
            if ready and first is None:
                first = now
            if ready >= messages and first is not None:
                return Result(messages / (now - started), first - started, messages / max(now - first, 1e-3))
            time.sleep(0.05)


def _http_define(mport: int) -> Callable[[dict[str, object]], None]:
    def define(value: dict[str, object]) -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{mport}/api/parameters/shovel/%2F/bench",
                                         json.dumps({"value": value}).encode(), method="PUT",
                                         headers={"content-type": "application/json"})
        request.add_header("authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        for _ in range(100):
            try:
                urllib.request.urlopen(request, timeout=10).close()
                return
            except OSError:
                time.sleep(0.1)  # the management port opens just after AMQP
        raise RuntimeError("the management API never answered")

    return define


@contextlib.contextmanager
def raftmq_pair() -> Iterator[Pair]:
    mport = free_port()
    with raftmq_node(extra_args=("--management-port", str(mport))) as src, raftmq_node() as dest:
        yield Pair(src, dest, [_uri(src)], [_uri(dest)], _http_define(mport))


@contextlib.contextmanager
def raftmq_cluster_pair(base_ports: tuple[int | None, int | None] = (None, None)) -> Iterator[Pair]:
    """Source and destination queues are declared on each cluster's first node (which then leads their groups),
    the first URI of each list. `base_ports`: the two clusters' (default: free runs picked at random)."""
    with raftmq_cluster(3, base_port=base_ports[0]) as source, raftmq_cluster(3, base_port=base_ports[1]) as target:
        src, dest = source.nodes[0].endpoint, target.nodes[0].endpoint
        yield Pair(src, dest, [_uri(n.endpoint) for n in source.nodes], [_uri(n.endpoint) for n in target.nodes],
                   _http_define(plan_ports(src.port)["management"]), QUORUM)


@contextlib.contextmanager
def rabbitmq_pair(queue_args: dict[str, str] | None = None) -> Iterator[Pair]:
    with rabbitmq_cluster(1, plugins=("rabbitmq_shovel",)) as source, rabbitmq_cluster(1) as target:
        src, dest = source.endpoints[0], target.endpoints[0]

        def define(value: dict[str, object]) -> None:
            done = source.ctl("set_parameter", "shovel", "bench", json.dumps(value))
            if done.returncode != 0:
                raise RuntimeError(done.stderr)

        yield Pair(src, dest, [_uri(src)], [_uri(dest)], define, queue_args)


def one_round(kind: str, messages: int, base_ports: tuple[int | None, int | None] = (None, None)) -> Result:
    pairs: dict[str, Callable[[], contextlib.AbstractContextManager[Pair]]] = {
        "raftmq-cluster": lambda: raftmq_cluster_pair(base_ports), "raftmq": raftmq_pair,
        "rabbitmq": rabbitmq_pair, "rabbitmq-quorum": lambda: rabbitmq_pair(QUORUM)}
    with pairs[kind]() as pair:
        return timed_move(pair, messages)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--base-ports", default="", help="A,B: the source and destination clusters' base ports")
    args = parser.parse_args()
    base_ports: tuple[int | None, int | None] = (None, None)
    if args.base_ports:
        first, second = (int(p) for p in args.base_ports.split(","))
        base_ports = (first, second)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}")
    results: dict[str, list[Result]] = {kind: [] for kind in kinds}
    for number in range(1, args.rounds + 1):
        for kind in kinds:
            result = one_round(kind, args.messages, base_ports)
            results[kind].append(result)
            print(f"round {number} {kind}: {result.overall:.0f} msg/s overall, start-up {result.startup_s:.2f} s, "
                  f"{result.moving:.0f} msg/s moving; load average {os.getloadavg()[0]:.1f}", flush=True)
    print(f"{args.messages} x 100 B persistent, on-confirm, prefetch 1000; medians of {args.rounds} rounds:")
    for kind, rows in results.items():
        print(f"  {kind}: overall {statistics.median(r.overall for r in rows):.0f} msg/s "
              f"({', '.join(f'{r.overall:.0f}' for r in rows)}); start-up "
              f"{statistics.median(r.startup_s for r in rows):.2f} s; moving "
              f"{statistics.median(r.moving for r in rows):.0f} msg/s ({', '.join(f'{r.moving:.0f}' for r in rows)})")
    print(f"load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
