"""Persistence records: what the broker asks storage to keep, and what `Broker.recover` reads back (pure).

Every record is a frozen dataclass of plain values (str, int, bool, bytes, dicts of field-table values), so
`to_cbor(record)` (each record's hand-written `to_cbor()`: no dataclasses.astuple deep copy on the storage path) is
a plain list `[tag, field...]` that cbor2 encodes directly and `from_cbor` rebuilds. The two records written per
message (`MessageRecord` at publish, `MessageRemovedRecord` at ack) have a hand-rolled encoder, `encode_record`,
that writes the very bytes cbor2 would (tested against it): the `[tag, vhost, queue]` prefix is cached per queue,
and a properties dict shared by many records (the broker shares one per distinct `BasicProperties`) is encoded
once; everything else goes through cbor2. Those two classes are slotted but not frozen (a frozen dataclass's
`__init__` costs more, and one is built per message: docs/benchmarks.md): treat them, and their properties dict,
as values all the same. Each record
names its storage `stream`: "definitions" for vhosts, users, permissions, exchanges, queues and bindings, and
"queue:<vhost>:<queue>" for one durable queue's persistent messages, so a queue's stream can be truncated behind a
snapshot on its own. Deletions are records too (`deleted=True` / MessageRemoved); replaying a stream in order and
keeping the last record per key gives the current state. A `QueueStreamStartRecord` in a queue stream kills every
record before it (the stream of a deleted queue, re-declared under the same name).
"""

from __future__ import annotations

import dataclasses
import operator
import struct
from dataclasses import dataclass, field
from typing import Any

import cbor2

from node.amqp.properties import BasicProperties

DEFINITIONS_STREAM = "definitions"
_PROPERTY_NAMES = tuple(f.name for f in dataclasses.fields(BasicProperties))
_property_values = operator.attrgetter(*_PROPERTY_NAMES)


def properties_to_dict(props: Any) -> dict[str, Any]:
    """The properties that are set, as a plain dict (a MessageRecord's `properties`); all values fetched in one C
    call."""
    values = _property_values(props)
    return {name: value for name, value in zip(_PROPERTY_NAMES, values, strict=True) if value is not None}


def queue_stream(vhost: str, queue: str) -> str:
    return f"queue:{vhost}:{queue}"


@dataclass(frozen=True, slots=True)
class VHostRecord:
    name: str
    deleted: bool = False
    limits: dict[str, int] = field(default_factory=dict)  # node/broker/vhost_limits.py (older records have none)

    @property
    def stream(self) -> str:
        return DEFINITIONS_STREAM

    def to_cbor(self) -> list[Any]:
        return ["vhost", self.name, self.deleted, self.limits]


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    password_hash: str
    tags: tuple[str, ...] = ()
    deleted: bool = False
    limits: dict[str, int] = field(default_factory=dict)  # max-connections, max-channels (node/broker/user_limits.py)

    @property
    def stream(self) -> str:
        return DEFINITIONS_STREAM

    def to_cbor(self) -> list[Any]:
        return ["user", self.name, self.password_hash, list(self.tags), self.deleted, self.limits]


@dataclass(frozen=True, slots=True)
class PermissionRecord:
    user: str
    vhost: str
    configure: str
    write: str
    read: str
    deleted: bool = False

    @property
    def stream(self) -> str:
        return DEFINITIONS_STREAM

    def to_cbor(self) -> list[Any]:
        return ["perm", self.user, self.vhost, self.configure, self.write, self.read, self.deleted]


@dataclass(frozen=True, slots=True)
class ExchangeRecord:
    vhost: str
    name: str
    type: str
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    deleted: bool = False
    durable: bool = True  # (appended: older records have no such field and were all durable)

    @property
    def stream(self) -> str:
        return DEFINITIONS_STREAM

    def to_cbor(self) -> list[Any]:
        return ["exchange", self.vhost, self.name, self.type, self.auto_delete, self.internal, self.arguments,
                self.deleted, self.durable]


@dataclass(frozen=True, slots=True)
class QueueRecord:
    vhost: str
    name: str
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    deleted: bool = False
    durable: bool = True  # (appended fields: older records lack them and were durable, not exclusive)
    exclusive_owner: str | None = None  # replicated mode: the owning connection as "node/boot_id/conn_id"

    @property
    def stream(self) -> str:
        return DEFINITIONS_STREAM

    def to_cbor(self) -> list[Any]:
        return ["queue", self.vhost, self.name, self.auto_delete, self.arguments, self.deleted, self.durable,
                self.exclusive_owner]


@dataclass(frozen=True, slots=True)
class BindingRecord:
    vhost: str
    source: str
    dest_kind: str
    destination: str
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)
    deleted: bool = False

    @property
    def stream(self) -> str:
        return DEFINITIONS_STREAM

    def to_cbor(self) -> list[Any]:
        return ["binding", self.vhost, self.source, self.dest_kind, self.destination, self.routing_key,
                self.arguments, self.deleted]


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """A policy (node/broker/policies.py); `definition` maps policy keys ("max-length", ...) to values."""

    vhost: str
    name: str
    pattern: str = ""
    apply_to: str = "all"
    definition: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    deleted: bool = False

    @property
    def stream(self) -> str:
        return DEFINITIONS_STREAM

    def to_cbor(self) -> list[Any]:
        return ["policy", self.vhost, self.name, self.pattern, self.apply_to, self.definition, self.priority,
                self.deleted]


@dataclass(frozen=True, slots=True)
class ParameterRecord:
    """A runtime parameter (component "shovel", ...) of a vhost; `value` is its JSON text (single-node mode: in
    cluster mode parameters live in the metadata)."""

    component: str
    vhost: str
    name: str
    value: str = ""
    deleted: bool = False

    @property
    def stream(self) -> str:
        return DEFINITIONS_STREAM

    def to_cbor(self) -> list[Any]:
        return ["param", self.component, self.vhost, self.name, self.value, self.deleted]


@dataclass(slots=True, unsafe_hash=True)
class MessageRecord:
    """A persistent message in a durable queue; msg_id is the queue machine's id for it."""

    vhost: str
    queue: str
    msg_id: int
    exchange: str
    routing_key: str
    properties: dict[str, Any]
    body: bytes
    delivery_count: int = 0

    @property
    def stream(self) -> str:
        return queue_stream(self.vhost, self.queue)

    def to_cbor(self) -> list[Any]:
        return ["msg", self.vhost, self.queue, self.msg_id, self.exchange, self.routing_key, self.properties,
                self.body, self.delivery_count]


@dataclass(slots=True, unsafe_hash=True)
class MessageRemovedRecord:
    vhost: str
    queue: str
    msg_id: int

    @property
    def stream(self) -> str:
        return queue_stream(self.vhost, self.queue)

    def to_cbor(self) -> list[Any]:
        return ["msg-removed", self.vhost, self.queue, self.msg_id]


@dataclass(frozen=True, slots=True)
class MessagesRemovedRecord:
    """Storage's form of a run of `MessageRemovedRecord`s of one queue (the broker never builds one): one log record
    for the removals of one persist batch (a multiple ack), read back as the `MessageRemovedRecord` of each id
    (`expand`). All of them are durable or none: either is a state some crash point could leave."""

    vhost: str
    queue: str
    msg_ids: tuple[int, ...]

    @property
    def stream(self) -> str:
        return queue_stream(self.vhost, self.queue)

    def to_cbor(self) -> list[Any]:
        return ["msgs-removed", self.vhost, self.queue, list(self.msg_ids)]

    def expand(self) -> list[MessageRemovedRecord]:
        vhost, queue = self.vhost, self.queue
        return [MessageRemovedRecord(vhost, queue, msg_id) for msg_id in self.msg_ids]


@dataclass(frozen=True, slots=True)
class QueueStreamStartRecord:
    """A queue's stream starts afresh here: every earlier record of the stream is dead (a deleted queue's).

    Storage writes one before the QueueRecord of a queue declared under a name whose stream already exists
    (node/runtime/store.py), in the same append batch, so that the old queue's records can never come back in the
    new one, whatever a crash cut off (its removals, the truncation of its stream). Both recovery folds drop
    what precedes it."""

    vhost: str
    queue: str

    @property
    def stream(self) -> str:
        return queue_stream(self.vhost, self.queue)

    def to_cbor(self) -> list[Any]:
        return ["queue-start", self.vhost, self.queue]


@dataclass(slots=True, unsafe_hash=True)
class TailMessageRecord(MessageRecord):
    """A MessageRecord of a message in a queue's paged tail (node/broker/paged_tail.py): written exactly like one
    (same cbor, read back as MessageRecord); the type only tells storage to report the record's log offset back
    (`Broker.on_tail_offsets`)."""


@dataclass(frozen=True, slots=True)
class MessageIndexRecord:
    """Not written: what storage returns at recovery, instead of the MessageRecords, for a long queue stream.

    The live messages of the queue as two parallel columns in msg_id order (which is also log order): their ids
    and the log offsets of their MessageRecords (`array('q')`, 16 bytes a message), so the broker pages them in
    from the log (`PageIn`) rather than holding every body at once.
    """

    vhost: str
    queue: str
    msg_ids: Any  # array('q')
    offsets: Any  # array('q')

    @property
    def stream(self) -> str:
        return queue_stream(self.vhost, self.queue)

    def to_cbor(self) -> list[Any]:
        raise TypeError("a MessageIndexRecord is built by storage at recovery and never written")


@dataclass(frozen=True, slots=True)
class MetadataBarrierRecord:
    """Not written: replicated mode only. In a `Persist` it asks the cluster runtime for a read barrier on the
    metadata (a no-op command through its log): the token is reported once this node's copy of the definitions
    holds everything committed before it (the broker's "owner barrier", node/broker/broker.py)."""

    stream = DEFINITIONS_STREAM

    def to_cbor(self) -> list[Any]:
        raise TypeError("a MetadataBarrierRecord is a cluster metadata read barrier and never written")


Record = (
    VHostRecord | UserRecord | PermissionRecord | ExchangeRecord | QueueRecord | BindingRecord | MessageRecord
    | MessageRemovedRecord | MessageIndexRecord | PolicyRecord | QueueStreamStartRecord | MessagesRemovedRecord
    | ParameterRecord | MetadataBarrierRecord
)

_TAGS: dict[str, type[Any]] = {
    "vhost": VHostRecord, "user": UserRecord, "perm": PermissionRecord, "exchange": ExchangeRecord,
    "queue": QueueRecord, "binding": BindingRecord, "msg": MessageRecord, "msg-removed": MessageRemovedRecord,
    "policy": PolicyRecord, "queue-start": QueueStreamStartRecord, "msgs-removed": MessagesRemovedRecord,
    "param": ParameterRecord,
}


def to_cbor(record: Record) -> list[Any]:
    """[tag, field, ...] in field order; tuples become lists (cbor2 encodes both as arrays)."""
    return record.to_cbor()


def from_cbor(data: list[Any]) -> Record:
    cls = _TAGS[data[0]]
    values = list(data[1:])
    if cls is UserRecord or cls is MessagesRemovedRecord:
        values[2] = tuple(values[2])
    record: Record = cls(*values)
    return record


# --- the per-message encoder ------------------------------------------------------------------------------------

ENCODE_CACHE_ENTRIES_MAX = 4096  # per cache below; a full cache is cleared (it refills with what is hot)
_HEAD_U16 = struct.Struct(">BH")
_HEAD_U32 = struct.Struct(">BI")
_HEAD_U64 = struct.Struct(">BQ")
# cbor heads of the arguments 0..255 for the major types used here: 0 (unsigned int), 2 (bytes), 3 (text)
_SMALL_HEADS = {major: tuple(bytes((major << 5 | value,)) if value < 24 else bytes((major << 5 | 24, value))
                             for value in range(256)) for major in (0, 2, 3)}
_prefixes: dict[tuple[str, str, str], bytes] = {}  # (tag, vhost, queue) -> cbor array head + first 3 items
_texts: dict[str, bytes] = {}  # exchange names and routing keys -> cbor text strings
_shared_properties: dict[int, tuple[dict[str, Any], bytes]] = {}  # id(dict) -> (the dict, kept alive; its cbor)


def _cbor_head(major: int, value: int) -> bytes:
    """cbor2's (minimal) head for a major type (0, 2 or 3) and an argument in 0..2**64-1."""
    if value < 0x100:
        return _SMALL_HEADS[major][value]
    kind = major << 5
    if value < 0x10000:
        return _HEAD_U16.pack(kind | 25, value)
    if value < 0x100000000:
        return _HEAD_U32.pack(kind | 26, value)
    return _HEAD_U64.pack(kind | 27, value)


def _cbor_int(value: int) -> bytes:
    if 0 <= value < 0x100:
        return _SMALL_UINTS[value]
    if 0 <= value < 0x100000000:
        return _HEAD_U16.pack(0x19, value) if value < 0x10000 else _HEAD_U32.pack(0x1A, value)
    if 0 <= value < 0x10000000000000000:
        return _HEAD_U64.pack(0x1B, value)
    return cbor2.dumps(value)  # negative or a bignum: rare, cbor2's own


_SMALL_UINTS = _SMALL_HEADS[0]
_SMALL_BYTES_HEADS = _SMALL_HEADS[2]


def _cbor_text(text: str) -> bytes:
    encoded = _texts.get(text)
    if encoded is None:
        raw = text.encode("utf-8")
        encoded = _cbor_head(3, len(raw)) + raw
        if len(_texts) >= ENCODE_CACHE_ENTRIES_MAX:
            _texts.clear()
        _texts[text] = encoded
    return encoded


def _prefix(tag: str, length: int, vhost: str, queue: str) -> bytes:
    key = (tag, vhost, queue)
    prefix = _prefixes.get(key)
    if prefix is None:
        vhost_raw, queue_raw, tag_raw = vhost.encode("utf-8"), queue.encode("utf-8"), tag.encode("utf-8")
        prefix = (bytes((0x80 | length,)) + _cbor_head(3, len(tag_raw)) + tag_raw + _cbor_head(3, len(vhost_raw))
                  + vhost_raw + _cbor_head(3, len(queue_raw)) + queue_raw)
        if len(_prefixes) >= ENCODE_CACHE_ENTRIES_MAX:
            _prefixes.clear()
        _prefixes[key] = prefix
    return prefix


def _cbor_properties(properties: dict[str, Any]) -> bytes:
    if "headers" in properties:
        return cbor2.dumps(properties)  # per message, not shared: nothing to gain from a cache
    cached = _shared_properties.get(id(properties))
    if cached is not None and cached[0] is properties:
        return cached[1]
    encoded = cbor2.dumps(properties)
    if len(_shared_properties) >= ENCODE_CACHE_ENTRIES_MAX:
        _shared_properties.clear()
    _shared_properties[id(properties)] = (properties, encoded)
    return encoded


def encode_record(record: Record) -> bytes:
    """cbor2.dumps(to_cbor(record)), byte for byte, with a fast path for the two records written per message."""
    if type(record) is MessageRemovedRecord:
        return _prefix("msg-removed", 4, record.vhost, record.queue) + _cbor_int(record.msg_id)
    if isinstance(record, MessageRecord):
        body = record.body
        if type(body) is not bytes:
            return cbor2.dumps(record.to_cbor())
        properties = record.properties
        if "headers" in properties:
            middle = _cbor_text(record.exchange) + _cbor_text(record.routing_key) + cbor2.dumps(properties)
        else:
            middle = _message_middle(record.vhost, record.queue, record.exchange, record.routing_key, properties)
        msg_id, delivery_count = record.msg_id, record.delivery_count
        return b"".join((
            _prefix("msg", 9, record.vhost, record.queue),
            _SMALL_UINTS[msg_id] if 0 <= msg_id < 0x100 else _HEAD_U32.pack(0x1A, msg_id) if 0x10000 <= msg_id < (
                0x100000000) else _cbor_int(msg_id),
            middle,
            _SMALL_BYTES_HEADS[len(body)] if len(body) < 0x100 else _cbor_head(2, len(body)),
            body,
            _SMALL_UINTS[delivery_count] if 0 <= delivery_count < 0x100 else _cbor_int(delivery_count),
        ))
    return cbor2.dumps(record.to_cbor())


_middles: dict[tuple[str, str, str, str, int], tuple[dict[str, Any], bytes]] = {}  # -> (properties kept alive, cbor)


def _message_middle(vhost: str, queue: str, exchange: str, routing_key: str, properties: dict[str, Any]) -> bytes:
    """The cbor of a MessageRecord's exchange, routing key and (shared, header-less) properties, cached per queue,
    exchange, routing key and properties dict: a publisher's messages all share it."""
    key = (vhost, queue, exchange, routing_key, id(properties))
    cached = _middles.get(key)
    if cached is not None and cached[0] is properties:
        return cached[1]
    middle = _cbor_text(exchange) + _cbor_text(routing_key) + _cbor_properties(properties)
    if len(_middles) >= ENCODE_CACHE_ENTRIES_MAX:
        _middles.clear()
    _middles[key] = (properties, middle)
    return middle


def encode_removed_run(vhost: str, queue: str, msg_ids: list[int]) -> list[bytes]:
    """`encode_record(MessageRemovedRecord(vhost, queue, i))` of each id, the prefix looked up once (the ack path)."""
    prefix = _prefix("msg-removed", 4, vhost, queue)
    if msg_ids and min(msg_ids) >= 0x10000 and max(msg_ids) < 0x100000000:  # (the usual case: one head size)
        pack = _HEAD_U32.pack
        return [prefix + pack(0x1A, i) for i in msg_ids]
    small = _SMALL_UINTS
    return [prefix + (small[i] if 0 <= i < 0x100 else _cbor_int(i)) for i in msg_ids]


def encode_removed_many(vhost: str, queue: str, msg_ids: list[int]) -> bytes:
    """`encode_record(MessagesRemovedRecord(vhost, queue, tuple(msg_ids)))`: the id list is one cbor2 call."""
    return _prefix("msgs-removed", 4, vhost, queue) + cbor2.dumps(msg_ids)
