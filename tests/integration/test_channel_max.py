"""channel_max on a real broker, both modes: the client's lower value is what holds for the connection; a channel
above it closes the connection with 530 NOT_ALLOWED and leaves other connections untouched; and a second
channel.open on an open channel is 504 CHANNEL_ERROR (as RabbitMQ)."""

from __future__ import annotations

import socket

import pika
from pamqp import commands, frame, header

from tests.integration.conftest import Target
from tests.integration.helpers import WAIT_S, read_frame


def _open(target: Target, channel_max: int) -> tuple[socket.socket, bytearray, int]:
    """A hand-made connection that negotiates `channel_max`; the server's offer too."""
    sock = socket.create_connection((target.host, target.port), timeout=WAIT_S)
    buffer = bytearray()
    sock.sendall(header.ProtocolHeader().marshal())
    assert isinstance(read_frame(sock, buffer), commands.Connection.Start)
    sock.sendall(frame.marshal(commands.Connection.StartOk(
        client_properties={"product": "channel-max-test"}, mechanism="PLAIN", response="\0guest\0guest"), 0))
    tune = read_frame(sock, buffer)
    assert isinstance(tune, commands.Connection.Tune)
    sock.sendall(frame.marshal(commands.Connection.TuneOk(channel_max, tune.frame_max, 0), 0)
                 + frame.marshal(commands.Connection.Open("/"), 0))
    assert isinstance(read_frame(sock, buffer), commands.Connection.OpenOk)
    return sock, buffer, tune.channel_max


def _next_close(sock: socket.socket, buffer: bytearray) -> commands.Connection.Close | commands.Channel.Close:
    while True:
        method = read_frame(sock, buffer)
        if isinstance(method, commands.Connection.Close | commands.Channel.Close):
            return method


def test_a_channel_above_the_negotiated_channel_max_closes_only_that_connection(amqp_target: Target) -> None:
    bystander = pika.BlockingConnection(amqp_target.params())
    sock, buffer, offered = _open(amqp_target, channel_max=3)
    try:
        assert offered >= 3
        for channel in (1, 2, 3):
            sock.sendall(frame.marshal(commands.Channel.Open(), channel))
            assert isinstance(read_frame(sock, buffer), commands.Channel.OpenOk)
        sock.sendall(frame.marshal(commands.Channel.Open(), 4))
        close = _next_close(sock, buffer)
        assert isinstance(close, commands.Connection.Close)
        assert close.reply_code == 530 and close.reply_text.startswith("NOT_ALLOWED"), close
        sock.sendall(frame.marshal(commands.Connection.CloseOk(), 0))
        bystander.channel().queue_declare("", exclusive=True)  # the other connection carries on
    finally:
        sock.close()
        bystander.close()


def test_a_second_channel_open_on_an_open_channel_is_504(amqp_target: Target) -> None:
    sock, buffer, _ = _open(amqp_target, channel_max=10)
    try:
        sock.sendall(frame.marshal(commands.Channel.Open(), 1))
        assert isinstance(read_frame(sock, buffer), commands.Channel.OpenOk)
        sock.sendall(frame.marshal(commands.Channel.Open(), 1))
        close = _next_close(sock, buffer)
        assert isinstance(close, commands.Connection.Close) and close.reply_code == 504, close
    finally:
        sock.close()
