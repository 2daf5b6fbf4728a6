"""A minimal hand-written AMQP 0-9-1 client over a trio stream (pamqp for the frames), for load-shaped tests.

It does only what pika cannot be made to do: thousands of connections in one process, or a consumer that stops
reading its socket on purpose.
"""

from __future__ import annotations

from typing import Any

import trio
from pamqp import body as pamqp_body
from pamqp import commands, frame, header

WAITED_FOR = (
    commands.Connection.Start, commands.Connection.Tune, commands.Connection.OpenOk, commands.Connection.Close,
    commands.Channel.OpenOk, commands.Channel.Close, commands.Basic.ConsumeOk, commands.Queue.DeclareOk,
)


class RawClient:
    """A hand-written AMQP client over a trio stream: just enough to open a connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def read_method(self) -> Any:
        while True:
            if self.buffer:
                try:
                    consumed, _channel, value = frame.unmarshal(bytes(self.buffer))
                except Exception:  # incomplete frame
                    consumed = 0
                if consumed:
                    del self.buffer[:consumed]
                    if isinstance(value, WAITED_FOR):
                        return value
                    continue
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise EOFError
            self.buffer.extend(chunk)

    async def open(self) -> None:
        await self.stream.send_all(header.ProtocolHeader().marshal())
        assert isinstance(await self.read_method(), commands.Connection.Start)
        await self.stream.send_all(frame.marshal(commands.Connection.StartOk(
            client_properties={"product": "many"}, mechanism="PLAIN", response="\0guest\0guest"), 0))
        tune = await self.read_method()
        await self.stream.send_all(frame.marshal(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0), 0)
                                   + frame.marshal(commands.Connection.Open("/"), 0))
        assert isinstance(await self.read_method(), commands.Connection.OpenOk)


    async def open_channel(self, channel: int = 1) -> None:
        await self.stream.send_all(frame.marshal(commands.Channel.Open(), channel))
        assert isinstance(await self.read_method(), commands.Channel.OpenOk)

    async def declare_queue(self, name: str, channel: int = 1) -> None:
        await self.stream.send_all(frame.marshal(commands.Queue.Declare(queue=name), channel))
        assert isinstance(await self.read_method(), commands.Queue.DeclareOk)

    async def consume(self, queue: str, no_ack: bool = True, channel: int = 1) -> None:
        await self.stream.send_all(frame.marshal(commands.Basic.Consume(queue=queue, no_ack=no_ack), channel))
        assert isinstance(await self.read_method(), commands.Basic.ConsumeOk)

    def publish_frames(self, routing_key: str, body: bytes, channel: int = 1) -> bytes:
        """The frames of one publish to the default exchange (the body in one frame: keep it < frame_max)."""
        return (
            frame.marshal(commands.Basic.Publish(exchange="", routing_key=routing_key), channel)
            + frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties()), channel)
            + frame.marshal(pamqp_body.ContentBody(body), channel)
        )


