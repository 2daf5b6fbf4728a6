"""Micro-benchmark of the pure queue state machine (cluster.queue): throughput and memory per message.

Scenarios (each prints ops/s, where one op = one message through Enqueue + Deliver + Settle):
- direct: one consumer with room; every Enqueue delivers at once and is settled by its own Settle.
- backlog: N messages enqueued with nobody attached, then drained by a prefetch-100 consumer settling in batches.
- fanout: 1,000 consumers (prefetch 10) sharing the queue round-robin, settling in batches of 10.
- ttl: as direct, with x-message-ttl (the expiry heap is on the hot path).
Memory: tracemalloc over a backlog of M ready messages, per message, with the broker's QueuedMessage counted
and without it (one shared QueuedMessage: the machine's own share), for plain, TTL and priority queues.

Timing is CPU time of this process (time.process_time), so a busy machine distorts it less than wall time.

Run: .venv/bin/python -m bench.micro.queue_machine [--messages 200000] [--memory-messages 1000000]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable

from cluster.queue import (
    Attach,
    Deliver,
    Enqueue,
    MsgId,
    Queue,
    QueueArgs,
    QueuedMessage,
    Settle,
)

PAYLOAD = b"x" * 16


def bench_direct(count: int, args: QueueArgs | None = None) -> float:
    queue = Queue("bench", args)
    queue.apply(Attach("c", 0))
    message = QueuedMessage(PAYLOAD, 16, True)
    apply = queue.apply
    started = time.process_time()
    for now_ms in range(count):
        effects = apply(Enqueue(message, now_ms))
        deliver = effects[1]
        assert isinstance(deliver, Deliver)
        apply(Settle("c", (deliver.msg_id,)))
    elapsed = time.process_time() - started
    assert queue.ready_count == 0 and queue.unacked_count == 0
    return count / elapsed


def bench_backlog(count: int) -> float:
    queue = Queue("bench")
    message = QueuedMessage(PAYLOAD, 16, True)
    apply = queue.apply
    started = time.process_time()
    for _ in range(count):
        apply(Enqueue(message, 0))
    pending: list[MsgId] = [e.msg_id for e in apply(Attach("c", 0, prefetch=100)) if isinstance(e, Deliver)]
    while pending:
        effects = apply(Settle("c", pending))
        pending = [e.msg_id for e in effects if isinstance(e, Deliver)]
    elapsed = time.process_time() - started
    assert queue.ready_count == 0 and queue.unacked_count == 0
    return count / elapsed


def bench_fanout(count: int, consumers: int = 1000, prefetch: int = 10) -> float:
    queue = Queue("bench")
    for index in range(consumers):
        queue.apply(Attach(index, 0, prefetch=prefetch))
    message = QueuedMessage(PAYLOAD, 16, True)
    apply = queue.apply
    unacked: dict[object, list[MsgId]] = {}
    started = time.process_time()
    for _ in range(count):
        for effect in apply(Enqueue(message, 0)):
            if isinstance(effect, Deliver):
                held = unacked.setdefault(effect.consumer_id, [])
                held.append(effect.msg_id)
                if len(held) == prefetch:
                    apply(Settle(effect.consumer_id, held))
                    unacked[effect.consumer_id] = []
    elapsed = time.process_time() - started
    return count / elapsed


def _traced_bytes_per_message(count: int, args: QueueArgs | None, shared_message: bool) -> float:
    gc.collect()
    tracemalloc.start()
    queue = Queue("mem", args)
    apply = queue.apply
    shared = QueuedMessage(0, 1024, True)
    base = tracemalloc.get_traced_memory()[0]
    for index in range(count):
        apply(Enqueue(shared if shared_message else QueuedMessage(index, 1024, True), index // 1000))
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert queue.ready_count == count
    return used / count


def measure_memory(count: int) -> dict[str, float]:
    """Bytes per ready message: with a QueuedMessage (int payload) each, and the machine's own share only."""
    ttl = QueueArgs(message_ttl_ms=3_600_000)
    return {
        "plain, with QueuedMessage": _traced_bytes_per_message(count, None, shared_message=False),
        "plain, machine only": _traced_bytes_per_message(count, None, shared_message=True),
        "x-message-ttl, machine only": _traced_bytes_per_message(count, ttl, shared_message=True),
        "x-max-priority 5, machine only": _traced_bytes_per_message(count, QueueArgs(max_priority=5), True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--memory-messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="report the best of this many runs")
    options = parser.parse_args()
    count = options.messages
    ttl = QueueArgs(message_ttl_ms=60_000)
    scenarios: list[tuple[str, Callable[[], float]]] = [
        ("direct   enqueue+deliver+settle", lambda: bench_direct(count)),
        ("ttl      enqueue+deliver+settle", lambda: bench_direct(count, ttl)),
        ("backlog  enqueue, then drain   ", lambda: bench_backlog(count)),
        ("fanout   1000 consumers        ", lambda: bench_fanout(count)),
    ]
    for label, run in scenarios:
        best = max(run() for _ in range(options.repeat))
        print(f"{label}: {best:>10,.0f} msg/s", flush=True)
    memory = measure_memory(options.memory_messages)
    for label, per_message in memory.items():
        print(f"memory   {label:<32} {per_message:>6,.0f} B/msg")
    machine_only = memory["plain, machine only"]
    print(f"         => a 10M backlog costs the machine ~{machine_only * 10_000_000 / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
