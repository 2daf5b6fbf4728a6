"""The mirrored replicas' fetch transport on the shared authenticated link (cluster/authlink): on a real socket, a
frame altered on the way or replayed is dropped, logged and counted and closes the connection; a dialer that proves
the secret for the queue Raft protocol instead is refused; what crosses the wire is encrypted (a payload's bytes
never appear in the stream) and a frame sealed by one side opens only as the other side's next frame."""

from __future__ import annotations

import logging

import pytest
import trio

from cluster.authlink.frames import FrameSealer
from cluster.authlink.handshake import MIRROR_LINK, RAFT_LINK, FrameReader, LinkProtocol, dial_link
from cluster.mirror_queues.runtime.transport import MirrorTransport
from cluster.mirror_queues.runtime.wire import FetchRequest, WireMessage, encode

SECRET = b"mirror-link-test-secret-0123456789"
WAIT_S = 30


async def _dial(port: int, protocol: LinkProtocol = MIRROR_LINK) -> tuple[trio.SocketStream, FrameReader, FrameSealer | None]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    reader = FrameReader(stream)
    keys = await dial_link(protocol, SECRET, "y", "x", stream, reader)
    return stream, reader, None if keys is None else FrameSealer(keys.send)


async def _closed(reader: FrameReader) -> bool:
    with trio.fail_after(WAIT_S):
        try:
            return await reader.read() is None
        except trio.BrokenResourceError:
            return True


async def test_altered_and_replayed_fetch_frames_are_dropped_counted_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="cluster.mirror_queues.runtime.transport")
    got: list[tuple[str, WireMessage]] = []
    x = MirrorTransport("x", SECRET, {"y": ("127.0.0.1", 1)}, lambda src, m: got.append((src, m)))
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, x._handle_inbound, [listener])
        with trio.fail_after(WAIT_S):
            stream, reader, sealer = await _dial(port)
            assert sealer is not None
            payload = encode(FetchRequest("y", 3, 7))
            good = sealer.seal(payload)
            assert payload not in good  # encrypted on the wire
            bad = bytearray(sealer.seal(payload))
            bad[-1] ^= 0x01  # the tag altered
            await stream.send_all(good + bytes(bad))
            assert await _closed(reader)
            assert got == [("y", FetchRequest("y", 3, 7))] and x.stats.frames_rejected == 1

            stream, reader, sealer = await _dial(port)  # replayed: the same frame twice
            assert sealer is not None
            again = sealer.seal(payload)
            await stream.send_all(again + again)
            assert await _closed(reader)
            assert len(got) == 2 and x.stats.frames_rejected == 2

            stream, reader, sealer = await _dial(port, RAFT_LINK)  # the Raft protocol's proof does not open here
            assert sealer is None and x.stats.auth_failures == 1
            await stream.aclose()
        nursery.cancel_scope.cancel()
    dropped = [r.getMessage() for r in caplog.records if "frame dropped" in r.getMessage()]
    assert len(dropped) == 2, dropped
