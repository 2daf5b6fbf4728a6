"""What one benchmark measurement is (`Measurement`) and the arithmetic on it: CPU per message, deliveries against
confirms (a growing backlog), and which figures a kind of measurement has. Pure, no I/O.

Two kinds: "flow" (a workload run for a measured window, at saturation or at a fixed publish rate) with rates,
end-to-end latency (publish to delivery at the consumer, from the timestamp in the message body) and confirm
latency (a publish write to the confirm of its last message); and "new-queue" (`bench.newqueue`: declare a fresh
queue, publish one message, time declare-ok, the confirm and the delivery), whose latency fields hold the first
message's publish-to-delivery and publish-to-confirm times over the trials and which has no rates. Results files
written before a field existed read with its default (kind "flow", figures None).
"""

from __future__ import annotations

from dataclasses import dataclass

BODY_SIZE = 100  # every workload publishes persistent 100 B bodies
FANOUT_QUEUES = 10  # workload (c): one published message is delivered this many times
FLOW = "flow"
NEW_QUEUE = "new-queue"
BACKLOG_SHORTFALL = 0.05  # deliveries more than 5% below what the confirms call for: the queue is growing


def deliveries_per_message(workload: str) -> int:
    """How many deliveries one confirmed message should make in `workload` (fanout: one per bound queue)."""
    return FANOUT_QUEUES if workload == "c" else 1


def delivery_shortfall(confirmed_per_s: float, delivered_per_s: float, per_message: int = 1) -> float | None:
    """How far deliveries fall below what the confirms call for, as a fraction of it (0.2: 20% fewer deliveries
    than confirmed messages; negative: more, e.g. a backlog from the warm-up draining); None without confirms."""
    expected = confirmed_per_s * per_message
    if expected <= 0:
        return None
    return 1.0 - delivered_per_s / expected


def is_backlog(shortfall: float | None) -> bool:
    """A shortfall beyond BACKLOG_SHORTFALL (exactly 5% is not; the epsilon absorbs float rounding of the ratio)."""
    return shortfall is not None and shortfall > BACKLOG_SHORTFALL + 1e-9


@dataclass(frozen=True, slots=True)
class Measurement:
    """One figure set for one workload (or one rate, or the new-queue trials) on one broker.

    latency_*: end to end, publish to delivery at the consumer; confirm_*: publish to confirm."""

    label: str  # "a", "b", "b@leader", "c", "d", "e@<rate>/s", "a@<rate>/s", "b@<rate>/s", "a/new-q", "b/new-q"
    workload: str
    broker: str
    confirmed_msgs_per_s: float = 0.0
    delivered_msgs_per_s: float = 0.0
    published_msgs: int = 0
    confirmed_msgs: int = 0
    nacked_msgs: int = 0
    delivered_msgs: int = 0
    measured_s: float = 0.0
    latency_samples: int = 0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_p999_ms: float | None = None
    latency_max_ms: float | None = None
    target_rate_msgs_per_s: float | None = None
    loadgen_cpu_max_fraction: float = 0.0  # busiest load-generator process: CPU s / measured s (1.0 = saturated)
    error: str | None = None
    note: str | None = None
    broker_cpu_cores: float | None = None  # broker process CPU s per measured s (single local node; None otherwise)
    load_average_1m: float | None = None  # of the machine, when the measurement started
    round_number: int = 1  # with `raftmq bench --rounds N`: which round (1..N) took it (bench.rounds)
    kind: str = FLOW  # FLOW or NEW_QUEUE
    confirm_p50_ms: float | None = None  # publish write -> confirm of its last message (first publisher channel)
    confirm_p99_ms: float | None = None
    declare_ok_p50_ms: float | None = None  # new-queue only: queue.declare -> declare-ok
    declare_ok_p99_ms: float | None = None

    @property
    def broker_cpu_us_per_msg(self) -> float | None:
        """Broker CPU per confirmed message: steadier than throughput when other jobs share the machine."""
        if self.broker_cpu_cores is None or self.confirmed_msgs_per_s <= 0:
            return None
        return self.broker_cpu_cores * 1e6 / self.confirmed_msgs_per_s

    @property
    def is_new_queue(self) -> bool:
        return self.kind == NEW_QUEUE

    @property
    def delivery_shortfall(self) -> float | None:
        """Deliveries below what the confirms call for, as a fraction (see `delivery_shortfall`)."""
        if self.is_new_queue or self.error:
            return None
        return delivery_shortfall(self.confirmed_msgs_per_s, self.delivered_msgs_per_s,
                                  deliveries_per_message(self.workload))

    @property
    def backlog_growing(self) -> bool:
        """delivered/s more than 5% below confirmed/s: the consumer falls behind and the queue grows."""
        return is_backlog(self.delivery_shortfall)


@dataclass(frozen=True, slots=True)
class FailoverFigures:
    """One broker's failover runs (`raftmq bench failover`): ms from the kill -9 of a quorum queue leader's node
    to the first confirm after it on a survivor, one figure per run; `error` when the runs could not be made."""

    broker: str
    first_confirm_ms: tuple[float, ...] = ()
    error: str | None = None
