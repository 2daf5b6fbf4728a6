"""Shared pieces of the durability tests: a consumer whose acks are known to be durable, and the checks.

How it works: publishers are chaos/workload.py's (confirmed, one message in flight each, payload ids
"<run>-<publisher>-<sequence>", recorded as `chaos.history.Publish`). AMQP acks carry no confirm, so the
`DurableAckConsumer` proves its acks durable itself: after acking a batch (one `multiple` ack) it publishes a small
persistent marker on a second, confirmed channel of the same connection to a marker queue. The broker handles a
connection's frames in order and one group commit covers every append made before it, so the marker's confirm
means the ack's removal records were fsynced too. Each batch is recorded as an `AckBatch` (payload ids, when the
ack was sent, and when, if ever, the marker confirmed it).

`check_durability` then classifies the whole history (deliveries in arrival order):
- lost / unexpected / order violations: `chaos.checker.check` (order on first deliveries, redelivered=False);
- acked_came_back: a delivery of a payload after its ack was confirmed durable (must be none);
- unflagged_redeliveries: a second or later delivery of a payload without the redelivered flag (must be none);
- never_settled: a confirmed payload whose last delivery was never acked at all (must be none: an unacked
  message comes back after a crash, so some later delivery must exist and be acked). Unconfirmed payloads are
  exempt: the broker may deliver a message before the fsync that would confirm it (RabbitMQ does too), and a
  kill before that fsync rightly loses it;
- ack_in_doubt: payloads whose last ack went out but whose marker never confirmed (a kill came between): the
  ack may or may not have survived, so both outcomes are allowed; counted, and bounded by kills x batch size.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from chaos.checker import CheckResult, check
from chaos.history import Delivery, Publish
from chaos.workload import (
    CONNECTION_ERRORS,
    Backoff,
    Recorder,
    WorkloadConfig,
    connection_parameters,
    payload_id_of,
)

MARKER_QUEUE = "durability-ack-markers"
MARKER_QUEUE_ARGS = {"x-max-length": 16, "x-overflow": "drop-head"}  # markers only need to be written


@dataclass(frozen=True, slots=True)
class AckBatch:
    """One `multiple` ack of `payload_ids`; durable_ms is None when its marker was never confirmed."""

    payload_ids: tuple[str, ...]
    sent_ms: float
    durable_ms: float | None


class AckLog:
    """Thread-safe list of AckBatch records, bounded (past `batches_max` the run is void)."""

    def __init__(self, batches_max: int = 1_000_000) -> None:
        self._batches: list[AckBatch] = []
        self._lock = threading.Lock()
        self._batches_max = batches_max
        self.overflowed = False

    def add(self, batch: AckBatch) -> None:
        with self._lock:
            if len(self._batches) >= self._batches_max:
                self.overflowed = True
                return
            self._batches.append(batch)

    def batches(self) -> list[AckBatch]:
        with self._lock:
            return list(self._batches)


class DurableAckConsumer(threading.Thread):
    """Consumes `queue` with manual acks in batches of at most `batch_max`, each ack proven durable by a marker."""

    def __init__(self, config: WorkloadConfig, queue: str, recorder: Recorder, acks: AckLog,
                 batch_max: int = 20) -> None:
        super().__init__(name="durable-ack-consumer", daemon=True)
        self.config, self.queue, self.recorder, self.acks = config, queue, recorder, acks
        self.batch_max = batch_max
        self.stop_event = threading.Event()
        self.backoff = Backoff(config.backoff_ms_min, config.backoff_ms_max, self.stop_event)
        self.last_delivery_ms = 0.0

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self._consume_once(self.config.urls[0])
            except CONNECTION_ERRORS:
                self.backoff.wait()

    def _consume_once(self, url: str) -> None:
        connection = pika.BlockingConnection(connection_parameters(url, self.config))
        try:
            channel = connection.channel()
            channel.queue_declare(self.queue, durable=True)
            markers = connection.channel()
            markers.queue_declare(MARKER_QUEUE, durable=True, arguments=dict(MARKER_QUEUE_ARGS))
            markers.confirm_delivery()
            self.backoff.reset()
            channel.basic_qos(prefetch_count=self.config.prefetch)
            self._loop(channel, markers)
        finally:
            if connection.is_open:
                with contextlib.suppress(*CONNECTION_ERRORS):
                    connection.close()

    def _loop(self, channel: BlockingChannel, markers: BlockingChannel) -> None:
        pending: list[str] = []
        last_tag = 0
        for method, _props, body in channel.consume(self.queue, inactivity_timeout=0.1):
            if self.stop_event.is_set() and not pending:
                return
            if method is not None:
                now_ms = self.recorder.now_ms()
                payload_id = payload_id_of(body)
                self.recorder.add(Delivery(payload_id, "c", self.queue, bool(method.redelivered), now_ms))
                self.last_delivery_ms = now_ms
                pending.append(payload_id)
                last_tag = method.delivery_tag
            if pending and (method is None or len(pending) >= self.batch_max):
                self._ack(channel, markers, pending, last_tag)
                pending = []

    def _ack(self, channel: BlockingChannel, markers: BlockingChannel, payload_ids: list[str], tag: int) -> None:
        sent_ms = self.recorder.now_ms()
        durable_ms: float | None = None
        try:
            channel.basic_ack(tag, multiple=True)
            markers.basic_publish("", MARKER_QUEUE, b"ack-marker", pika.BasicProperties(delivery_mode=2))
            durable_ms = self.recorder.now_ms()
        finally:
            self.acks.add(AckBatch(tuple(payload_ids), sent_ms, durable_ms))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(self.config.socket_timeout_s * 4)


def queue_depth(url: str, config: WorkloadConfig, queue: str) -> int:
    """message_count of a passive queue.declare (ready messages), over a fresh connection."""
    connection = pika.BlockingConnection(connection_parameters(url, config))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def wait_drained(consumer: DurableAckConsumer, url: str, config: WorkloadConfig, queue: str,
                 timeout_s: float = 60.0, idle_ms: float = 800.0) -> bool:
    """Until the queue reports 0 ready and the consumer has received nothing for idle_ms (it then holds no
    unacked messages: it acks at most 100 ms after a delivery); False at the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            idle = consumer.recorder.now_ms() - consumer.last_delivery_ms >= idle_ms
            if idle and queue_depth(url, config, queue) == 0:
                return True
        except CONNECTION_ERRORS:
            pass
        time.sleep(0.1)
    return False


@dataclass(frozen=True, slots=True)
class DurabilityResult:
    checker: CheckResult
    acked_came_back: tuple[str, ...]
    unflagged_redeliveries: tuple[str, ...]
    never_settled: tuple[str, ...]
    ack_in_doubt: tuple[str, ...]
    redeliveries: int
    notes: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        return (f"{self.checker.summary()} acked_came_back={len(self.acked_came_back)} "
                f"unflagged_redeliveries={len(self.unflagged_redeliveries)} "
                f"never_settled={len(self.never_settled)} ack_in_doubt={len(self.ack_in_doubt)} "
                f"redeliveries={self.redeliveries}")


def check_durability(publishes: Sequence[Publish], deliveries: Sequence[Delivery],
                     acks: Sequence[AckBatch]) -> DurabilityResult:
    """Classify a history (see the module docstring). `deliveries` in arrival order."""
    durable_at: dict[str, float] = {}
    last_ack: dict[str, AckBatch] = {}
    for batch in sorted(acks, key=lambda b: b.sent_ms):
        for payload_id in batch.payload_ids:
            last_ack[payload_id] = batch
            if batch.durable_ms is not None and payload_id not in durable_at:
                durable_at[payload_id] = batch.durable_ms
    came_back: list[str] = []
    unflagged: list[str] = []
    seen: Counter[str] = Counter()
    last_delivery_ms: dict[str, float] = {}
    for delivery in deliveries:
        payload_id = delivery.payload_id
        if payload_id in durable_at and delivery.received_ms > durable_at[payload_id]:
            came_back.append(payload_id)
        if seen[payload_id] > 0 and not delivery.redelivered:
            unflagged.append(payload_id)
        seen[payload_id] += 1
        last_delivery_ms[payload_id] = delivery.received_ms
    confirmed = {p.payload_id for p in publishes if p.outcome == "confirmed"}
    never_settled = [p for p, at in last_delivery_ms.items()
                     if p in confirmed and (p not in last_ack or last_ack[p].sent_ms < at)]
    in_doubt = [p for p, batch in last_ack.items() if batch.durable_ms is None]
    redeliveries = sum(1 for d in deliveries if d.redelivered)
    return DurabilityResult(check(publishes, deliveries), tuple(sorted(set(came_back))),
                            tuple(sorted(set(unflagged))), tuple(sorted(never_settled)),
                            tuple(sorted(in_doubt)), redeliveries)
