"""Events `ServerConnection.next_events()` hands up to the broker/runtime (dataclasses, no behaviour).

All frozen but `MethodReceived` (built once per ack: slotted, not frozen; a frozen dataclass's `__init__` costs about
three times as much) and `ContentReceived` (once per publish: a named tuple); treat them as values all the same."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from node.amqp.methods import BasicPublish, Method
from node.amqp.properties import BasicProperties


@dataclass(frozen=True, slots=True)
class ConnectionOpened:
    """Handshake done (Connection.Open accepted and Open-Ok queued)."""

    vhost: str
    username: str
    client_properties: dict[str, Any] = field(default_factory=dict)
    channel_max: int = 0
    frame_max: int = 0
    heartbeat_s: int = 0


@dataclass(frozen=True, slots=True)
class ChannelOpened:
    channel: int


@dataclass(slots=True, unsafe_hash=True)  # one per publish/ack: not frozen (see the header)
class MethodReceived:
    """A channel-level method without content (incl. ChannelFlow, which the broker answers with FlowOk)."""

    channel: int
    method: Method


class ContentReceived(NamedTuple):
    """A complete Basic.Publish: method, properties and the whole body. A named tuple (one per publish): the
    receive path builds it with `tuple.__new__`, about a quarter of a slotted dataclass's `__init__`."""

    channel: int
    method: BasicPublish
    properties: BasicProperties
    body: bytes


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """The channel is gone for the broker (closed by either side); its number is free once every Close on it was
    answered. `by_client`: the client sent Channel.Close, and the broker answers it with `ChannelCloseOk` (through
    `send_method`) once it has handled everything before it, so its own Close for an earlier method goes out first,
    as RabbitMQ's channel process does."""

    channel: int
    by_client: bool = False


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is finished: flush `data_to_send()` and close the socket. `by_client`: the client sent
    Connection.Close, and the broker answers it with `ConnectionCloseOk` (through `send_method`) once it has handled
    everything before it; the runtime writes the broker's effects of that round before it closes the socket."""

    reply_code: int
    reply_text: str
    by_client: bool = False


Event = ConnectionOpened | ChannelOpened | MethodReceived | ContentReceived | ChannelClosed | ConnectionClosed
