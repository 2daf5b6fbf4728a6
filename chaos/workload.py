"""The chaos workload: confirmed publishers and manual-ack consumers over real AMQP connections (pika).

How it works: each publisher and consumer is a thread owning one pika BlockingConnection to one of the given AMQP
URLs (HAProxy or the nodes themselves), moving to the next URL and backing off (bounded, doubling) whenever the
connection fails. A publisher sends unique payloads (payload id = "<run>-<publisher>-<sequence>", also the
message_id) one at a time under publisher confirms and records each attempt's outcome: confirmed (basic.ack),
nacked, or unknown (the connection died before the answer); it never republishes a payload, so every payload id
has exactly one attempt. A consumer records every delivery (with the redelivered flag) before acking it, and the ack
after sending it; when told to stop it closes its connection itself and, once close-ok came back, records a
"closed" marker (the broker has taken every ack sent before on that connection); when its connection fails it
records a "connection-lost" marker before reconnecting (acks sent before it may have died with the connection). Publishers start on URL i, consumers on URL
i + consumer_url_offset, so with one URL per node they can be put on different nodes; with `consumer_urls` the
consumers and the drain use those instead (a shovel scenario: publishers on the source cluster, consumers on the
destination; the queues are then emptied on both sides at start). After the faults heal, `drain()` stops the consumers and empties every queue with basic.get until it stays empty. All records
go to a bounded, thread-safe `Recorder` in the order they happened (`chaos.history` record types).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from chaos.history import CLOSED, CONNECTION_LOST, Ack, Delivery, Fault, Outcome, Publish, Record

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (pika.exceptions.AMQPError, OSError, EOFError)


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    urls: tuple[str, ...]
    queues: tuple[str, ...] = ("chaos-q",)
    publishers: int = 2
    consumers_per_queue: int = 1
    messages_per_publisher: int = 1000  # 0: publish until the scenario's steps are over
    publish_interval_ms: float = 0.0
    consumer_url_offset: int = 0  # consumer i starts on URL i + offset (publisher i on URL i)
    durable: bool = True
    persistent: bool = True
    queue_arguments: dict[str, Any] = field(default_factory=dict)
    prefetch: int = 50
    heartbeat_s: int = 4
    socket_timeout_s: float = 3.0
    backoff_ms_min: float = 50.0
    backoff_ms_max: float = 1000.0
    drain_idle_s: float = 1.0
    drain_timeout_s: float = 60.0  # the drain gives up after this long without taking a message
    run_id: str = "run"
    consumer_urls: tuple[str, ...] = ()  # consumers and the drain use these instead of `urls` (a shovel scenario:
    # publishers on the source cluster, consumers on the destination)
    publish_exchange: str = ""  # publishers publish here with the queue's name as routing key (a federation
    # scenario: the federated exchange upstream)

    @property
    def consume_urls(self) -> tuple[str, ...]:
        return self.consumer_urls or self.urls


class Recorder:
    """Thread-safe history in arrival order, bounded by `records_max` (past it, `overflowed` voids the run)."""

    def __init__(self, records_max: int = 2_000_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._records: list[Record] = []
        self._lock = threading.Lock()
        self._records_max = records_max
        self._clock = clock
        self._start_s = clock()
        self.overflowed = False
        self.confirmed_count = 0

    def now_ms(self) -> float:
        return (self._clock() - self._start_s) * 1000.0

    def add(self, record: Record) -> None:
        with self._lock:
            if len(self._records) >= self._records_max:
                self.overflowed = True
                return
            self._records.append(record)
            if isinstance(record, Publish) and record.outcome == "confirmed":
                self.confirmed_count += 1

    def fault(self, kind: str, target: str, detail: str = "") -> None:
        self.add(Fault(kind, target, self.now_ms(), detail))

    def records(self) -> list[Record]:
        with self._lock:
            return list(self._records)


class Backoff:
    """Doubling delay between reconnects, from min to max, reset by a success; sleeps on the stop event."""

    def __init__(self, min_ms: float, max_ms: float, stop: threading.Event) -> None:
        self._min_ms, self._max_ms, self._stop = min_ms, max_ms, stop
        self._next_ms = min_ms

    def reset(self) -> None:
        self._next_ms = self._min_ms

    def wait(self) -> None:
        self._stop.wait(self._next_ms / 1000.0)
        self._next_ms = min(self._next_ms * 2, self._max_ms)


def connection_parameters(url: str, config: WorkloadConfig) -> pika.URLParameters:
    params = pika.URLParameters(url)
    params.heartbeat = config.heartbeat_s
    params.socket_timeout = config.socket_timeout_s
    params.stack_timeout = config.socket_timeout_s * 2
    params.blocked_connection_timeout = config.socket_timeout_s * 4
    params.connection_attempts = 1
    return params


@contextmanager
def open_channel(url: str, config: WorkloadConfig) -> Iterator[BlockingChannel]:
    """A channel with every workload queue declared; the connection is closed (quietly) on the way out."""
    connection = pika.BlockingConnection(connection_parameters(url, config))
    try:
        channel = connection.channel()
        for queue in config.queues:
            channel.queue_declare(queue, durable=config.durable, arguments=dict(config.queue_arguments) or None)
        yield channel
    finally:
        try:
            if connection.is_open:
                connection.close()
        except CONNECTION_ERRORS:
            pass


def payload_id_of(body: bytes) -> str:
    try:
        return str(json.loads(body)["id"])
    except (ValueError, KeyError, TypeError):
        return "unparseable:" + body[:64].hex()


class _Worker(threading.Thread):
    def __init__(self, name: str, index: int, config: WorkloadConfig, recorder: Recorder,
                 stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.config, self.recorder, self.stop_event = config, recorder, stop
        self._url_index = index
        self.backoff = Backoff(config.backoff_ms_min, config.backoff_ms_max, stop)
        self.connection_failures = 0

    def urls(self) -> tuple[str, ...]:
        return self.config.urls

    def next_url(self) -> str:
        urls = self.urls()
        url = urls[self._url_index % len(urls)]
        self._url_index += 1
        return url

    def run(self) -> None:
        while not self.stop_event.is_set() and not self.finished():
            connected = False
            try:
                with open_channel(self.next_url(), self.config) as channel:
                    connected = True
                    self.backoff.reset()
                    self.work(channel)
            except CONNECTION_ERRORS as error:
                self.connection_failures += 1
                if connected:
                    self.connection_lost(error)
                self.backoff.wait()

    def finished(self) -> bool:
        return False

    def connection_lost(self, error: BaseException) -> None:
        """The connection this worker had open failed (it reconnects next)."""

    def work(self, channel: BlockingChannel) -> None:
        raise NotImplementedError


class Publisher(_Worker):
    """Publishes messages_per_publisher unique payloads to one queue, each under a confirm; with 0, until told to
    stop (a scenario sized by its duration: it stops them when its steps are over)."""

    def __init__(self, index: int, config: WorkloadConfig, recorder: Recorder, stop: threading.Event) -> None:
        super().__init__(f"p{index}", index, config, recorder, stop)
        self.queue = config.queues[index % len(config.queues)]
        self.sequence = 0

    def finished(self) -> bool:
        return 0 < self.config.messages_per_publisher <= self.sequence

    def work(self, channel: BlockingChannel) -> None:
        channel.confirm_delivery()
        properties = pika.BasicProperties(delivery_mode=2 if self.config.persistent else 1)
        while not self.stop_event.is_set() and not self.finished():
            self.publish_one(channel, properties)
            if self.config.publish_interval_ms > 0:
                self.stop_event.wait(self.config.publish_interval_ms / 1000.0)

    def publish_one(self, channel: BlockingChannel, properties: pika.BasicProperties) -> None:
        sequence = self.sequence
        self.sequence += 1
        payload_id = f"{self.config.run_id}-{self.name}-{sequence}"
        body = json.dumps({"id": payload_id, "publisher": self.name, "seq": sequence}).encode()
        sent_ms = self.recorder.now_ms()
        outcome: Outcome = "unknown"
        try:
            channel.basic_publish(self.config.publish_exchange, self.queue, body, properties)
            outcome = "confirmed"
        except pika.exceptions.NackError:
            outcome = "nacked"
        finally:
            settled = self.recorder.now_ms() if outcome != "unknown" else None
            self.recorder.add(Publish(self.name, sequence, payload_id, self.queue, outcome, sent_ms, settled))


class Consumer(_Worker):
    """Consumes one queue with manual acks, recording each delivery before acking it."""

    def __init__(self, name: str, index: int, queue: str, config: WorkloadConfig, recorder: Recorder,
                 stop: threading.Event) -> None:
        super().__init__(name, index, config, recorder, stop)
        self.queue = queue

    def urls(self) -> tuple[str, ...]:
        return self.config.consume_urls

    def work(self, channel: BlockingChannel) -> None:
        channel.basic_qos(prefetch_count=self.config.prefetch)
        for method, _props, body in channel.consume(self.queue, inactivity_timeout=0.2):
            if self.stop_event.is_set():
                break
            if method is None:
                continue
            payload_id = payload_id_of(body)
            self.recorder.add(Delivery(payload_id, self.name, self.queue, bool(method.redelivered),
                                       self.recorder.now_ms()))
            channel.basic_ack(method.delivery_tag)
            self.recorder.add(Ack(payload_id, self.name, self.queue, self.recorder.now_ms()))
        if self.stop_event.is_set():
            self.close_cleanly(channel)

    def connection_lost(self, error: BaseException) -> None:
        """Marks the end of this connection: a later clean close settles no ack sent before this marker."""
        self.recorder.fault(CONNECTION_LOST, self.name, type(error).__name__)

    def close_cleanly(self, channel: BlockingChannel) -> None:
        """Close the connection and wait for close-ok; then every ack sent before it reached the broker."""
        connection = channel.connection
        connection.close()
        if connection.is_closed:
            self.recorder.fault(CLOSED, self.name)


class Workload:
    """Start publishers and consumers; `wait_published`, then `drain` once the faults have healed."""

    def __init__(self, config: WorkloadConfig, recorder: Recorder | None = None) -> None:
        self.config = config
        self.recorder = recorder or Recorder()
        self._publish_stop = threading.Event()
        self._consume_stop = threading.Event()
        self.publishers = [Publisher(i, config, self.recorder, self._publish_stop) for i in range(config.publishers)]
        self.consumers = [
            Consumer(f"c{qi}-{ci}", qi + ci + config.consumer_url_offset, queue, config, self.recorder,
                     self._consume_stop)
            for qi, queue in enumerate(config.queues) for ci in range(config.consumers_per_queue)
        ]

    def start(self, purge: bool = True) -> None:
        """Empty the queues (leftovers of an earlier, aborted run would be "unexpected"), then start the threads."""
        if purge:
            self.purge_queues()
        for worker in [*self.consumers, *self.publishers]:
            worker.start()

    def purge_queues(self) -> None:
        """Declare every queue and empty it through the first URL that answers (each tried once).

        Emptied with basic.get (auto-ack) until get-empty, not queue.purge: in cluster mode a get is answered once
        the queue's replica applied it, so the queue is empty at that point of its log, whereas a purge-ok may go
        out before the Purge is applied, and a late Purge would remove messages confirmed after it."""
        sides = [self.config.urls] + ([self.config.consumer_urls] if self.config.consumer_urls else [])
        for urls in sides:
            self._purge_through(urls)

    def _purge_through(self, urls: tuple[str, ...]) -> None:
        failures: list[str] = []
        for url in urls:
            try:
                with open_channel(url, self.config) as channel:
                    for queue in self.config.queues:
                        emptied = empty_queue(channel, queue)
                        self.recorder.fault("purge", queue, f"{emptied} messages")
                return
            except CONNECTION_ERRORS as error:
                failures.append(f"{url}: {error!r}")
        raise RuntimeError(f"could not declare/empty the workload queues: {'; '.join(failures)}")

    def publishing_done(self) -> bool:
        return not any(p.is_alive() for p in self.publishers)

    def wait_published(self, timeout_s: float) -> bool:
        """Wait for every publisher to send its quota; False if the timeout came first (they are stopped)."""
        deadline = time.monotonic() + timeout_s
        for publisher in self.publishers:
            publisher.join(max(0.0, deadline - time.monotonic()))
        done = self.publishing_done()
        self.stop_publishing()
        return done

    def stop_publishing(self) -> None:
        self._publish_stop.set()
        for publisher in self.publishers:
            publisher.join(self.config.socket_timeout_s * 4)

    def drain(self) -> bool:
        """Stop publishing and consuming, then basic.get every queue until empty; True if all drained."""
        self.stop_publishing()
        self.recorder.fault("drain", "workload")
        self._consume_stop.set()
        for consumer in self.consumers:
            consumer.join(self.config.socket_timeout_s * 4)
        return all(drain_queue(queue, self.config, self.recorder) for queue in self.config.queues)

    def stop(self) -> None:
        """Stop every thread without draining (after an error)."""
        self._consume_stop.set()
        self.stop_publishing()
        for consumer in self.consumers:
            consumer.join(self.config.socket_timeout_s * 4)

    def records(self) -> list[Record]:
        return self.recorder.records()


LEFTOVERS_MAX = 1_000_000


def empty_queue(channel: BlockingChannel, queue: str) -> int:
    """basic.get with auto-ack until get-empty (at most LEFTOVERS_MAX); the number of messages taken."""
    for taken in range(LEFTOVERS_MAX):
        method, _props, _body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return taken
    raise RuntimeError(f"queue {queue} still not empty after {LEFTOVERS_MAX} gets")


class _Progress:
    """The drain's deadline: `drain_timeout_s` after the last message taken (a slow but moving drain goes on)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadline_s = time.monotonic() + timeout_s

    def moved(self) -> None:
        self.deadline_s = time.monotonic() + self.timeout_s

    def alive(self) -> bool:
        return time.monotonic() < self.deadline_s


def drain_queue(queue: str, config: WorkloadConfig, recorder: Recorder) -> bool:
    """basic.get (acking each) until the queue has been empty for drain_idle_s; reconnect on failure. Gives up
    after `drain_timeout_s` without taking a message."""
    stop = threading.Event()
    backoff = Backoff(config.backoff_ms_min, config.backoff_ms_max, stop)
    urls = config.consume_urls
    progress = _Progress(config.drain_timeout_s)
    attempt = 0
    while progress.alive():
        url = urls[attempt % len(urls)]
        attempt += 1
        try:
            with open_channel(url, config) as channel:
                if _get_until_idle(channel, queue, config, recorder, progress):
                    return True
        except CONNECTION_ERRORS:
            backoff.wait()
    return False


def _get_until_idle(channel: BlockingChannel, queue: str, config: WorkloadConfig, recorder: Recorder,
                    progress: _Progress) -> bool:
    idle_since = time.monotonic()
    while progress.alive():
        method, _props, body = channel.basic_get(queue, auto_ack=False)
        if method is None:
            if time.monotonic() - idle_since >= config.drain_idle_s:
                return True
            time.sleep(0.05)
            continue
        payload_id = payload_id_of(body)
        recorder.add(Delivery(payload_id, "drain", queue, bool(method.redelivered), recorder.now_ms()))
        channel.basic_ack(method.delivery_tag)
        recorder.add(Ack(payload_id, "drain", queue, recorder.now_ms()))
        idle_since = time.monotonic()
        progress.moved()
    return False
