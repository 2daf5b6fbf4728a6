"""Measure exchange federation (run by hand, not a test): throughput and added latency of one federated exchange
between two single-node brokers of one kind, raftmq -> raftmq and RabbitMQ 3.10 -> RabbitMQ 3.10 (its plugin).

    .venv/bin/python -m tests.federation.measure_throughput --messages 20000 --rounds 3

Each round starts two fresh brokers, declares a topic exchange `fx` on both, a durable queue bound with `#`
downstream, the upstream (`uri`, on-confirm, prefetch 1000) and a policy on the downstream, and waits until a probe
message crosses. Throughput: a publisher on the upstream sends `--messages` persistent 100 B messages without
confirms; time from the first publish to the moment the downstream queue holds them all (polled every 50 ms); the
publisher's own rate is printed beside it.
Added latency: 300 messages, one every 10 ms, each carrying its send time; a consumer downstream reads them (one
machine, one clock); median and p99 of arrival - send, which includes one broker hop on each side.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import struct
import time
import urllib.request
from collections.abc import Callable, Iterator

import pika

from bench.brokers import free_port, rabbitmq_cluster, raftmq_node
from bench.client import Endpoint

BODY = b"x" * 92


def _conn(e: Endpoint) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(e.host, e.port,
                                                             credentials=pika.PlainCredentials("guest", "guest")))


def _declare(up: Endpoint, down: Endpoint) -> None:
    with _conn(up) as conn:
        conn.channel().exchange_declare("fx", "topic", durable=True)
    with _conn(down) as conn:
        ch = conn.channel()
        ch.exchange_declare("fx", "topic", durable=True)
        ch.queue_declare("fq", durable=True)
        ch.queue_bind("fq", "fx", "#")


def _ready(e: Endpoint) -> int:
    with _conn(e) as conn:
        return int(conn.channel().queue_declare("fq", passive=True).method.message_count)


def _wait_probe(up: Endpoint, down: Endpoint) -> None:
    deadline = time.monotonic() + 120
    with _conn(up) as conn:
        ch = conn.channel()
        while time.monotonic() < deadline:
            ch.basic_publish("fx", "probe", b"probe")
            time.sleep(0.5)
            if _ready(down):
                with _conn(down) as dconn:
                    dconn.channel().queue_purge("fq")
                return
    raise RuntimeError("the link never carried a message")


def measure(up: Endpoint, down: Endpoint, messages: int) -> tuple[float, float, float, float]:
    time.sleep(1)  # (a probe still in flight would count)
    with _conn(down) as conn:
        conn.channel().queue_purge("fq")
    with _conn(up) as conn:
        ch = conn.channel()
        props = pika.BasicProperties(delivery_mode=2)
        started = time.monotonic()
        for _ in range(messages):
            ch.basic_publish("fx", "k", BODY, props)
    publish_rate = messages / (time.monotonic() - started)
    while _ready(down) < messages:
        time.sleep(0.05)
    rate = messages / (time.monotonic() - started)
    with _conn(down) as conn:
        conn.channel().queue_purge("fq")
    delays: list[float] = []
    with _conn(up) as pub, _conn(down) as sub:
        pch, sch = pub.channel(), sub.channel()
        for _ in range(300):
            pch.basic_publish("fx", "k", struct.pack("!d", time.time()) + BODY)
            sub.process_data_events(time_limit=0.01)
            while True:
                method, _, body = sch.basic_get("fq", auto_ack=True)
                if method is None:
                    break
                delays.append(time.time() - struct.unpack("!d", body[:8])[0])
        deadline = time.monotonic() + 10
        while len(delays) < 300 and time.monotonic() < deadline:
            method, _, body = sch.basic_get("fq", auto_ack=True)
            if method is None:
                time.sleep(0.005)
                continue
            delays.append(time.time() - struct.unpack("!d", body[:8])[0])
    delays.sort()
    return rate, delays[len(delays) // 2] * 1000, delays[int(len(delays) * 0.99) - 1] * 1000, publish_rate


@contextlib.contextmanager
def raftmq_pair() -> Iterator[tuple[Endpoint, Endpoint, int]]:
    mport = free_port()
    with raftmq_node(extra_args=("--node-name", "up")) as up, \
            raftmq_node(extra_args=("--management-port", str(mport), "--node-name", "down")) as down:
        yield up, down, mport


def _put(mport: int, path: str, body: dict[str, object]) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{mport}{path}", json.dumps(body).encode(), method="PUT",
                                     headers={"content-type": "application/json"})
    request.add_header("authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    for _ in range(100):
        try:
            urllib.request.urlopen(request, timeout=10).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the management API never answered")


def upstream_value(up: Endpoint) -> dict[str, object]:
    return {"uri": f"amqp://guest:guest@{up.host}:{up.port}", "ack-mode": "on-confirm", "prefetch-count": 1000}


def raftmq_round(messages: int) -> tuple[float, float, float, float]:
    with raftmq_pair() as (up, down, mport):
        _declare(up, down)
        _put(mport, "/api/parameters/federation-upstream/%2F/up", {"value": upstream_value(up)})
        _put(mport, "/api/policies/%2F/fed", {"pattern": "^fx$", "apply-to": "exchanges",
                                              "definition": {"federation-upstream": "up"}})
        _wait_probe(up, down)
        return measure(up, down, messages)


def rabbitmq_round(messages: int) -> tuple[float, float, float, float]:
    with rabbitmq_cluster(1) as upstream, rabbitmq_cluster(1, plugins=("rabbitmq_federation",)) as downstream:
        up, down = upstream.endpoints[0], downstream.endpoints[0]
        _declare(up, down)

        def ctl(*args: str) -> None:
            done = downstream.ctl(*args)
            if done.returncode != 0:
                raise RuntimeError(done.stderr)

        ctl("set_parameter", "federation-upstream", "up", json.dumps(upstream_value(up)))
        ctl("set_policy", "fed", "^fx$", json.dumps({"federation-upstream": "up"}), "--apply-to", "exchanges")
        _wait_probe(up, down)
        return measure(up, down, messages)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker", choices=("raftmq", "rabbitmq", "both"), default="both")
    args = parser.parse_args()
    kinds = ["raftmq", "rabbitmq"] if args.broker == "both" else [args.broker]
    run: dict[str, Callable[[int], tuple[float, float, float, float]]] = {"raftmq": raftmq_round,
                                                                    "rabbitmq": rabbitmq_round}
    for kind in kinds:
        results = [run[kind](args.messages) for _ in range(args.rounds)]
        print(f"{kind}: {args.messages} x 100 B persistent through a federated exchange (on-confirm, prefetch 1000): "
              f"{', '.join(f'{r[0]:.0f}' for r in results)} msg/s (publisher alone: "
              f"{', '.join(f'{r[3]:.0f}' for r in results)}); added latency median "
              f"{', '.join(f'{r[1]:.1f}' for r in results)} ms, p99 {', '.join(f'{r[2]:.1f}' for r in results)} ms",
              flush=True)


if __name__ == "__main__":
    main()
