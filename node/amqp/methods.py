"""One frozen, slotted dataclass per AMQP 0-9-1 method (RabbitMQ extensions included).

Except `BasicDeliver` and `BasicAck`, built once per delivery or confirm on the hot path: slotted but not frozen
(a frozen dataclass's `__init__` costs about three times as much); treat them as values all the same.

Each class carries its wire layout as data: `CLASS_ID`, `METHOD_ID` and `WIRE`, a tuple of `(field, kind)` in spec
order where kind is one of octet/short/long/longlong/shortstr/longstr/text/bit/table, and a field of `None` is a
reserved field (always encoded as zero/empty, ignored on decode). `node.amqp.codec` compiles these tables into the
generic encoder/decoder. Field names are the spec's with `-` -> `_`; `no-wait` is `nowait`, `global` is `global_`.
`longstr` fields are bytes (SASL responses, secrets); `text` is a long string decoded to str (mechanisms, locales).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

Wire = tuple[tuple[str | None, str], ...]


class Method:
    """Common base of every method class."""

    __slots__ = ()
    CLASS_ID: ClassVar[int]
    METHOD_ID: ClassVar[int]
    NAME: ClassVar[str]
    WIRE: ClassVar[Wire]
    HAS_CONTENT: ClassVar[bool] = False
    SYNCHRONOUS: ClassVar[bool] = False


M = TypeVar("M", bound=type[Method])

METHOD_CLASSES: list[type[Method]] = []


def _wire(
    class_id: int, method_id: int, name: str, layout: str, synchronous: bool = False
) -> Callable[[M], M]:
    """Attach the wire layout ("field:kind field:kind", `-` for a reserved field) to a method class."""

    def attach(cls: M) -> M:
        fields: list[tuple[str | None, str]] = []
        for item in layout.split():
            field_name, kind = item.split(":")
            fields.append((None if field_name == "-" else field_name, kind))
        cls.CLASS_ID = class_id
        cls.METHOD_ID = method_id
        cls.NAME = name
        cls.WIRE = tuple(fields)
        cls.SYNCHRONOUS = synchronous
        METHOD_CLASSES.append(cls)
        return cls

    return attach


# ---------------------------------------------------------------- connection (10)
@_wire(
    10,
    10,
    "Connection.Start",
    "version_major:octet version_minor:octet server_properties:table mechanisms:text locales:text",
    True,
)
@dataclass(frozen=True, slots=True)
class ConnectionStart(Method):
    version_major: int = 0
    version_minor: int = 9
    server_properties: dict[str, Any] = field(default_factory=dict)
    mechanisms: str = "PLAIN"
    locales: str = "en_US"


@_wire(
    10,
    11,
    "Connection.StartOk",
    "client_properties:table mechanism:shortstr response:longstr locale:shortstr",
)
@dataclass(frozen=True, slots=True)
class ConnectionStartOk(Method):
    client_properties: dict[str, Any] = field(default_factory=dict)
    mechanism: str = "PLAIN"
    response: bytes = b""
    locale: str = "en_US"


@_wire(10, 20, "Connection.Secure", "challenge:longstr", True)
@dataclass(frozen=True, slots=True)
class ConnectionSecure(Method):
    challenge: bytes = b""


@_wire(10, 21, "Connection.SecureOk", "response:longstr")
@dataclass(frozen=True, slots=True)
class ConnectionSecureOk(Method):
    response: bytes = b""


@_wire(10, 30, "Connection.Tune", "channel_max:short frame_max:long heartbeat:short", True)
@dataclass(frozen=True, slots=True)
class ConnectionTune(Method):
    channel_max: int = 0
    frame_max: int = 0
    heartbeat: int = 0


@_wire(10, 31, "Connection.TuneOk", "channel_max:short frame_max:long heartbeat:short")
@dataclass(frozen=True, slots=True)
class ConnectionTuneOk(Method):
    channel_max: int = 0
    frame_max: int = 0
    heartbeat: int = 0


@_wire(10, 40, "Connection.Open", "virtual_host:shortstr -:shortstr -:bit", True)
@dataclass(frozen=True, slots=True)
class ConnectionOpen(Method):
    virtual_host: str = "/"


@_wire(10, 41, "Connection.OpenOk", "-:shortstr")
@dataclass(frozen=True, slots=True)
class ConnectionOpenOk(Method):
    pass


@_wire(
    10, 50, "Connection.Close", "reply_code:short reply_text:shortstr class_id:short method_id:short", True
)
@dataclass(frozen=True, slots=True)
class ConnectionClose(Method):
    reply_code: int = 0
    reply_text: str = ""
    class_id: int = 0
    method_id: int = 0


@_wire(10, 51, "Connection.CloseOk", "")
@dataclass(frozen=True, slots=True)
class ConnectionCloseOk(Method):
    pass


@_wire(10, 60, "Connection.Blocked", "reason:shortstr")
@dataclass(frozen=True, slots=True)
class ConnectionBlocked(Method):
    reason: str = ""


@_wire(10, 61, "Connection.Unblocked", "")
@dataclass(frozen=True, slots=True)
class ConnectionUnblocked(Method):
    pass


@_wire(10, 70, "Connection.UpdateSecret", "new_secret:longstr reason:shortstr", True)
@dataclass(frozen=True, slots=True)
class ConnectionUpdateSecret(Method):
    new_secret: bytes = b""
    reason: str = ""


@_wire(10, 71, "Connection.UpdateSecretOk", "")
@dataclass(frozen=True, slots=True)
class ConnectionUpdateSecretOk(Method):
    pass


# ---------------------------------------------------------------- channel (20)
@_wire(20, 10, "Channel.Open", "-:shortstr", True)
@dataclass(frozen=True, slots=True)
class ChannelOpen(Method):
    pass


@_wire(20, 11, "Channel.OpenOk", "-:longstr")
@dataclass(frozen=True, slots=True)
class ChannelOpenOk(Method):
    pass


@_wire(20, 20, "Channel.Flow", "active:bit", True)
@dataclass(frozen=True, slots=True)
class ChannelFlow(Method):
    active: bool = False


@_wire(20, 21, "Channel.FlowOk", "active:bit")
@dataclass(frozen=True, slots=True)
class ChannelFlowOk(Method):
    active: bool = False


@_wire(20, 40, "Channel.Close", "reply_code:short reply_text:shortstr class_id:short method_id:short", True)
@dataclass(frozen=True, slots=True)
class ChannelClose(Method):
    reply_code: int = 0
    reply_text: str = ""
    class_id: int = 0
    method_id: int = 0


@_wire(20, 41, "Channel.CloseOk", "")
@dataclass(frozen=True, slots=True)
class ChannelCloseOk(Method):
    pass


# ---------------------------------------------------------------- access (30, deprecated but still on the wire)
@_wire(
    30, 10, "Access.Request", "realm:shortstr exclusive:bit passive:bit active:bit write:bit read:bit", True
)
@dataclass(frozen=True, slots=True)
class AccessRequest(Method):
    realm: str = "/data"
    exclusive: bool = False
    passive: bool = True
    active: bool = True
    write: bool = True
    read: bool = True


@_wire(30, 11, "Access.RequestOk", "-:short")
@dataclass(frozen=True, slots=True)
class AccessRequestOk(Method):
    pass


# ---------------------------------------------------------------- exchange (40)
@_wire(
    40,
    10,
    "Exchange.Declare",
    "-:short exchange:shortstr type:shortstr passive:bit durable:bit "
    "auto_delete:bit internal:bit nowait:bit arguments:table",
    True,
)
@dataclass(frozen=True, slots=True)
class ExchangeDeclare(Method):
    exchange: str = ""
    type: str = "direct"
    passive: bool = False
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    nowait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@_wire(40, 11, "Exchange.DeclareOk", "")
@dataclass(frozen=True, slots=True)
class ExchangeDeclareOk(Method):
    pass


@_wire(40, 20, "Exchange.Delete", "-:short exchange:shortstr if_unused:bit nowait:bit", True)
@dataclass(frozen=True, slots=True)
class ExchangeDelete(Method):
    exchange: str = ""
    if_unused: bool = False
    nowait: bool = False


@_wire(40, 21, "Exchange.DeleteOk", "")
@dataclass(frozen=True, slots=True)
class ExchangeDeleteOk(Method):
    pass


@_wire(
    40,
    30,
    "Exchange.Bind",
    "-:short destination:shortstr source:shortstr routing_key:shortstr nowait:bit arguments:table",
    True,
)
@dataclass(frozen=True, slots=True)
class ExchangeBind(Method):
    destination: str = ""
    source: str = ""
    routing_key: str = ""
    nowait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@_wire(40, 31, "Exchange.BindOk", "")
@dataclass(frozen=True, slots=True)
class ExchangeBindOk(Method):
    pass


@_wire(
    40,
    40,
    "Exchange.Unbind",
    "-:short destination:shortstr source:shortstr routing_key:shortstr nowait:bit arguments:table",
    True,
)
@dataclass(frozen=True, slots=True)
class ExchangeUnbind(Method):
    destination: str = ""
    source: str = ""
    routing_key: str = ""
    nowait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@_wire(40, 51, "Exchange.UnbindOk", "")
@dataclass(frozen=True, slots=True)
class ExchangeUnbindOk(Method):
    pass


# ---------------------------------------------------------------- queue (50)
@_wire(
    50,
    10,
    "Queue.Declare",
    "-:short queue:shortstr passive:bit durable:bit exclusive:bit auto_delete:bit nowait:bit arguments:table",
    True,
)
@dataclass(frozen=True, slots=True)
class QueueDeclare(Method):
    queue: str = ""
    passive: bool = False
    durable: bool = False
    exclusive: bool = False
    auto_delete: bool = False
    nowait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@_wire(50, 11, "Queue.DeclareOk", "queue:shortstr message_count:long consumer_count:long")
@dataclass(frozen=True, slots=True)
class QueueDeclareOk(Method):
    queue: str = ""
    message_count: int = 0
    consumer_count: int = 0


@_wire(
    50,
    20,
    "Queue.Bind",
    "-:short queue:shortstr exchange:shortstr routing_key:shortstr nowait:bit arguments:table",
    True,
)
@dataclass(frozen=True, slots=True)
class QueueBind(Method):
    queue: str = ""
    exchange: str = ""
    routing_key: str = ""
    nowait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@_wire(50, 21, "Queue.BindOk", "")
@dataclass(frozen=True, slots=True)
class QueueBindOk(Method):
    pass


@_wire(50, 30, "Queue.Purge", "-:short queue:shortstr nowait:bit", True)
@dataclass(frozen=True, slots=True)
class QueuePurge(Method):
    queue: str = ""
    nowait: bool = False


@_wire(50, 31, "Queue.PurgeOk", "message_count:long")
@dataclass(frozen=True, slots=True)
class QueuePurgeOk(Method):
    message_count: int = 0


@_wire(50, 40, "Queue.Delete", "-:short queue:shortstr if_unused:bit if_empty:bit nowait:bit", True)
@dataclass(frozen=True, slots=True)
class QueueDelete(Method):
    queue: str = ""
    if_unused: bool = False
    if_empty: bool = False
    nowait: bool = False


@_wire(50, 41, "Queue.DeleteOk", "message_count:long")
@dataclass(frozen=True, slots=True)
class QueueDeleteOk(Method):
    message_count: int = 0


@_wire(
    50,
    50,
    "Queue.Unbind",
    "-:short queue:shortstr exchange:shortstr routing_key:shortstr arguments:table",
    True,
)
@dataclass(frozen=True, slots=True)
class QueueUnbind(Method):
    queue: str = ""
    exchange: str = ""
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@_wire(50, 51, "Queue.UnbindOk", "")
@dataclass(frozen=True, slots=True)
class QueueUnbindOk(Method):
    pass


# ---------------------------------------------------------------- basic (60)
@_wire(60, 10, "Basic.Qos", "prefetch_size:long prefetch_count:short global_:bit", True)
@dataclass(frozen=True, slots=True)
class BasicQos(Method):
    prefetch_size: int = 0
    prefetch_count: int = 0
    global_: bool = False


@_wire(60, 11, "Basic.QosOk", "")
@dataclass(frozen=True, slots=True)
class BasicQosOk(Method):
    pass


@_wire(
    60,
    20,
    "Basic.Consume",
    "-:short queue:shortstr consumer_tag:shortstr no_local:bit no_ack:bit "
    "exclusive:bit nowait:bit arguments:table",
    True,
)
@dataclass(frozen=True, slots=True)
class BasicConsume(Method):
    queue: str = ""
    consumer_tag: str = ""
    no_local: bool = False
    no_ack: bool = False
    exclusive: bool = False
    nowait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@_wire(60, 21, "Basic.ConsumeOk", "consumer_tag:shortstr")
@dataclass(frozen=True, slots=True)
class BasicConsumeOk(Method):
    consumer_tag: str = ""


@_wire(60, 30, "Basic.Cancel", "consumer_tag:shortstr nowait:bit", True)
@dataclass(frozen=True, slots=True)
class BasicCancel(Method):
    consumer_tag: str = ""
    nowait: bool = False


@_wire(60, 31, "Basic.CancelOk", "consumer_tag:shortstr")
@dataclass(frozen=True, slots=True)
class BasicCancelOk(Method):
    consumer_tag: str = ""


@_wire(60, 40, "Basic.Publish", "-:short exchange:shortstr routing_key:shortstr mandatory:bit immediate:bit")
@dataclass(frozen=True, slots=True)
class BasicPublish(Method):
    HAS_CONTENT: ClassVar[bool] = True
    exchange: str = ""
    routing_key: str = ""
    mandatory: bool = False
    immediate: bool = False


@_wire(60, 50, "Basic.Return", "reply_code:short reply_text:shortstr exchange:shortstr routing_key:shortstr")
@dataclass(frozen=True, slots=True)
class BasicReturn(Method):
    HAS_CONTENT: ClassVar[bool] = True
    reply_code: int = 0
    reply_text: str = ""
    exchange: str = ""
    routing_key: str = ""


@_wire(
    60,
    60,
    "Basic.Deliver",
    "consumer_tag:shortstr delivery_tag:longlong redelivered:bit exchange:shortstr routing_key:shortstr",
)
@dataclass(slots=True, unsafe_hash=True)  # built per message: not frozen (see the header)
class BasicDeliver(Method):
    HAS_CONTENT: ClassVar[bool] = True
    consumer_tag: str = ""
    delivery_tag: int = 0
    redelivered: bool = False
    exchange: str = ""
    routing_key: str = ""


@_wire(60, 70, "Basic.Get", "-:short queue:shortstr no_ack:bit", True)
@dataclass(frozen=True, slots=True)
class BasicGet(Method):
    queue: str = ""
    no_ack: bool = False


@_wire(
    60,
    71,
    "Basic.GetOk",
    "delivery_tag:longlong redelivered:bit exchange:shortstr routing_key:shortstr message_count:long",
)
@dataclass(frozen=True, slots=True)
class BasicGetOk(Method):
    HAS_CONTENT: ClassVar[bool] = True
    delivery_tag: int = 0
    redelivered: bool = False
    exchange: str = ""
    routing_key: str = ""
    message_count: int = 0


@_wire(60, 72, "Basic.GetEmpty", "-:shortstr")
@dataclass(frozen=True, slots=True)
class BasicGetEmpty(Method):
    pass


@_wire(60, 80, "Basic.Ack", "delivery_tag:longlong multiple:bit")
@dataclass(slots=True, unsafe_hash=True)  # built per message: not frozen (see the header)
class BasicAck(Method):
    delivery_tag: int = 0
    multiple: bool = False


@_wire(60, 90, "Basic.Reject", "delivery_tag:longlong requeue:bit")
@dataclass(frozen=True, slots=True)
class BasicReject(Method):
    delivery_tag: int = 0
    requeue: bool = True


@_wire(60, 100, "Basic.RecoverAsync", "requeue:bit")
@dataclass(frozen=True, slots=True)
class BasicRecoverAsync(Method):
    requeue: bool = False


@_wire(60, 110, "Basic.Recover", "requeue:bit", True)
@dataclass(frozen=True, slots=True)
class BasicRecover(Method):
    requeue: bool = False


@_wire(60, 111, "Basic.RecoverOk", "")
@dataclass(frozen=True, slots=True)
class BasicRecoverOk(Method):
    pass


@_wire(60, 120, "Basic.Nack", "delivery_tag:longlong multiple:bit requeue:bit")
@dataclass(frozen=True, slots=True)
class BasicNack(Method):
    delivery_tag: int = 0
    multiple: bool = False
    requeue: bool = True


# ---------------------------------------------------------------- confirm (85), RabbitMQ extension
@_wire(85, 10, "Confirm.Select", "nowait:bit", True)
@dataclass(frozen=True, slots=True)
class ConfirmSelect(Method):
    nowait: bool = False


@_wire(85, 11, "Confirm.SelectOk", "")
@dataclass(frozen=True, slots=True)
class ConfirmSelectOk(Method):
    pass


# ---------------------------------------------------------------- tx (90)
@_wire(90, 10, "Tx.Select", "", True)
@dataclass(frozen=True, slots=True)
class TxSelect(Method):
    pass


@_wire(90, 11, "Tx.SelectOk", "")
@dataclass(frozen=True, slots=True)
class TxSelectOk(Method):
    pass


@_wire(90, 20, "Tx.Commit", "", True)
@dataclass(frozen=True, slots=True)
class TxCommit(Method):
    pass


@_wire(90, 21, "Tx.CommitOk", "")
@dataclass(frozen=True, slots=True)
class TxCommitOk(Method):
    pass


@_wire(90, 30, "Tx.Rollback", "", True)
@dataclass(frozen=True, slots=True)
class TxRollback(Method):
    pass


@_wire(90, 31, "Tx.RollbackOk", "")
@dataclass(frozen=True, slots=True)
class TxRollbackOk(Method):
    pass


METHODS_BY_ID: dict[tuple[int, int], type[Method]] = {(c.CLASS_ID, c.METHOD_ID): c for c in METHOD_CLASSES}
