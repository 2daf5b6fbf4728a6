"""Every queue Raft frame after the handshake is authenticated: frames injected on a real socket that are forged,
altered, replayed or reordered are dropped, counted and logged, and close the connection; a byte flipped by a
relay on the path between two real transports costs one connection, which the dialer then re-establishes."""

from __future__ import annotations

import logging

import cbor2
import pytest
import trio

from cluster.authlink.frames import (
    FrameForged,
    FrameOpener,
    FrameReplayed,
    FrameSealer,
    session_keys,
)
from cluster.authlink.handshake import CHALLENGE_BYTES, RAFT_LINK, FrameReader, frame
from cluster.raft.core.multiraft import NodeBatch
from cluster.raft.core.types import NodeId
from cluster.raft.runtime.codec import encode_batch
from cluster.raft.runtime.transport import Transport
from tests.raft.test_runtime_cluster import _free_ports

N1, N2 = NodeId("n1"), NodeId("n2")
SECRET = b"frame-auth-test-secret-0123456789"
WAIT_S = 30
MY_CHALLENGE = b"d" * CHALLENGE_BYTES


def test_sealed_frames_open_in_order_and_nothing_else_does() -> None:
    dialer = session_keys(SECRET, b"l" * 16, b"d" * 16, N1, N2, dialer_side=True)
    listener = session_keys(SECRET, b"l" * 16, b"d" * 16, N1, N2, dialer_side=False)
    assert dialer.send == listener.receive and dialer.receive == listener.send and dialer.send != dialer.receive
    other = session_keys(SECRET, b"l" * 16, b"e" * 16, N1, N2, dialer_side=True)
    assert other.send != dialer.send  # another challenge, another key
    sealer, opener = FrameSealer(dialer.send), FrameOpener(listener.receive)
    first, second = sealer.seal(b"one")[4:], sealer.seal(b"two")[4:]
    with pytest.raises(FrameReplayed):
        FrameOpener(listener.receive).open(second)  # reordered
    assert opener.open(first) == b"one"
    with pytest.raises(FrameReplayed):
        opener.open(first)  # replayed
    altered = bytearray(second)
    altered[9] ^= 1
    with pytest.raises(FrameForged):
        opener.open(bytes(altered))
    with pytest.raises(FrameForged):
        opener.open(FrameSealer(other.send).seal(b"two")[4:])  # sealed with another connection's key
    with pytest.raises(FrameForged):
        opener.open(FrameSealer(listener.send).seal(b"two")[4:])  # reflected: the other direction's key
    with pytest.raises(FrameForged):
        opener.open(b"short")
    assert opener.open(second) == b"two"


async def _dial_as_n1(port: int) -> tuple[trio.SocketStream, FrameReader, FrameSealer]:
    """Connect to n2 as n1 (we hold the secret) and complete the handshake; the sealer for our frames."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    reader = FrameReader(stream)
    challenge = await reader.read()
    assert challenge is not None
    await stream.send_all(frame(cbor2.dumps([N1, RAFT_LINK.proof(SECRET, b"dial", challenge, N1), MY_CHALLENGE])))
    assert await reader.read() is not None  # n2's proof
    keys = session_keys(SECRET, challenge, MY_CHALLENGE, N1, N2, dialer_side=True)
    return stream, reader, FrameSealer(keys.send)


async def _closed_by_peer(reader: FrameReader) -> bool:
    with trio.fail_after(WAIT_S):
        try:
            return await reader.read() is None
        except trio.BrokenResourceError:
            return True


def _batch(commit: int) -> bytes:
    return encode_batch(NodeBatch(N1, N2, commit, ()))


async def test_injected_frames_are_dropped_counted_and_close_the_connection(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="cluster.raft.runtime.transport")
    (port,) = _free_ports(1)
    batches: list[NodeBatch] = []
    n2 = Transport(N2, {N1: ("127.0.0.1", 1)}, SECRET, batches.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(n2.serve, "127.0.0.1", port)
        with trio.fail_after(WAIT_S):
            # a replayed frame: the first copy is delivered, the second closes the connection
            stream, reader, sealer = await _dial_as_n1(port)
            sealed = sealer.seal(_batch(1))
            await stream.send_all(sealed + sealed)
            assert await _closed_by_peer(reader)
            assert [b.incarnation for b in batches] == [1] and n2.stats.frames_replayed == 1

            # reordered: the second frame first
            stream, reader, sealer = await _dial_as_n1(port)
            first, second = sealer.seal(_batch(2)), sealer.seal(_batch(3))
            await stream.send_all(second + first)
            assert await _closed_by_peer(reader)
            assert len(batches) == 1 and n2.stats.frames_replayed == 2

            # altered: a valid frame with one payload byte flipped, after a valid one
            stream, reader, sealer = await _dial_as_n1(port)
            good, bad = sealer.seal(_batch(4)), bytearray(sealer.seal(_batch(5)))
            bad[4 + 8 + 2] ^= 0x01
            await stream.send_all(good + bytes(bad))
            assert await _closed_by_peer(reader)
            assert [b.incarnation for b in batches] == [1, 4] and n2.stats.frames_forged == 1

            # forged: a frame without a valid tag (the old unauthenticated framing), and one sealed with a key
            # derived from another connection's challenges
            stream, reader, _ = await _dial_as_n1(port)
            await stream.send_all(frame(_batch(6)))
            assert await _closed_by_peer(reader)
            stream, reader, _ = await _dial_as_n1(port)
            stale = session_keys(SECRET, b"x" * CHALLENGE_BYTES, MY_CHALLENGE, N1, N2, dialer_side=True)
            await stream.send_all(FrameSealer(stale.send).seal(_batch(7)))
            assert await _closed_by_peer(reader)
            assert [b.incarnation for b in batches] == [1, 4] and n2.stats.frames_forged == 3

            # and a well-behaved connection still works
            stream, reader, sealer = await _dial_as_n1(port)
            await stream.send_all(sealer.seal(_batch(8)))
            while len(batches) < 3:
                await trio.sleep(0.01)
            assert N1 in n2.connected_peers()
            await stream.aclose()
        nursery.cancel_scope.cancel()
    assert [b.incarnation for b in batches] == [1, 4, 8]
    dropped = [r.getMessage() for r in caplog.records if "frame dropped" in r.getMessage()]
    assert len(dropped) == 5, dropped


async def _relay_flipping_one_byte(listener: trio.SocketListener, target: int, flip_at: int,
                                   flipped: list[int]) -> None:
    """Forward connections to `target`; on the first, flip one bit of the byte at offset `flip_at` of what the
    dialer sends (past the handshake: inside the first frame)."""
    async def pipe(src: trio.SocketStream, dst: trio.SocketStream, flip: bool) -> None:
        offset = 0
        try:
            while data := await src.receive_some(65536):
                if flip and offset <= flip_at < offset + len(data):
                    mutable = bytearray(data)
                    mutable[flip_at - offset] ^= 0x01
                    data = bytes(mutable)
                    flipped.append(flip_at)
                offset += len(data)
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        with trio.CancelScope(shield=True):
            await dst.aclose()

    async def handle(client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream("127.0.0.1", target)
        flip = not flipped
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipe, client, server, flip)
            nursery.start_soon(pipe, server, client, False)

    async with trio.open_nursery() as nursery:
        while True:
            nursery.start_soon(handle, await listener.accept())


async def test_a_byte_altered_on_the_path_costs_one_connection_which_the_dialer_restores() -> None:
    port_a, port_b = _free_ports(2)
    received: list[NodeBatch] = []
    relay = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    relay_port = relay.socket.getsockname()[1]
    a = Transport(N1, {N2: ("127.0.0.1", relay_port)}, SECRET, lambda batch: None)  # n1 dials n2 via the relay
    b = Transport(N2, {N1: ("127.0.0.1", port_a)}, SECRET, received.append)
    hello = len(frame(cbor2.dumps([N1, b"p" * 32, MY_CHALLENGE])))  # the dialer's handshake bytes
    flipped: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_relay_flipping_one_byte, relay, port_b, hello + 4 + 8 + 2, flipped)
        await nursery.start(b.serve, "127.0.0.1", port_b)
        await nursery.start(a.serve, "127.0.0.1", port_a)
        with trio.fail_after(WAIT_S):
            while not received:
                a.send(NodeBatch(N1, N2, 0, ()))
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert flipped and b.stats.frames_forged == 1 and b.stats.frames_replayed == 0
    assert a.stats.connections_dialed >= 2  # the altered frame closed the first connection; n1 redialed
