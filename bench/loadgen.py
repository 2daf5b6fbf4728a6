"""The load generator's hot loops: one publisher or consumer per OS process, on a raw socket.

Publisher: every target (a channel publishing to one exchange/routing key) is in confirm mode with a window of
outstanding messages. Each turn it sends, per target, as many messages as the window (and, for paced runs, the
rate) allows, as one `bytes` blob: the pre-encoded basic.publish + header + body-frame head, then a body whose
first 8 bytes are the send time (`time.monotonic_ns`, shared by every process on Linux), repeated. It then reads
(without blocking while it could still send; the socket has no timeout, see `run_publisher`) and parses only
basic.ack/nack frames, timing each write of the first target until its last message is confirmed. Consumer:
basic.qos prefetch, basic.consume on every channel, reads big chunks, walks frames with `struct`, takes the
delivery tag of basic.deliver and the timestamp of body frames, and after each chunk (or, with `ack_every`, once
that many deliveries are unacked on a channel, or when idle) acks per channel with one `multiple` ack.

Counts (messages, socket writes and reads) are snapshotted when the warm-up ends and when the run ends;
`WorkerResult` carries the difference, plus latency samples (ns) taken after the warm-up. A worker never raises
across the process boundary: errors are reported.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections import deque
from dataclasses import dataclass, field, replace

from bench import frames
from bench.client import BenchConnection, Endpoint
from bench.confirms import ConfirmTracker
from bench.frames import ProtocolError

RECV_BYTES = 1024 * 1024
PACED_TICK_S = 0.001  # paced publishers send what is due at most once per tick (one write per message is too dear)
_FRAME_HEAD = struct.Struct(">BHI")
_METHOD_IDS = struct.Struct(">HH")
_U64 = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class Timing:
    """When a run starts (monotonic ns), how long the warm-up is and how long it is measured."""

    start_ns: int
    warmup_s: float
    duration_s: float

    @property
    def measure_from_ns(self) -> int:
        return self.start_ns + int(self.warmup_s * 1e9)

    @property
    def end_ns(self) -> int:
        return self.measure_from_ns + int(self.duration_s * 1e9)


@dataclass(frozen=True, slots=True)
class PublishTarget:
    exchange: str
    routing_key: str


@dataclass(frozen=True, slots=True)
class PublisherSpec:
    endpoint: Endpoint
    targets: tuple[PublishTarget, ...]
    body_size: int = 100
    window_per_channel: int = 256
    batch_max: int = 64
    persistent: bool = True
    rate_msgs_per_s: float | None = None  # None: as fast as confirms allow


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    endpoint: Endpoint
    queues: tuple[str, ...]
    prefetch: int = 1000
    latency_sample_every: int = 1
    ack_every: int = 0  # 0: one multiple-ack per channel after every read; N: once N deliveries are unacked (or idle)


@dataclass(frozen=True, slots=True)
class WorkerResult:
    role: str  # "publisher" | "consumer"
    error: str | None = None
    published: int = 0  # during the measured window
    confirmed: int = 0
    nacked: int = 0
    delivered: int = 0
    measured_s: float = 0.0
    cpu_s: float = 0.0  # this worker's CPU time during the measured window: near measured_s means it saturated
    latencies_ns: list[int] = field(default_factory=list)
    writes: int = 0  # socket writes (sendall) during the measured window: publish blobs, or ack batches
    reads: int = 0  # socket reads that returned data during the measured window
    confirm_latencies_ns: list[int] = field(default_factory=list)  # publisher: write of a batch -> its last confirm


class _Counters:
    """Mutable counters of one worker, plus the snapshot taken when the warm-up ends."""

    __slots__ = (
        "baseline", "baseline_cpu_s", "baseline_ns", "confirmed", "delivered", "nacked", "published", "reads", "writes",
    )

    def __init__(self) -> None:
        self.published = 0
        self.confirmed = 0
        self.nacked = 0
        self.delivered = 0
        self.writes = 0
        self.reads = 0
        self.baseline: tuple[int, ...] | None = None
        self.baseline_ns = 0
        self.baseline_cpu_s = 0.0

    def snapshot(self) -> tuple[int, ...]:
        return (self.published, self.confirmed, self.nacked, self.delivered, self.writes, self.reads)

    def mark_baseline(self, now_ns: int) -> None:
        self.baseline = self.snapshot()
        self.baseline_ns = now_ns
        self.baseline_cpu_s = time.process_time()

    def result(self, role: str, now_ns: int, latencies_ns: list[int]) -> WorkerResult:
        base = self.baseline or self.snapshot()
        start_ns = self.baseline_ns if self.baseline is not None else now_ns
        published, confirmed, nacked, delivered, writes, reads = (
            now - then for now, then in zip(self.snapshot(), base, strict=True)
        )
        cpu_s = time.process_time() - self.baseline_cpu_s if self.baseline is not None else 0.0
        measured_s = (now_ns - start_ns) / 1e9
        return WorkerResult(
            role, None, published, confirmed, nacked, delivered, measured_s, cpu_s, latencies_ns, writes, reads
        )


# --- publisher ----------------------------------------------------------------------------------------------


def setup_publisher(spec: PublisherSpec) -> BenchConnection:
    connection = BenchConnection(spec.endpoint)
    channels = list(range(1, len(spec.targets) + 1))
    connection.open_channels(channels)
    connection.sock.sendall(b"".join(frames.confirm_select(channel) for channel in channels))
    for channel in channels:
        connection.wait_method(channel, frames.CONFIRM_SELECT_OK)
    return connection


def run_publisher(spec: PublisherSpec, connection: BenchConnection, timing: Timing) -> WorkerResult:
    mode = frames.PERSISTENT if spec.persistent else frames.TRANSIENT
    prefixes = [
        frames.publish_prefix(index + 1, target.exchange, target.routing_key, spec.body_size, mode)
        for index, target in enumerate(spec.targets)
    ]
    padding = b"x" * (spec.body_size - 8) + frames.FRAME_END
    trackers = [ConfirmTracker() for _ in spec.targets]
    counters = _Counters()
    sock = connection.sock
    buffer = bytearray()
    batches_in_flight: deque[tuple[int, int]] = deque()  # first target's (last tag, write ns); at most a window's
    confirm_latencies: list[int] = []
    # No timeout: with one, CPython polls for readability before every recv and MSG_DONTWAIT no longer stops it
    # from blocking (each "non-blocking" read waited for the next confirm, so a publisher kept about one batch in
    # flight whatever its window; found 2026-11-23, see docs/benchmarks.md "Load generator fidelity").
    sock.settimeout(None)
    _sleep_until(timing.start_ns)
    while True:
        now_ns = time.monotonic_ns()
        if now_ns >= timing.end_ns:
            break
        if counters.baseline is None and now_ns >= timing.measure_from_ns:
            counters.mark_baseline(now_ns)
        allowance = _allowance(spec, timing, counters.published, now_ns)
        blob_parts: list[bytes] = []
        stamp = _U64.pack(now_ns)
        for index, tracker in enumerate(trackers):
            count = min(spec.window_per_channel - tracker.outstanding, spec.batch_max, allowance)
            if count <= 0:
                continue
            blob_parts.append((prefixes[index] + stamp + padding) * count)
            tracker.on_published(count)
            counters.published += count
            allowance -= count
        if blob_parts:
            sock.sendall(b"".join(blob_parts))
            counters.writes += 1
            if not batches_in_flight or batches_in_flight[-1][0] < trackers[0].published:  # the first target sent
                batches_in_flight.append((trackers[0].published, now_ns))
        wait_s = _read_wait_s(spec, timing, counters.published, sent=bool(blob_parts))
        _read_confirms(sock, buffer, trackers, counters, wait_s)
        _time_confirmed_batches(batches_in_flight, trackers[0].settled_upto, counters, confirm_latencies)
    result = counters.result("publisher", time.monotonic_ns(), [])
    return replace(result, confirm_latencies_ns=confirm_latencies)


def _time_confirmed_batches(
    batches_in_flight: deque[tuple[int, int]], settled_upto: int, counters: _Counters, latencies: list[int]
) -> None:
    """Confirm latency of each batch written on the first target whose last message is now settled."""
    if not batches_in_flight or batches_in_flight[0][0] > settled_upto:
        return
    now_ns = time.monotonic_ns()
    while batches_in_flight and batches_in_flight[0][0] <= settled_upto:
        _, written_ns = batches_in_flight.popleft()
        if counters.baseline is not None:
            latencies.append(now_ns - written_ns)


def _allowance(spec: PublisherSpec, timing: Timing, published: int, now_ns: int) -> int:
    if spec.rate_msgs_per_s is None:
        return 1 << 30
    due = int((now_ns - timing.start_ns) / 1e9 * spec.rate_msgs_per_s) + 1
    return max(0, due - published)


def _read_wait_s(spec: PublisherSpec, timing: Timing, published: int, sent: bool) -> float | None:
    """0 = poll without blocking; a number = block at most that long. Unpaced publishers that could not send
    (every window full) block until confirms arrive; paced ones wait until the next message is due, at least a tick."""
    if spec.rate_msgs_per_s is None:
        return 0.0 if sent else 0.05
    next_due_ns = timing.start_ns + int(published / spec.rate_msgs_per_s * 1e9)
    return max(PACED_TICK_S, min(0.05, (next_due_ns - time.monotonic_ns()) / 1e9))


def _tls_recv_now(sock: socket.socket) -> bytes:
    """A non-blocking read on a TLS socket (which takes no recv flags): BlockingIOError when nothing is there."""
    sock.setblocking(False)
    try:
        return sock.recv(RECV_BYTES)
    except ssl.SSLWantReadError:
        raise BlockingIOError from None
    finally:
        sock.settimeout(None)


def _read_confirms(
    sock: socket.socket, buffer: bytearray, trackers: list[ConfirmTracker], counters: _Counters, wait_s: float | None
) -> None:
    try:
        if wait_s == 0.0:
            data = sock.recv(RECV_BYTES, socket.MSG_DONTWAIT) if type(sock) is socket.socket else _tls_recv_now(sock)
        else:
            sock.settimeout(wait_s)
            data = sock.recv(RECV_BYTES)
            sock.settimeout(None)
    except (BlockingIOError, TimeoutError):
        sock.settimeout(None)
        return
    if not data:
        raise ProtocolError("broker closed the publisher's connection")
    counters.reads += 1
    buffer += data
    position = 0
    size_total = len(buffer)
    while size_total - position >= 8:
        frame_type, channel, size = _FRAME_HEAD.unpack_from(buffer, position)
        end = position + 7 + size
        if end >= size_total:
            break
        if frame_type == frames.FRAME_METHOD:
            method_id = _METHOD_IDS.unpack_from(buffer, position + 7)
            if method_id in (frames.BASIC_ACK, frames.BASIC_NACK):
                tag, multiple = frames.parse_ack(buffer, position + 7)
                newly = trackers[channel - 1].settle(tag, multiple)
                if method_id == frames.BASIC_ACK:
                    counters.confirmed += newly
                else:
                    counters.nacked += newly
            elif method_id in (frames.CONNECTION_CLOSE, frames.CHANNEL_CLOSE):
                code, text = frames.parse_close(bytes(buffer[position + 7 : end]))
                raise ProtocolError(f"publisher closed by broker: {code} {text}")
        position = end + 1
    del buffer[:position]


# --- consumer -----------------------------------------------------------------------------------------------


def setup_consumer(spec: ConsumerSpec) -> BenchConnection:
    connection = BenchConnection(spec.endpoint)
    channels = list(range(1, len(spec.queues) + 1))
    connection.open_channels(channels)
    connection.sock.sendall(b"".join(frames.basic_qos(channel, spec.prefetch) for channel in channels))
    for channel in channels:
        connection.wait_method(channel, frames.BASIC_QOS_OK)
    consumes = [frames.basic_consume(channel, queue, f"bench-{channel}") for channel, queue in zip(channels, spec.queues, strict=True)]
    connection.sock.sendall(b"".join(consumes))
    for channel in channels:
        connection.wait_method(channel, frames.BASIC_CONSUME_OK)
    return connection


def run_consumer(spec: ConsumerSpec, connection: BenchConnection, timing: Timing) -> WorkerResult:
    sock = connection.sock
    counters = _Counters()
    latencies: list[int] = []
    last_tags = [0] * (len(spec.queues) + 1)
    acked_tags = [0] * (len(spec.queues) + 1)
    buffer = bytearray()
    for pending in connection.pending:  # frames read during setup (early deliveries) are replayed
        buffer += frames.frame(pending.frame_type, pending.channel, pending.payload)
    connection.pending.clear()
    sock.settimeout(0.05)
    sample_every = max(1, spec.latency_sample_every)
    ack_every = _ack_threshold(spec)
    while True:
        now_ns = time.monotonic_ns()
        if now_ns >= timing.end_ns:
            break
        if counters.baseline is None and now_ns >= timing.measure_from_ns:
            counters.mark_baseline(now_ns)
        try:
            data = sock.recv(RECV_BYTES)
        except TimeoutError:
            _send_acks(sock, counters, last_tags, acked_tags, 1)  # idle: settle whatever a threshold held back
            continue
        if not data:
            raise ProtocolError("broker closed the consumer's connection")
        counters.reads += 1
        buffer += data
        now_ns = time.monotonic_ns()
        record = latencies if counters.baseline is not None else None
        _parse_deliveries(buffer, counters, last_tags, record, now_ns, sample_every)
        _send_acks(sock, counters, last_tags, acked_tags, ack_every)
    return counters.result("consumer", time.monotonic_ns(), latencies)


def _ack_threshold(spec: ConsumerSpec) -> int:
    """Unacked deliveries per channel that trigger its multiple-ack; below half the prefetch, so that the broker
    never stops sending while acks are held back."""
    if spec.ack_every <= 1:
        return 1
    return max(1, min(spec.ack_every, spec.prefetch // 2)) if spec.prefetch > 0 else spec.ack_every


def _send_acks(
    sock: socket.socket, counters: _Counters, last_tags: list[int], acked_tags: list[int], threshold: int
) -> None:
    """One multiple-ack per channel with at least `threshold` deliveries unacked, all in one write."""
    acks = []
    for channel in range(1, len(last_tags)):
        if last_tags[channel] - acked_tags[channel] >= threshold:
            acks.append(frames.basic_ack(channel, last_tags[channel], True))
            acked_tags[channel] = last_tags[channel]
    if acks:
        sock.sendall(b"".join(acks))
        counters.writes += 1


def _parse_deliveries(
    buffer: bytearray, counters: _Counters, last_tags: list[int], latencies: list[int] | None, now_ns: int, sample_every: int
) -> None:
    position = 0
    size_total = len(buffer)
    delivered = counters.delivered
    while size_total - position >= 8:
        frame_type, channel, size = _FRAME_HEAD.unpack_from(buffer, position)
        end = position + 7 + size
        if end >= size_total:
            break
        if frame_type == frames.FRAME_BODY:
            if latencies is not None and delivered % sample_every == 0 and size >= 8:
                latencies.append(now_ns - _U64.unpack_from(buffer, position + 7)[0])
        elif frame_type == frames.FRAME_METHOD:
            method_id = _METHOD_IDS.unpack_from(buffer, position + 7)
            if method_id == frames.BASIC_DELIVER:
                last_tags[channel] = frames.parse_deliver_tag(buffer, position + 7)
                delivered += 1
            elif method_id in (frames.CONNECTION_CLOSE, frames.CHANNEL_CLOSE):
                code, text = frames.parse_close(bytes(buffer[position + 7 : end]))
                raise ProtocolError(f"consumer closed by broker: {code} {text}")
        position = end + 1
    counters.delivered = delivered
    del buffer[:position]


def _sleep_until(deadline_ns: int) -> None:
    remaining_s = (deadline_ns - time.monotonic_ns()) / 1e9
    if remaining_s > 0:
        time.sleep(remaining_s)
