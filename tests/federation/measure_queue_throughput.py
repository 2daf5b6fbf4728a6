"""Measure queue federation (run by hand, not a test): how fast a federated queue drains its upstream queue for a
downstream consumer, between two single-node brokers of one kind, raftmq -> raftmq and RabbitMQ 3.10 -> RabbitMQ
3.10 (its plugin).

    .venv/bin/python -m tests.federation.measure_queue_throughput --messages 20000 --rounds 3

Each round starts two fresh brokers, declares a durable queue `fq` on both, the upstream (`uri`, on-confirm,
prefetch 1000) and a policy (apply-to queues) on the downstream, and waits until a probe message published
upstream reaches a consumer downstream. The consumer then leaves (the link stops consuming), `--messages`
persistent 100 B messages are published upstream (confirms on), and a fresh consumer (auto-ack) starts downstream:
the figure is messages / (time from its basic.consume to its last delivery). It includes the link resuming (raftmq
polls the local queue's demand every 0.1 s) and its pauses whenever messages are ready downstream.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
import urllib.request
from collections.abc import Callable

import pika

from bench.brokers import rabbitmq_cluster
from bench.client import Endpoint
from tests.federation.measure_throughput import _conn, _put, raftmq_pair, upstream_value

BODY = b"x" * 100


def _declare(*endpoints: Endpoint) -> None:
    for e in endpoints:
        with _conn(e) as conn:
            conn.channel().queue_declare("fq", durable=True)


def _consume(down: Endpoint, messages: int, timeout_s: float) -> float:
    """Consume `messages` from `fq` (auto-ack); seconds from basic.consume to the last one."""
    got = 0
    with _conn(down) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        started = time.monotonic()
        for method, _, _ in ch.consume("fq", auto_ack=True, inactivity_timeout=timeout_s):
            if method is None:
                raise RuntimeError(f"only {got} of {messages} messages arrived")
            got += 1
            if got >= messages:
                break
        elapsed = time.monotonic() - started
        ch.cancel()
    return elapsed


def _publish(up: Endpoint, messages: int, body: bytes = BODY) -> None:
    with _conn(up) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        for _ in range(messages):
            ch.basic_publish("", "fq", body, props)


def measure(up: Endpoint, down: Endpoint, messages: int) -> float:
    _publish(up, 1, b"probe")
    _consume(down, 1, 120)  # the link runs (and the consumer leaves: the link stops consuming)
    time.sleep(1)
    _publish(up, messages)
    return messages / _consume(down, messages, 60)


def raftmq_round(messages: int) -> float:
    with raftmq_pair() as (up, down, mport):
        _declare(up, down)
        _put(mport, "/api/parameters/federation-upstream/%2F/up", {"value": upstream_value(up)})
        _put(mport, "/api/policies/%2F/fedq", {"pattern": "^fq$", "apply-to": "queues",
                                               "definition": {"federation-upstream": "up"}})
        rate = measure(up, down, messages)
        request = urllib.request.Request(f"http://127.0.0.1:{mport}/api/federation-links")
        request.add_header("authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(request, timeout=10) as answer:
            print(f"  raftmq link pauses in the round: {json.loads(answer.read())[0]['pauses']}", flush=True)
        return rate


def rabbitmq_round(messages: int) -> float:
    with rabbitmq_cluster(1) as upstream, rabbitmq_cluster(1, plugins=("rabbitmq_federation",)) as downstream:
        up, down = upstream.endpoints[0], downstream.endpoints[0]
        _declare(up, down)
        for args in (("set_parameter", "federation-upstream", "up", json.dumps(upstream_value(up))),
                     ("set_policy", "fedq", "^fq$", json.dumps({"federation-upstream": "up"}),
                      "--apply-to", "queues")):
            done = downstream.ctl(*args)
            if done.returncode != 0:
                raise RuntimeError(done.stderr)
        return measure(up, down, messages)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker", choices=("raftmq", "rabbitmq", "both"), default="both")
    args = parser.parse_args()
    kinds = ["raftmq", "rabbitmq"] if args.broker == "both" else [args.broker]
    run: dict[str, Callable[[int], float]] = {"raftmq": raftmq_round, "rabbitmq": rabbitmq_round}
    for kind in kinds:
        results = [run[kind](args.messages) for _ in range(args.rounds)]
        print(f"{kind}: {args.messages} x 100 B persistent pulled through a federated queue (on-confirm, prefetch "
              f"1000) by a downstream consumer: {', '.join(f'{r:.0f}' for r in results)} msg/s", flush=True)


if __name__ == "__main__":
    main()
