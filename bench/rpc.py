"""RPC round trip through a broker: a pika client with an exclusive auto-delete reply queue, a server on its own
connection, one request at a time (what an RPC user feels; issue 16, node-local exclusive queues).

Run as `python -m bench.rpc HOST:PORT [SERVER_HOST:PORT] [--calls N]`: the client connects to the first address,
the server to the second (default: the first; through HAProxy the two usually land on different nodes). Prints
the round trip's p50/p90/p99/max in ms over N calls after a few warm-up calls. A test tool: it imports nothing of
the broker.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import pika

WARMUP_CALLS = 20


def _connect(address: str) -> pika.BlockingConnection:
    host, _, port = address.rpartition(":")
    return pika.BlockingConnection(pika.ConnectionParameters(host=host or "127.0.0.1", port=int(port),
                                                             connection_attempts=3))


def run(client_address: str, server_address: str, calls: int) -> list[float]:
    """The round trips of `calls` calls, in ms."""
    client, server = _connect(client_address), _connect(server_address)
    try:
        sch = server.channel()
        requests = sch.queue_declare(f"rpc-bench-{uuid.uuid4().hex[:8]}", auto_delete=True).method.queue

        def serve(ch: pika.adapters.blocking_connection.BlockingChannel, method: pika.spec.Basic.Deliver,
                  props: pika.BasicProperties, body: bytes) -> None:
            ch.basic_publish("", props.reply_to, body, pika.BasicProperties(correlation_id=props.correlation_id))
            ch.basic_ack(method.delivery_tag)

        sch.basic_consume(requests, serve)
        cch = client.channel()
        reply_to = cch.queue_declare("", exclusive=True, auto_delete=True).method.queue
        got: list[str] = []
        cch.basic_consume(reply_to, lambda _c, _m, p, _b: got.append(p.correlation_id), auto_ack=True)
        times: list[float] = []
        for n in range(WARMUP_CALLS + calls):
            start = time.perf_counter()
            cch.basic_publish("", requests, b"x" * 64, pika.BasicProperties(reply_to=reply_to, correlation_id=str(n)))
            while str(n) not in got:
                server.process_data_events(time_limit=0)
                client.process_data_events(time_limit=0)
            if n >= WARMUP_CALLS:
                times.append((time.perf_counter() - start) * 1000)
        return times
    finally:
        for connection in (client, server):
            if connection.is_open:
                connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("client")
    parser.add_argument("server", nargs="?")
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    times = sorted(run(args.client, args.server or args.client, args.calls))
    q = statistics.quantiles(times, n=100)
    print(f"rpc round trip over {len(times)} calls: p50 {q[49]:.2f} ms, p90 {q[89]:.2f} ms, p99 {q[98]:.2f} ms, "
          f"max {times[-1]:.2f} ms")


if __name__ == "__main__":
    main()
