"""ShovelLink: the pure state machine of one shovel (what to publish, ack, nack, when to reconnect, when to stop).

Pure: inputs are method calls with `now_ms` (wall-clock milliseconds, used for the timestamp header and the
reconnect timer), outputs are lists of frozen effects the runtime (cluster/shovel/runtime.py) carries out over two
link connections. States: `starting` (connecting, or waiting `reconnect-delay` after a failure), `running` (both
ends connected, consuming), `terminated` (with a reason: deleted, or `src-delete-after` reached).

Inputs:
- `start(now_ms)` -> `Connect(src_index, dest_index)`: open the source and destination URIs at those indexes
  (each list is tried in turn: after a failure the index of the failed side moves to the next URI).
- `connected(now_ms, queue_length)` once both ends are up, the topology declared and the consumer started
  (`queue_length`: the source queue's message count from queue.declare-ok, for `src-delete-after: queue-length`).
- `connect_failed(side, reason, now_ms)` / `down(side, reason, now_ms)`: the attempt failed, or a running
  connection was lost -> `Disconnect` and a reconnect timer; the unacked deliveries are forgotten (the source
  broker requeues them when the source connection ends: at least once, duplicates possible).
- `delivery(tag, exchange, routing_key, properties, body, now_ms)` -> `Publish` (destination exchange/key and
  headers computed here), then per ack mode: `no-ack` nothing more; `on-publish` `AckSource(tag)` right after the
  publish; `on-confirm` the ack waits for the destination's confirm.
- `confirm(seq, multiple, ack)`: destination Basic.Ack/Nack. The machine numbers its publishes itself (the
  destination channel is in confirm mode from the start of each connection, so sequence numbers are 1, 2, ... in
  publish order). Acked -> `AckSource` (one `multiple` ack when the confirmed deliveries are the oldest
  outstanding ones, as they are in the usual case); nacked -> `NackSource(requeue=True)`.
- `tick(now_ms)`: a reconnect that is due -> `Connect`.
- `stop(reason)` -> `Disconnect`, state terminated.

Delete-after: with a count (or the queue length read at connect), the machine publishes that many messages, then
cancels the consumer (`CancelConsume`); deliveries already in flight past the count are nacked back (requeued).
Once every forwarded message is settled (acked at the source) it terminates with "completed" and emits
`DeleteSelf` (RabbitMQ removes the parameter then). The count is of messages acked at the source, kept across
reconnects.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from cluster.shovel.params import ShovelDefinition
from node.amqp.properties import BasicProperties

STARTING = "starting"
RUNNING = "running"
TERMINATED = "terminated"


# ---------------------------------------------------------------- effects
@dataclass(frozen=True, slots=True)
class Connect:
    src_index: int
    dest_index: int


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason: str


@dataclass(frozen=True, slots=True)
class Publish:
    seq: int  # the destination's confirm sequence number (0 in no-ack / on-publish, where none is awaited)
    exchange: str
    routing_key: str
    properties: BasicProperties
    body: bytes


@dataclass(frozen=True, slots=True)
class AckSource:
    tag: int
    multiple: bool = False


@dataclass(frozen=True, slots=True)
class NackSource:
    tag: int
    multiple: bool = False


@dataclass(frozen=True, slots=True)
class CancelConsume:
    pass


@dataclass(frozen=True, slots=True)
class DeleteSelf:
    """The shovel finished (`src-delete-after`): remove its definition."""


Effect = Connect | Disconnect | Publish | AckSource | NackSource | CancelConsume | DeleteSelf


class ShovelLink:
    def __init__(self, definition: ShovelDefinition, node_name: str = "raftmq") -> None:
        self.definition = definition
        self.node_name = node_name
        self.state = STARTING
        self.reason = ""  # terminated: why; starting after a failure: the last error
        self.src_index = 0
        self.dest_index = 0
        self.reconnect_at_ms: int | None = None
        self.last_changed_ms = 0
        self.forwarded = 0  # messages published to the destination (all connections)
        self.acked = 0  # deliveries acked at the source (on-confirm / on-publish) or received (no-ack)
        self.remaining: int | None = None  # delete-after: messages still to forward; None: never stop
        self.failures = 0  # failed attempts and lost connections
        self._next_seq = 1
        self._unconfirmed: dict[int, int] = {}  # destination seq -> source delivery tag (on-confirm)
        self._outstanding: OrderedDict[int, None] = OrderedDict()  # source tags published, not yet acked
        self._cancelled = False

    # ------------------------------------------------------------ lifecycle
    def start(self, now_ms: int) -> list[Effect]:
        self._set(STARTING, now_ms)
        self.reconnect_at_ms = None
        return [Connect(self.src_index, self.dest_index)]

    def connected(self, now_ms: int, queue_length: int | None = None) -> list[Effect]:
        if self.state != STARTING:
            return []
        self._set(RUNNING, now_ms)
        self.reason = ""
        self._reset_connection()
        after = self.definition.src_delete_after
        if self.remaining is None:
            if isinstance(after, int):
                self.remaining = after
            elif after == "queue-length":
                self.remaining = queue_length or 0
        if self.remaining is not None and self.remaining - len(self._outstanding) <= 0:
            return self._finish_if_done(now_ms, [CancelConsume()])
        return []

    def connect_failed(self, side: str, reason: str, now_ms: int) -> list[Effect]:
        if self.state == TERMINATED:
            return []
        if side == "src":
            self.src_index = (self.src_index + 1) % len(self.definition.src_uris)
        else:
            self.dest_index = (self.dest_index + 1) % len(self.definition.dest_uris)
        return self._retry(f"{side}: {reason}", now_ms)

    def down(self, side: str, reason: str, now_ms: int) -> list[Effect]:
        if self.state == TERMINATED:
            return []
        return self._retry(f"{side}: {reason}", now_ms)

    def stop(self, reason: str, now_ms: int) -> list[Effect]:
        if self.state == TERMINATED:
            return []
        self._set(TERMINATED, now_ms)
        self.reason = reason
        self.reconnect_at_ms = None
        return [Disconnect(reason)]

    def tick(self, now_ms: int) -> list[Effect]:
        if self.state == STARTING and self.reconnect_at_ms is not None and now_ms >= self.reconnect_at_ms:
            self.reconnect_at_ms = None
            return [Connect(self.src_index, self.dest_index)]
        return []

    # ------------------------------------------------------------ messages
    def delivery(self, tag: int, exchange: str, routing_key: str, properties: BasicProperties, body: bytes,
                 now_ms: int) -> list[Effect]:
        if self.state != RUNNING:
            return []
        mode = self.definition.ack_mode
        if self.remaining is not None and len(self._outstanding) >= self.remaining and mode != "no-ack":
            return [NackSource(tag)]  # in flight past the delete-after count: back to the source queue
        d = self.definition
        if d.dest_queue is not None:
            out_exchange, out_key = "", d.dest_queue
        elif d.dest_exchange is not None:
            out_exchange = d.dest_exchange
            out_key = d.dest_exchange_key if d.dest_exchange_key is not None else routing_key
        else:
            out_exchange, out_key = exchange, routing_key
        seq = 0
        if mode == "on-confirm":
            seq = self._next_seq
            self._next_seq += 1
            self._unconfirmed[seq] = tag
        self.forwarded += 1
        effects: list[Effect] = [Publish(seq, out_exchange, out_key, self._properties(properties, now_ms), body)]
        if mode == "no-ack":
            self.acked += 1
            if self.remaining is not None:
                self.remaining -= 1
        elif mode == "on-publish":
            self._outstanding[tag] = None
            effects.extend(self._acked([tag]))
        else:
            self._outstanding[tag] = None
        if self.remaining is not None and self.remaining - len(self._outstanding) <= 0 and not self._cancelled:
            self._cancelled = True
            effects.append(CancelConsume())
        return self._finish_if_done(now_ms, effects)

    def confirm(self, seq: int, multiple: bool, ack: bool, now_ms: int) -> list[Effect]:
        if self.state != RUNNING:
            return []
        seqs = [s for s in self._unconfirmed if s <= seq] if multiple else ([seq] if seq in self._unconfirmed else [])
        tags = [self._unconfirmed.pop(s) for s in sorted(seqs)]
        if not tags:
            return []
        if ack:
            return self._finish_if_done(now_ms, self._acked(tags))
        for tag in tags:
            self._outstanding.pop(tag, None)
        return [NackSource(tag) for tag in tags]

    # ------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        d = self.definition
        return {"name": d.name, "vhost": d.vhost, "type": "dynamic", "state": self.state,
                "termination_reason": self.reason if self.state == TERMINATED else "",
                "blocked_reason": self.reason if self.state == STARTING else "",
                "src_uri": d.src_uri(self.src_index).redacted(), "dest_uri": d.dest_uri(self.dest_index).redacted(),
                "src_queue": d.src_queue, "src_exchange": d.src_exchange, "src_exchange_key": d.src_exchange_key,
                "dest_queue": d.dest_queue, "dest_exchange": d.dest_exchange, "dest_exchange_key": d.dest_exchange_key,
                "ack_mode": d.ack_mode, "forwarded": self.forwarded, "acked": self.acked,
                "pending": len(self._unconfirmed), "remaining": self.remaining, "failures": self.failures,
                "last_changed_ms": self.last_changed_ms}

    # ------------------------------------------------------------ internals
    def _set(self, state: str, now_ms: int) -> None:
        self.state = state
        self.last_changed_ms = now_ms

    def _reset_connection(self) -> None:
        self._next_seq = 1
        self._unconfirmed.clear()
        self._outstanding.clear()
        self._cancelled = False

    def _retry(self, reason: str, now_ms: int) -> list[Effect]:
        self.failures += 1
        self._set(STARTING, now_ms)
        self.reason = reason
        self._reset_connection()
        self.reconnect_at_ms = now_ms + self.definition.reconnect_delay_ms
        return [Disconnect(reason)]

    def _acked(self, tags: list[int]) -> list[Effect]:
        """Ack these source tags: one multiple ack when they are exactly the oldest outstanding ones."""
        outstanding = self._outstanding
        self.acked += len(tags)
        if self.remaining is not None:
            self.remaining -= len(tags)
        prefix = len(tags) > 1 and all(a == b for a, b in zip(tags, outstanding, strict=False))
        for tag in tags:
            outstanding.pop(tag, None)
        if prefix:
            return [AckSource(tags[-1], multiple=True)]
        return [AckSource(tag) for tag in tags]

    def _finish_if_done(self, now_ms: int, effects: list[Effect]) -> list[Effect]:
        if self.remaining is not None and self.remaining <= 0 and not self._outstanding:
            self._set(TERMINATED, now_ms)
            self.reason = "completed"
            effects.extend([Disconnect("completed"), DeleteSelf()])
        return effects

    def _properties(self, properties: BasicProperties, now_ms: int) -> BasicProperties:
        d = self.definition
        extra: dict[str, Any] = {}
        if d.add_forward_headers:
            entry: dict[str, Any] = {"shovelled-by": self.node_name, "shovel-type": "dynamic",
                                     "shovel-name": d.name, "shovel-vhost": d.vhost,
                                     "src-uri": d.src_uri(self.src_index).redacted(),
                                     "dest-uri": d.dest_uri(self.dest_index).redacted()}
            if d.src_queue is not None:
                entry["src-queue"] = d.src_queue
            else:
                entry["src-exchange"] = d.src_exchange
                entry["src-exchange-key"] = d.src_exchange_key
            if d.dest_queue is not None:
                entry["dest-queue"] = d.dest_queue
            elif d.dest_exchange is not None:
                entry["dest-exchange"] = d.dest_exchange
                if d.dest_exchange_key is not None:
                    entry["dest-exchange-key"] = d.dest_exchange_key
            before = (properties.headers or {}).get("x-shovelled")
            extra["x-shovelled"] = [entry, *(before if isinstance(before, list) else [])]
        if d.add_timestamp_header:
            extra["x-shovelled-timestamp"] = now_ms // 1000
        fields = dict(d.dest_publish_properties)
        if not extra and not fields:
            return properties
        if extra:
            fields["headers"] = {**(properties.headers or {}), **extra}
        return replace(properties, **fields)
