"""Closing channels as RabbitMQ does, and connection.update-secret: real clients (pika, aiormq) and raw frames.

The server's Close for a method goes out before its Close-Ok for a channel or connection Close the client sent after
that method (a publish to a missing exchange followed at once by a close must report the 404); when both sides
close a channel at once each answers the other's Close, and the number is free again once both are answered
(RabbitMQ 3.10.8 on the wire: Channel.Close 404, then Channel.CloseOk or Connection.CloseOk; after the client's
Close-Ok, Channel.OpenOk for the reopened number). channel_max bounds how many channels are open, not their
numbers (RabbitMQ 3.10.8 on the wire, as the channel_max test below).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Coroutine
from typing import Any

import aiormq
import aiormq.exceptions
import pika
import pika.exceptions
import pytest
from pamqp import body as pbody
from pamqp import commands, frame, header

from tests.integration.conftest import Target
from tests.integration.helpers import WAIT_S

MISSING_EXCHANGE_TEXT = "NOT_FOUND - no exchange '{}' in vhost '/'"


# ---------------------------------------------------------------- raw frames
class RawConnection:
    """A hand-opened AMQP connection on a blocking socket (PLAIN guest/guest, vhost '/')."""

    def __init__(self, target: Target, channel_max: int | None = None) -> None:
        self.sock = socket.create_connection((target.host, target.port), timeout=WAIT_S)
        self.buffer = bytearray()
        self.sock.sendall(header.ProtocolHeader().marshal())
        assert isinstance(self.read()[1], commands.Connection.Start)
        self.send((0, commands.Connection.StartOk(
            client_properties={"product": "raw-test"}, mechanism="PLAIN", response="\0guest\0guest")))
        _, tune = self.read()
        assert isinstance(tune, commands.Connection.Tune)
        self.send((0, commands.Connection.TuneOk(channel_max or tune.channel_max, tune.frame_max, 0)),
                  (0, commands.Connection.Open("/")))
        assert isinstance(self.read()[1], commands.Connection.OpenOk)

    def send(self, *frames: tuple[int, object]) -> None:
        """All the frames in one write (so the server gets them together)."""
        self.sock.sendall(b"".join(frame.marshal(value, channel) for channel, value in frames))  # type: ignore[arg-type]

    def read(self) -> tuple[int, object]:
        while True:
            if self.buffer:
                try:
                    consumed, channel, value = frame.unmarshal(bytes(self.buffer))
                except Exception:  # pamqp raises for an incomplete frame
                    consumed = 0
                if consumed:
                    del self.buffer[:consumed]
                    if not isinstance(value, commands.Connection.Blocked | commands.Connection.Unblocked):
                        return channel, value
                    continue
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed by the server")
            self.buffer.extend(chunk)

    def publish_frames(self, channel: int, exchange: str) -> list[tuple[int, object]]:
        return [(channel, commands.Basic.Publish(exchange=exchange, routing_key="k")),
                (channel, header.ContentHeader(0, 3, commands.Basic.Properties())),
                (channel, pbody.ContentBody(b"abc"))]

    def close(self) -> None:
        self.send((0, commands.Connection.Close(200, "bye", 0, 0)))
        while not isinstance(self.read()[1], commands.Connection.CloseOk):
            pass
        self.sock.close()


def _expect(raw: RawConnection, channel: int, kind: type) -> object:
    got_channel, value = raw.read()
    assert (got_channel, type(value)) == (channel, kind), (got_channel, value)
    return value


def test_publish_to_a_missing_exchange_then_close_at_once_reports_the_404(amqp_target: Target, uid: str) -> None:
    raw = RawConnection(amqp_target)
    try:
        raw.send((1, commands.Channel.Open()))
        _expect(raw, 1, commands.Channel.OpenOk)
        exchange = f"missing-{uid}"
        raw.send(*raw.publish_frames(1, exchange), (1, commands.Channel.Close(200, "bye", 0, 0)))
        close = _expect(raw, 1, commands.Channel.Close)
        assert (close.reply_code, close.reply_text) == (404, MISSING_EXCHANGE_TEXT.format(exchange))  # type: ignore[attr-defined]
        assert (close.class_id, close.method_id) == (60, 40)  # type: ignore[attr-defined]
        _expect(raw, 1, commands.Channel.CloseOk)  # the answer to our Close comes after the server's own
        raw.send((1, commands.Channel.CloseOk()))  # and we answer the server's Close
        raw.send((1, commands.Channel.Open()))  # then the number is free again
        _expect(raw, 1, commands.Channel.OpenOk)
    finally:
        raw.close()


def test_publish_to_a_missing_exchange_then_connection_close_at_once_reports_the_404(
        amqp_target: Target, uid: str) -> None:
    """RabbitMQ's reader answers Connection.Close once its channels are done: the channel's Close comes first."""
    raw = RawConnection(amqp_target)
    try:
        raw.send((1, commands.Channel.Open()))
        _expect(raw, 1, commands.Channel.OpenOk)
        exchange = f"missing-{uid}"
        raw.send(*raw.publish_frames(1, exchange), (0, commands.Connection.Close(200, "bye", 0, 0)))
        close = _expect(raw, 1, commands.Channel.Close)
        assert (close.reply_code, close.reply_text) == (404, MISSING_EXCHANGE_TEXT.format(exchange))  # type: ignore[attr-defined]
        _expect(raw, 0, commands.Connection.CloseOk)
    finally:
        raw.sock.close()


def test_crossing_closes_are_both_answered_and_the_number_is_reused(amqp_target: Target, uid: str) -> None:
    raw = RawConnection(amqp_target)
    try:
        raw.send((1, commands.Channel.Open()))
        _expect(raw, 1, commands.Channel.OpenOk)
        raw.send((1, commands.Queue.Declare(queue=f"missing-{uid}", passive=True)))
        close = _expect(raw, 1, commands.Channel.Close)
        assert close.reply_code == 404  # type: ignore[attr-defined]
        # A client that had not read the server's Close yet closes the channel too ...
        raw.send((1, commands.Channel.Close(200, "bye", 0, 0)))
        _expect(raw, 1, commands.Channel.CloseOk)
        # ... then answers the server's Close, and reopens the same number.
        raw.send((1, commands.Channel.CloseOk()), (1, commands.Channel.Open()))
        _expect(raw, 1, commands.Channel.OpenOk)
        raw.send((1, commands.Queue.Declare(queue="", exclusive=True)))
        _expect(raw, 1, commands.Queue.DeclareOk)
    finally:
        raw.close()


def test_channel_max_limits_how_many_channels_are_open_not_their_numbers(amqp_target: Target) -> None:
    """RabbitMQ 3.10: any channel number opens (aiormq's suite opens 65535 under channel_max 2047); the open that
    would make more than channel_max channels closes the connection with 530, and a channel the server closed counts
    until its Close-Ok. The default exchange refuses a passive declare too (403)."""
    raw = RawConnection(amqp_target, channel_max=3)
    try:
        raw.send((65535, commands.Channel.Open()))
        _expect(raw, 65535, commands.Channel.OpenOk)
        raw.send((65535, commands.Exchange.Declare(exchange="", passive=True)))
        close = _expect(raw, 65535, commands.Channel.Close)
        assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (  # type: ignore[attr-defined]
            403, "ACCESS_REFUSED - operation not permitted on the default exchange", 40, 10)
        raw.send((1, commands.Channel.Open()), (2, commands.Channel.Open()))
        _expect(raw, 1, commands.Channel.OpenOk)
        _expect(raw, 2, commands.Channel.OpenOk)
        raw.send((3, commands.Channel.Open()))
        close = _expect(raw, 0, commands.Connection.Close)
        assert (close.reply_code, close.reply_text) == (  # type: ignore[attr-defined]
            530, "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)")
    finally:
        raw.sock.close()


# ---------------------------------------------------------------- pika
def test_pika_publish_to_a_missing_exchange_then_channel_close_raises_the_404(amqp_target: Target, uid: str) -> None:
    """A command-line publisher: publish, close at once, and exit with the broker's error."""
    exchange = f"missing-{uid}"
    connection = pika.BlockingConnection(amqp_target.params())
    try:
        for attempt in range(6):
            channel = connection.channel(channel_number=1)
            channel.basic_publish(exchange, "k", b"x")
            if attempt % 2:  # (not a timing check) let the server's Close leave first: then the two Closes cross
                time.sleep(0.1)
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                channel.close()
            assert (info.value.reply_code, info.value.reply_text) == (404, MISSING_EXCHANGE_TEXT.format(exchange))
        assert connection.is_open
        channel = connection.channel(channel_number=1)
        channel.queue_declare("", exclusive=True)
    finally:
        connection.close()


def test_pika_publish_to_a_missing_exchange_then_connection_close_reports_the_404(
        amqp_target: Target, uid: str) -> None:
    exchange = f"missing-{uid}"
    connection = pika.BlockingConnection(amqp_target.params())
    channel = connection.channel()
    reasons: list[Exception] = []
    channel._impl.add_on_close_callback(lambda _channel, reason: reasons.append(reason))
    channel.basic_publish(exchange, "k", b"x")
    connection.close()  # closes the channel first
    assert len(reasons) == 1 and isinstance(reasons[0], pika.exceptions.ChannelClosedByBroker), reasons
    assert reasons[0].reply_code == 404


# ---------------------------------------------------------------- connection.update-secret
def _run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, WAIT_S))


def test_update_secret_with_the_current_password_is_accepted(amqp_target: Target) -> None:
    async def scenario() -> None:
        connection = await aiormq.connect(amqp_target.url())
        try:
            reply = await connection.update_secret("guest", reason="token refresh", timeout=WAIT_S)
            assert isinstance(reply, commands.Connection.UpdateSecretOk)
            channel = await connection.channel()  # the connection carries on
            declared = await channel.queue_declare("", exclusive=True)
            assert declared.queue.startswith("amq.gen-")
        finally:
            await connection.close()

    _run(scenario())


def test_update_secret_with_a_wrong_secret_closes_the_connection_with_530(amqp_target: Target) -> None:
    async def scenario() -> None:
        connection = await aiormq.connect(amqp_target.url())
        if connection.server_properties.get("product") == "RabbitMQ":
            await connection.close()
            pytest.skip("RabbitMQ's internal backend does not check a new secret (its state cannot expire)")
        try:
            with pytest.raises(aiormq.exceptions.ConnectionNotAllowed) as info:
                await connection.update_secret("not-the-password", reason="token refresh", timeout=WAIT_S)
            assert "invalid credentials" in str(info.value)
            for _ in range(int(WAIT_S / 0.05)):  # aiormq marks itself closed once its reader task has finished
                if connection.is_closed:
                    break
                await asyncio.sleep(0.05)
            assert connection.is_closed
        finally:
            await connection.close()

    _run(scenario())
