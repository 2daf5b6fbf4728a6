"""The broker's part of a queue log entry in replicated mode: the message payload codec and publish batching.

- Payload codec: a message goes out as [exchange, routing key, property bytes, body] (`encode_payload_wire`): the
  property flags and list exactly as AMQP encodes them, the publisher's own bytes when node/amqp still remembers
  them, so nothing is encoded per publish, and a replica's decoded properties (shared when they have no headers)
  remember those bytes, so its deliveries write them verbatim. Snapshots use the value form [exchange, routing
  key, dict of set properties, body] (`encode_payload`), which depends only on the properties' values, so
  replicas that applied the same log write byte-identical snapshots. `decode_payload` reads both (entries written
  before the property bytes existed are in the value form).
- The entry itself (incarnation, origin, proposal id, command) is `cluster.queue.envelope`'s: `envelope_codec`
  builds this node's `EnvelopeCodec` around the payload codec (it also decodes a node's own entries once only).
- Publish batching: `propose_enqueue` folds consecutive publishes of one channel to one queue made within one
  broker call (one socket read) into one `EnqueueMany` proposal, which every replica applies exactly as the
  Enqueues in turn; confirms stay per message.
"""

from __future__ import annotations

from typing import Any, Final

from cluster.queue import Enqueue, EnqueueMany, QueuedMessage
from cluster.queue.envelope import EnvelopeCodec
from node.amqp.properties import (
    EMPTY_PROPERTIES,
    HEADER_PREFIX,
    BasicProperties,
    decode_content_header,
    encode_properties,
)
from node.amqp.spec import CLASS_BASIC
from node.broker import delivery, read_your_writes
from node.broker.channel import Message
from node.broker.effects import ProposeQueue
from node.broker.queues import QueueState
from node.broker.state import BrokerState

BATCH_MESSAGES_MAX: Final = 256  # publishes of one channel to one queue in one EnqueueMany entry
BATCH_BYTES_MAX: Final = 1024 * 1024  # a batch takes no more messages once its bodies reach this size


# --- payload codec ---------------------------------------------------------------------------------------------


def encode_payload(msg: Message) -> list[Any]:
    """A broker message as cbor-able values, the snapshot form: [exchange, routing key, properties that are set,
    body]. Snapshots use it because it depends only on the properties' values, so replicas that applied the same
    log write byte-identical snapshots whether they hold the publisher's objects or decoded ones."""
    return [msg.exchange, msg.routing_key, delivery.properties_to_dict(msg.properties), msg.body]


def encode_payload_wire(msg: Message) -> list[Any]:
    """The proposal form: [exchange, routing key, property flags + encoded property list (bytes), body]. The
    property bytes are the publisher's own when node/amqp still remembers them (no encoding at all), and every
    replica's decoded properties remember them in turn, so deliveries anywhere write them verbatim."""
    props = msg.properties
    if props is EMPTY_PROPERTIES:
        return [msg.exchange, msg.routing_key, _NO_PROPERTIES, msg.body]
    flags, encoded = encode_properties(props)
    return [msg.exchange, msg.routing_key, _FLAGS[flags] + encoded, msg.body]


_NO_PROPERTIES: Final = b"\x00\x00"
_FLAGS: Final = tuple(flags.to_bytes(2, "big") for flags in range(1 << 16))
_HEADER_BEFORE_FLAGS: Final = HEADER_PREFIX.pack(CLASS_BASIC, 0, 0, 0)[:-2]  # class, weight, body size 0


_new_message = tuple.__new__  # Message(...) without the named tuple's Python-level __new__ (one per message)
PROPERTIES_KEPT_MAX: Final = 4096  # distinct property lists without headers decoded once (cleared when full)
_properties_by_bytes: dict[bytes, BasicProperties] = {b"\x00\x00": EMPTY_PROPERTIES}


def _decode_properties(data: bytes) -> BasicProperties:
    """Property bytes -> properties; those without headers (immutable) are shared, as node/amqp shares them."""
    if len(data) < 2:
        raise ValueError("bad message properties")
    properties = decode_content_header(_HEADER_BEFORE_FLAGS + data)[2]
    if properties.headers is None:
        if len(_properties_by_bytes) >= PROPERTIES_KEPT_MAX:
            _properties_by_bytes.clear()
            _properties_by_bytes[_NO_PROPERTIES] = EMPTY_PROPERTIES
        _properties_by_bytes[data] = properties
    return properties


def decode_payload(value: Any) -> Message:
    """Either form: property bytes (proposals) or a dict of properties (snapshots, and entries of older nodes)."""
    exchange, routing_key, props, body = value
    if type(props) is bytes and type(exchange) is str and type(routing_key) is str and type(body) is bytes:
        properties = _properties_by_bytes.get(props)  # the hot path: a decoded entry's message
        if properties is None:
            properties = _decode_properties(props)
        return _new_message(Message, (exchange, routing_key, properties, body))
    if not (isinstance(exchange, str) and isinstance(routing_key, str) and isinstance(body, bytes)):
        raise ValueError("bad message payload")
    if type(props) is bytes:
        return Message(exchange, routing_key, _decode_properties(props), body)
    if not isinstance(props, dict):
        raise ValueError("bad message payload")
    return Message(exchange, routing_key, BasicProperties(**props), body)


def envelope_codec(node_name: str) -> EnvelopeCodec:
    """The codec of this node's queue log entries, with the broker's payload codec."""
    return EnvelopeCodec(node_name, encode_payload_wire, decode_payload)


# --- publish batching ------------------------------------------------------------------------------------------


class Batch:
    """The publish proposal of a queue still open for more of the same channel's messages (see propose_enqueue).

    The `ProposeQueue` in `out` stays the first message's `Enqueue` while the batch grows in its own lists; `seal`
    puts the `EnqueueMany` (tuples) in its place, once: when something else is proposed to the queue (`propose`)
    and at the end of the broker call (`BrokerState.seal_proposals`). An effect in `out` is never changed after it
    was put there, only replaced by its successor before the runtime sees the list."""

    __slots__ = ("effect", "index", "messages", "out", "sequences", "size_bytes")

    def __init__(self, out: list[Any], index: int, effect: ProposeQueue, size_bytes: int) -> None:
        self.out = out  # broker.out when it was opened: once the runtime took that list, the batch is closed
        self.index = index  # where its ProposeQueue sits in `out`
        self.effect = effect
        self.messages: list[QueuedMessage] = []  # with `sequences`: the whole run, once a second message joined
        self.sequences: list[int] = []
        self.size_bytes = size_bytes

    def still_open(self, out: list[Any], command: Enqueue) -> bool:
        effect = self.effect
        if out is not self.out or self.index >= len(out) or out[self.index] is not effect:
            return False
        first: Any = effect.command
        publisher_id = first.publisher_id
        return bool((publisher_id is command.publisher_id or publisher_id == command.publisher_id)
                    and first.now_ms == command.now_ms
                    and len(self.sequences) < BATCH_MESSAGES_MAX and self.size_bytes < BATCH_BYTES_MAX)

    def seal(self) -> None:
        """Put the run's `EnqueueMany` in place of the first message's proposal (nothing to do for a single one)."""
        effect = self.effect
        out = self.out
        if not self.messages or self.index >= len(out) or out[self.index] is not effect:
            return
        first: Any = effect.command
        out[self.index] = ProposeQueue(effect.vhost, effect.queue, EnqueueMany(
            first.publisher_id, first.now_ms, tuple(self.messages), tuple(self.sequences)), effect.proposal_id)
        # (`out` no longer holds `self.effect`: the batch is closed, `still_open` and `seal` do nothing now)


def propose_enqueue(broker: BrokerState, queue: QueueState, command: Enqueue) -> None:
    """Propose a publish; consecutive publishes of one channel to one queue within one broker call (one socket
    read) become one `EnqueueMany` entry, which every replica applies exactly as the Enqueues in turn. Only a
    batch with nothing proposed to its queue since it opened takes more (`propose` closes it), so a queue's
    commands keep their order; the batch's messages move ahead of other queues' proposals only, and of effects
    for other parties. Bounded by BATCH_MESSAGES_MAX and BATCH_BYTES_MAX."""
    machine = queue.machine
    out = broker.out
    queue.flow_inflight += 1  # credit flow (credit_flow.py): applied (or given up) later
    batch = machine.batch
    if command.sequence is None or batch is None or not batch.still_open(out, command):
        if batch is not None:
            batch.seal()
        effect = ProposeQueue(queue.vhost, queue.name, command, broker.new_proposal_id())
        out.append(effect)
        machine.batch = Batch(out, len(out) - 1, effect, command.message.size_bytes)
        conn = broker.proposing_conn
        if conn is not None:
            read_your_writes.issue(broker, conn, queue, effect.proposal_id)
        return
    if not batch.messages:
        first: Any = batch.effect.command
        batch.messages.append(first.message)
        batch.sequences.append(first.sequence)
        broker.open_batches.append(batch)
    batch.messages.append(command.message)
    batch.sequences.append(command.sequence)
    batch.size_bytes += command.message.size_bytes
