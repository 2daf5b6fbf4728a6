"""Method classes of AMQP classes connection (10), channel (20) and access (30): the handshake, channel
open/flow/close, and the deprecated access.request still on the wire. Field conventions: node/amqp/methods/__init__.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from node.amqp.methods.base import Method, wire


# ---------------------------------------------------------------- connection (10)
@wire(
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


@wire(
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


@wire(10, 20, "Connection.Secure", "challenge:longstr", True)
@dataclass(frozen=True, slots=True)
class ConnectionSecure(Method):
    challenge: bytes = b""


@wire(10, 21, "Connection.SecureOk", "response:longstr")
@dataclass(frozen=True, slots=True)
class ConnectionSecureOk(Method):
    response: bytes = b""


@wire(10, 30, "Connection.Tune", "channel_max:short frame_max:long heartbeat:short", True)
@dataclass(frozen=True, slots=True)
class ConnectionTune(Method):
    channel_max: int = 0
    frame_max: int = 0
    heartbeat: int = 0


@wire(10, 31, "Connection.TuneOk", "channel_max:short frame_max:long heartbeat:short")
@dataclass(frozen=True, slots=True)
class ConnectionTuneOk(Method):
    channel_max: int = 0
    frame_max: int = 0
    heartbeat: int = 0


@wire(10, 40, "Connection.Open", "virtual_host:shortstr -:shortstr -:bit", True)
@dataclass(frozen=True, slots=True)
class ConnectionOpen(Method):
    virtual_host: str = "/"


@wire(10, 41, "Connection.OpenOk", "-:shortstr")
@dataclass(frozen=True, slots=True)
class ConnectionOpenOk(Method):
    pass


@wire(
    10, 50, "Connection.Close", "reply_code:short reply_text:shortstr class_id:short method_id:short", True
)
@dataclass(frozen=True, slots=True)
class ConnectionClose(Method):
    reply_code: int = 0
    reply_text: str = ""
    class_id: int = 0
    method_id: int = 0


@wire(10, 51, "Connection.CloseOk", "")
@dataclass(frozen=True, slots=True)
class ConnectionCloseOk(Method):
    pass


@wire(10, 60, "Connection.Blocked", "reason:shortstr")
@dataclass(frozen=True, slots=True)
class ConnectionBlocked(Method):
    reason: str = ""


@wire(10, 61, "Connection.Unblocked", "")
@dataclass(frozen=True, slots=True)
class ConnectionUnblocked(Method):
    pass


@wire(10, 70, "Connection.UpdateSecret", "new_secret:longstr reason:shortstr", True)
@dataclass(frozen=True, slots=True)
class ConnectionUpdateSecret(Method):
    new_secret: bytes = b""
    reason: str = ""


@wire(10, 71, "Connection.UpdateSecretOk", "")
@dataclass(frozen=True, slots=True)
class ConnectionUpdateSecretOk(Method):
    pass


# ---------------------------------------------------------------- channel (20)
@wire(20, 10, "Channel.Open", "-:shortstr", True)
@dataclass(frozen=True, slots=True)
class ChannelOpen(Method):
    pass


@wire(20, 11, "Channel.OpenOk", "-:longstr")
@dataclass(frozen=True, slots=True)
class ChannelOpenOk(Method):
    pass


@wire(20, 20, "Channel.Flow", "active:bit", True)
@dataclass(frozen=True, slots=True)
class ChannelFlow(Method):
    active: bool = False


@wire(20, 21, "Channel.FlowOk", "active:bit")
@dataclass(frozen=True, slots=True)
class ChannelFlowOk(Method):
    active: bool = False


@wire(20, 40, "Channel.Close", "reply_code:short reply_text:shortstr class_id:short method_id:short", True)
@dataclass(frozen=True, slots=True)
class ChannelClose(Method):
    reply_code: int = 0
    reply_text: str = ""
    class_id: int = 0
    method_id: int = 0


@wire(20, 41, "Channel.CloseOk", "")
@dataclass(frozen=True, slots=True)
class ChannelCloseOk(Method):
    pass


# ---------------------------------------------------------------- access (30, deprecated but still on the wire)
@wire(
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


@wire(30, 11, "Access.RequestOk", "-:short")
@dataclass(frozen=True, slots=True)
class AccessRequestOk(Method):
    pass
