"""First message on a new queue: how long a client waits for declare-ok, and then for the confirm and the delivery
of the first message it publishes to the queue it just declared (issue 16: a new queue must answer at once).

One trial, on one fresh connection to one node (connection setup is not timed): channel 1 declares a fresh durable
queue (with the workload's arguments, e.g. x-queue-type=quorum) and times declare-ok, then consumes from it
(consume-ok timed as well, for the JSON); channel 2, already in confirm mode, publishes one persistent 100 B
message, and the trial times, from that write, the publisher confirm on channel 2 and the basic.deliver on channel
1. Then it acks, deletes the queue and closes. A reply that does not come within the timeout leaves its figure
None (the trial then counts as failed). `summarize` turns trials into one `Measurement` (kind "new-queue"):
latency = publish to delivery, confirm latency = publish to confirm, declare-ok besides; p50 and p99 (nearest
rank: with fewer than 100 trials the p99 is the largest). Trials in a cluster go round-robin over its nodes, as clients behind a
load balancer would.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench import frames
from bench.client import BenchConnection, Endpoint
from bench.frames import ProtocolError
from bench.measurement import BODY_SIZE, NEW_QUEUE, Measurement
from bench.stats import summarize_latencies_ns

TRIAL_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class NewQueueTrial:
    """One new queue's figures in ns; None: that reply did not arrive within the timeout."""

    node: str
    declare_ok_ns: int | None
    consume_ok_ns: int | None = None
    first_confirm_ns: int | None = None
    first_delivery_ns: int | None = None
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.error is None and self.first_confirm_ns is not None and self.first_delivery_ns is not None


def run_trial(
    endpoint: Endpoint, node: str, queue: str, arguments: dict[str, str | int | bool],
    timeout_s: float = TRIAL_TIMEOUT_S,
) -> NewQueueTrial:
    """Declare `queue`, consume from it, publish one message to it; time each reply (see the module doc)."""
    connection = BenchConnection(endpoint, timeout_s=timeout_s)
    declared = False
    try:
        connection.open_channels([1, 2])
        connection.call(2, frames.confirm_select(2), frames.CONFIRM_SELECT_OK)
        started = time.monotonic_ns()
        connection.call(1, frames.queue_declare(1, queue, True, arguments), frames.QUEUE_DECLARE_OK)
        declared = True
        declare_ok_ns = time.monotonic_ns() - started
        started = time.monotonic_ns()
        connection.call(1, frames.basic_consume(1, queue, "bench-new-queue"), frames.BASIC_CONSUME_OK)
        consume_ok_ns = time.monotonic_ns() - started
        published = time.monotonic_ns()
        connection.sock.sendall(frames.publish_prefix(2, "", queue, BODY_SIZE, frames.PERSISTENT)
                                + frames.stamped_body(published, BODY_SIZE) + frames.FRAME_END)
        confirm_ns, delivery_ns, delivery_tag = _await_confirm_and_delivery(connection, published)
        if delivery_tag is not None:
            connection.sock.sendall(frames.basic_ack(1, delivery_tag, False))
        return NewQueueTrial(node, declare_ok_ns, consume_ok_ns, confirm_ns, delivery_ns)
    except (OSError, ProtocolError) as error:  # a timeout is an OSError too
        return NewQueueTrial(node, None, error=f"{type(error).__name__}: {error}")
    finally:
        if declared:
            _delete_quietly(connection, queue)
        connection.close()


def _await_confirm_and_delivery(
    connection: BenchConnection, published_ns: int
) -> tuple[int | None, int | None, int | None]:
    """Read until the confirm (channel 2) and the delivery (channel 1) have both arrived, or the socket times out:
    (publish to confirm ns, publish to delivery ns, delivery tag)."""
    confirm_ns: int | None = None
    delivery_ns: int | None = None
    delivery_tag: int | None = None
    try:
        while confirm_ns is None or delivery_ns is None:
            received = connection.next_frame()
            if received.frame_type != frames.FRAME_METHOD:
                continue
            method = received.method_id
            if method in (frames.CONNECTION_CLOSE, frames.CHANNEL_CLOSE):
                code, text = frames.parse_close(received.payload)
                raise ProtocolError(f"closed by the broker: {code} {text}")
            if received.channel == 2 and method == frames.BASIC_NACK:
                raise ProtocolError("the first message was nacked")
            if received.channel == 2 and method == frames.BASIC_ACK and confirm_ns is None:
                confirm_ns = time.monotonic_ns() - published_ns
            elif received.channel == 1 and method == frames.BASIC_DELIVER and delivery_ns is None:
                delivery_ns = time.monotonic_ns() - published_ns
                delivery_tag = frames.parse_deliver_tag(received.payload)
    except TimeoutError:
        pass
    return confirm_ns, delivery_ns, delivery_tag


def _delete_quietly(connection: BenchConnection, queue: str) -> None:
    with contextlib.suppress(OSError, ProtocolError):
        connection.call(1, frames.queue_delete(1, queue), frames.QUEUE_DELETE_OK)


def run_trials(
    nodes: Sequence[tuple[str, Endpoint]], trials: int, arguments: dict[str, str | int | bool], prefix: str,
    timeout_s: float = TRIAL_TIMEOUT_S,
) -> list[NewQueueTrial]:
    """`trials` fresh queues named `prefix`-i, one after the other, trial i on node i mod len(nodes)."""
    found = []
    for index in range(trials):
        node, endpoint = nodes[index % len(nodes)]
        queue = f"{prefix}-{index}"
        try:
            found.append(run_trial(endpoint, node, queue, arguments, timeout_s))
        except (OSError, ProtocolError) as error:  # could not even connect
            found.append(NewQueueTrial(node, None, error=f"{type(error).__name__}: {error}"))
    return found


def _percentiles_ms(values_ns: Sequence[int | None]) -> tuple[float | None, float | None]:
    """p50 and p99 (nearest rank: the largest with fewer than 100 values) in ms of the values that are known."""
    summary = summarize_latencies_ns([value for value in values_ns if value is not None])
    return summary.p50_ms, summary.p99_ms


def summarize(label: str, workload: str, broker: str, trials: Sequence[NewQueueTrial], note: str | None = None
              ) -> Measurement:
    """One Measurement (kind "new-queue") of a broker's trials: p50 and max of each figure over the trials that
    got it; `error` says how many trials failed (and the first reason) when any did."""
    delivery_p50, delivery_p99 = _percentiles_ms([trial.first_delivery_ns for trial in trials])
    confirm_p50, confirm_p99 = _percentiles_ms([trial.first_confirm_ns for trial in trials])
    declare_p50, declare_p99 = _percentiles_ms([trial.declare_ok_ns for trial in trials])
    deliveries = [trial.first_delivery_ns for trial in trials if trial.first_delivery_ns is not None]
    failed = [trial for trial in trials if not trial.complete]
    error = None
    if failed or not trials:
        reason = next((trial.error for trial in failed if trial.error), None) or (
            f"no confirm or delivery within {TRIAL_TIMEOUT_S:.0f} s" if failed else "no trials")
        error = f"{len(failed)} of {len(trials)} new-queue trials failed: {reason}"
    nodes = sorted({trial.node for trial in trials})
    where = f"{len(trials)} new queues on {', '.join(nodes)}"
    return Measurement(
        label=label, workload=workload, broker=broker, kind=NEW_QUEUE,
        latency_samples=len(deliveries), latency_p50_ms=delivery_p50, latency_p99_ms=delivery_p99,
        latency_max_ms=max(deliveries) / 1e6 if deliveries else None,
        confirm_p50_ms=confirm_p50, confirm_p99_ms=confirm_p99,
        declare_ok_p50_ms=declare_p50, declare_ok_p99_ms=declare_p99,
        error=error, note=where if note is None else f"{where}; {note}",
    )
