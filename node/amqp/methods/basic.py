"""Method classes of AMQP classes basic (60), confirm (85, RabbitMQ's extension) and tx (90): publishing,
consuming, acknowledgements, publisher confirms and transactions. Field conventions: node/amqp/methods/__init__.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from node.amqp.methods.base import Method, wire


# ---------------------------------------------------------------- basic (60)
@wire(60, 10, "Basic.Qos", "prefetch_size:long prefetch_count:short global_:bit", True)
@dataclass(frozen=True, slots=True)
class BasicQos(Method):
    prefetch_size: int = 0
    prefetch_count: int = 0
    global_: bool = False


@wire(60, 11, "Basic.QosOk", "")
@dataclass(frozen=True, slots=True)
class BasicQosOk(Method):
    pass


@wire(
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


@wire(60, 21, "Basic.ConsumeOk", "consumer_tag:shortstr")
@dataclass(frozen=True, slots=True)
class BasicConsumeOk(Method):
    consumer_tag: str = ""


@wire(60, 30, "Basic.Cancel", "consumer_tag:shortstr nowait:bit", True)
@dataclass(frozen=True, slots=True)
class BasicCancel(Method):
    consumer_tag: str = ""
    nowait: bool = False


@wire(60, 31, "Basic.CancelOk", "consumer_tag:shortstr")
@dataclass(frozen=True, slots=True)
class BasicCancelOk(Method):
    consumer_tag: str = ""


@wire(60, 40, "Basic.Publish", "-:short exchange:shortstr routing_key:shortstr mandatory:bit immediate:bit")
@dataclass(frozen=True, slots=True)
class BasicPublish(Method):
    HAS_CONTENT: ClassVar[bool] = True
    exchange: str = ""
    routing_key: str = ""
    mandatory: bool = False
    immediate: bool = False


@wire(60, 50, "Basic.Return", "reply_code:short reply_text:shortstr exchange:shortstr routing_key:shortstr")
@dataclass(frozen=True, slots=True)
class BasicReturn(Method):
    HAS_CONTENT: ClassVar[bool] = True
    reply_code: int = 0
    reply_text: str = ""
    exchange: str = ""
    routing_key: str = ""


@wire(
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


@wire(60, 70, "Basic.Get", "-:short queue:shortstr no_ack:bit", True)
@dataclass(frozen=True, slots=True)
class BasicGet(Method):
    queue: str = ""
    no_ack: bool = False


@wire(
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


@wire(60, 72, "Basic.GetEmpty", "-:shortstr")
@dataclass(frozen=True, slots=True)
class BasicGetEmpty(Method):
    pass


@wire(60, 80, "Basic.Ack", "delivery_tag:longlong multiple:bit")
@dataclass(slots=True, unsafe_hash=True)  # built per message: not frozen (see the header)
class BasicAck(Method):
    delivery_tag: int = 0
    multiple: bool = False


@wire(60, 90, "Basic.Reject", "delivery_tag:longlong requeue:bit")
@dataclass(frozen=True, slots=True)
class BasicReject(Method):
    delivery_tag: int = 0
    requeue: bool = True


@wire(60, 100, "Basic.RecoverAsync", "requeue:bit")
@dataclass(frozen=True, slots=True)
class BasicRecoverAsync(Method):
    requeue: bool = False


@wire(60, 110, "Basic.Recover", "requeue:bit", True)
@dataclass(frozen=True, slots=True)
class BasicRecover(Method):
    requeue: bool = False


@wire(60, 111, "Basic.RecoverOk", "")
@dataclass(frozen=True, slots=True)
class BasicRecoverOk(Method):
    pass


@wire(60, 120, "Basic.Nack", "delivery_tag:longlong multiple:bit requeue:bit")
@dataclass(frozen=True, slots=True)
class BasicNack(Method):
    delivery_tag: int = 0
    multiple: bool = False
    requeue: bool = True


# ---------------------------------------------------------------- confirm (85), RabbitMQ extension
@wire(85, 10, "Confirm.Select", "nowait:bit", True)
@dataclass(frozen=True, slots=True)
class ConfirmSelect(Method):
    nowait: bool = False


@wire(85, 11, "Confirm.SelectOk", "")
@dataclass(frozen=True, slots=True)
class ConfirmSelectOk(Method):
    pass


# ---------------------------------------------------------------- tx (90)
@wire(90, 10, "Tx.Select", "", True)
@dataclass(frozen=True, slots=True)
class TxSelect(Method):
    pass


@wire(90, 11, "Tx.SelectOk", "")
@dataclass(frozen=True, slots=True)
class TxSelectOk(Method):
    pass


@wire(90, 20, "Tx.Commit", "", True)
@dataclass(frozen=True, slots=True)
class TxCommit(Method):
    pass


@wire(90, 21, "Tx.CommitOk", "")
@dataclass(frozen=True, slots=True)
class TxCommitOk(Method):
    pass


@wire(90, 30, "Tx.Rollback", "", True)
@dataclass(frozen=True, slots=True)
class TxRollback(Method):
    pass


@wire(90, 31, "Tx.RollbackOk", "")
@dataclass(frozen=True, slots=True)
class TxRollbackOk(Method):
    pass
