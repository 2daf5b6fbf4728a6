"""Method classes of AMQP classes exchange (40) and queue (50): declare, delete, bind, unbind, purge.
Field conventions: node/amqp/methods/__init__.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from node.amqp.methods.base import Method, wire


# ---------------------------------------------------------------- exchange (40)
@wire(
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


@wire(40, 11, "Exchange.DeclareOk", "")
@dataclass(frozen=True, slots=True)
class ExchangeDeclareOk(Method):
    pass


@wire(40, 20, "Exchange.Delete", "-:short exchange:shortstr if_unused:bit nowait:bit", True)
@dataclass(frozen=True, slots=True)
class ExchangeDelete(Method):
    exchange: str = ""
    if_unused: bool = False
    nowait: bool = False


@wire(40, 21, "Exchange.DeleteOk", "")
@dataclass(frozen=True, slots=True)
class ExchangeDeleteOk(Method):
    pass


@wire(
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


@wire(40, 31, "Exchange.BindOk", "")
@dataclass(frozen=True, slots=True)
class ExchangeBindOk(Method):
    pass


@wire(
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


@wire(40, 51, "Exchange.UnbindOk", "")
@dataclass(frozen=True, slots=True)
class ExchangeUnbindOk(Method):
    pass


# ---------------------------------------------------------------- queue (50)
@wire(
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


@wire(50, 11, "Queue.DeclareOk", "queue:shortstr message_count:long consumer_count:long")
@dataclass(frozen=True, slots=True)
class QueueDeclareOk(Method):
    queue: str = ""
    message_count: int = 0
    consumer_count: int = 0


@wire(
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


@wire(50, 21, "Queue.BindOk", "")
@dataclass(frozen=True, slots=True)
class QueueBindOk(Method):
    pass


@wire(50, 30, "Queue.Purge", "-:short queue:shortstr nowait:bit", True)
@dataclass(frozen=True, slots=True)
class QueuePurge(Method):
    queue: str = ""
    nowait: bool = False


@wire(50, 31, "Queue.PurgeOk", "message_count:long")
@dataclass(frozen=True, slots=True)
class QueuePurgeOk(Method):
    message_count: int = 0


@wire(50, 40, "Queue.Delete", "-:short queue:shortstr if_unused:bit if_empty:bit nowait:bit", True)
@dataclass(frozen=True, slots=True)
class QueueDelete(Method):
    queue: str = ""
    if_unused: bool = False
    if_empty: bool = False
    nowait: bool = False


@wire(50, 41, "Queue.DeleteOk", "message_count:long")
@dataclass(frozen=True, slots=True)
class QueueDeleteOk(Method):
    message_count: int = 0


@wire(
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


@wire(50, 51, "Queue.UnbindOk", "")
@dataclass(frozen=True, slots=True)
class QueueUnbindOk(Method):
    pass
