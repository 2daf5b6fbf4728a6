"""A scripted AMQP client built on pamqp, for driving ServerConnection in tests (frames as a real client sends)."""

from __future__ import annotations

from typing import Any

from pamqp import body as pbody
from pamqp import commands, frame, header
from pamqp import heartbeat as pheartbeat

from node.amqp.connection import ConnectionLimits, ServerConnection
from node.amqp.events import Event
from node.amqp.spec import PROTOCOL_HEADER


class Users:
    """Authenticator: guest/guest on '/', 'limited' may not open '/'."""

    def __init__(self, passwords: dict[str, str] | None = None, vhosts: dict[str, set[str]] | None = None):
        self.passwords = passwords or {"guest": "guest", "limited": "pw"}
        self.vhosts = vhosts or {"guest": {"/"}, "limited": {"other"}}

    def authenticate(self, mechanism: str, response: bytes) -> str | None:
        from node.amqp.auth import parse_sasl_response

        parsed = parse_sasl_response(mechanism, response)
        if parsed is None:
            return None
        user, password = parsed
        return user if self.passwords.get(user) == password else None

    def vhost_access(self, username: str, vhost: str) -> bool:
        return vhost in self.vhosts.get(username, set())

    def connection_limit_reached(self, vhost: str) -> int | None:
        return None


def marshal(channel: int, obj: Any) -> bytes:
    return frame.marshal(obj, channel)


def parse_frames(data: bytes) -> list[tuple[int, Any]]:
    """Split server output into (channel, pamqp frame) pairs."""
    out: list[tuple[int, Any]] = []
    while data:
        consumed, channel, value = frame.unmarshal(data)
        out.append((channel, value))
        data = data[consumed:]
    return out


def start_ok(
    user: str = "guest",
    password: str = "guest",
    capabilities: dict[str, Any] | None = None,
    mechanism: str = "PLAIN",
) -> bytes:
    caps = (
        {"authentication_failure_close": True, "connection.blocked": True}
        if capabilities is None
        else capabilities
    )
    response = f"\0{user}\0{password}"
    return marshal(
        0,
        commands.Connection.StartOk(
            client_properties={"product": "test", "capabilities": caps},
            mechanism=mechanism,
            response=response,
        ),
    )


class Session:
    """A ServerConnection plus helpers to feed pamqp frames and read pamqp frames back."""

    def __init__(self, limits: ConnectionLimits | None = None, users: Users | None = None) -> None:
        self.now_ms = 0
        self.conn = ServerConnection(users or Users(), limits or ConnectionLimits())
        self.events: list[Event] = []

    def send(self, data: bytes) -> list[tuple[int, Any]]:
        self.conn.receive_data(data, self.now_ms)
        self.events += self.conn.next_events()
        return parse_frames(self.conn.data_to_send())

    def send_frame(self, channel: int, obj: Any) -> list[tuple[int, Any]]:
        return self.send(marshal(channel, obj))

    def handshake(
        self, heartbeat: int = 0, frame_max: int = 131072, channel_max: int = 2047, vhost: str = "/"
    ) -> list[tuple[int, Any]]:
        out = self.send(PROTOCOL_HEADER)
        assert isinstance(out[0][1], commands.Connection.Start)
        out = self.send(start_ok())
        assert isinstance(out[0][1], commands.Connection.Tune), out
        self.send_frame(
            0, commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat)
        )
        return self.send_frame(0, commands.Connection.Open(virtual_host=vhost))

    def open_channel(self, channel: int = 1) -> None:
        out = self.send_frame(channel, commands.Channel.Open())
        assert [type(f) for _, f in out] == [commands.Channel.OpenOk], out

    def publish(
        self,
        channel: int,
        body: bytes,
        exchange: str = "",
        routing_key: str = "q",
        properties: commands.Basic.Properties | None = None,
        frame_max: int = 131072,
    ) -> list[Any]:
        data = marshal(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key))
        data += marshal(
            channel, header.ContentHeader(0, len(body), properties or commands.Basic.Properties())
        )
        chunk = frame_max - 8
        for start in range(0, len(body), chunk):
            data += marshal(channel, pbody.ContentBody(body[start : start + chunk]))
        return self.send(data)


HEARTBEAT = marshal(0, pheartbeat.Heartbeat())


def close_of(out: list[tuple[int, Any]]) -> tuple[int, int, str, int, int]:
    """The one Close (connection or channel) in `out`: (channel, reply code, text, class id, method id)."""
    assert len(out) == 1, out
    channel, method = out[0]
    assert isinstance(method, (commands.Connection.Close, commands.Channel.Close)), method
    return channel, method.reply_code, method.reply_text, method.class_id, method.method_id


def opened(channels: tuple[int, ...] = (1,), **limits: Any) -> Session:
    """A session past the handshake (guest on /) with `channels` open."""
    session = Session(ConnectionLimits(**limits))
    session.handshake()
    for channel in channels:
        session.open_channel(channel)
    return session

