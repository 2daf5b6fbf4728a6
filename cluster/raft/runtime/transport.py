"""Node-to-node transport over trio TCP: length-prefixed cbor2 frames, HMAC-authenticated, bounded, reconnecting.

Each node dials every peer once and keeps that connection for all of its groups' traffic to the peer (so a pair of
nodes shares two TCP connections, one per direction). On connect the listener sends a random 16-byte challenge;
the dialer answers with a frame `[node_id, hmac_sha256(secret, challenge + node_id)]`; a wrong answer closes the
connection, and so does a batch whose source is not the authenticated node. After that the dialer sends frames: a 4-byte big-endian length, then `encode_batch` bytes. Frames
beyond `FRAME_BYTES_MAX` close the connection. Outgoing batches wait in a per-peer channel of `queue_batches_max`;
when it is full the batch is dropped (Raft retries; a slow peer must not grow our memory). A lost connection is
redialled with exponential backoff (50 ms doubling to 2 s).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import cbor2
import trio

from cluster.raft.core.multiraft import NodeBatch
from cluster.raft.core.types import NodeId
from cluster.raft.runtime.codec import CodecError, decode_batch, encode_batch

FRAME_BYTES_MAX = 64 * 1024 * 1024
CHALLENGE_BYTES = 16
HANDSHAKE_TIMEOUT_S = 5.0
BACKOFF_S_MIN = 0.05
BACKOFF_S_MAX = 2.0
log = logging.getLogger(__name__)


class FrameError(Exception):
    pass


@dataclass
class TransportStats:
    batches_sent: int = 0
    batches_received: int = 0
    batches_dropped: int = 0
    auth_failures: int = 0


def _proof(secret: bytes, challenge: bytes, node_id: str) -> bytes:
    return hmac.new(secret, challenge + node_id.encode(), hashlib.sha256).digest()


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


class FrameReader:
    """Incremental reader of length-prefixed frames from a trio stream."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def read(self) -> bytes | None:
        while True:
            if len(self._buffer) >= 4:
                size = int.from_bytes(self._buffer[:4], "big")
                if size > FRAME_BYTES_MAX:
                    raise FrameError(f"frame of {size} bytes exceeds {FRAME_BYTES_MAX}")
                if len(self._buffer) >= 4 + size:
                    payload = bytes(self._buffer[4 : 4 + size])
                    del self._buffer[: 4 + size]
                    return payload
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                return None
            self._buffer += chunk


class Transport:
    def __init__(
        self,
        node_id: NodeId,
        peers: dict[NodeId, tuple[str, int]],
        secret: bytes,
        on_batch: Callable[[NodeBatch], None],
        queue_batches_max: int = 1024,
    ) -> None:
        self.node_id = node_id
        self.peers = peers
        self._secret = secret
        self._on_batch = on_batch
        self.stats = TransportStats()
        self._channels: dict[NodeId, tuple[trio.MemorySendChannel[bytes], trio.MemoryReceiveChannel[bytes]]] = {
            peer: trio.open_memory_channel[bytes](queue_batches_max) for peer in peers
        }

    def send(self, batch: NodeBatch) -> None:
        """Queue a batch for its peer; drop it if the peer's queue is full (never blocks)."""
        channel = self._channels.get(batch.dst)
        if channel is None:
            return
        try:
            channel[0].send_nowait(encode_batch(batch))
        except trio.WouldBlock:
            self.stats.batches_dropped += 1

    async def serve(self, host: str, port: int, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, self._handle_inbound, port, host=host))
            for peer in self.peers:
                nursery.start_soon(self._dial_forever, peer)
            task_status.started()

    async def _handle_inbound(self, stream: trio.SocketStream) -> None:
        async with stream:
            reader = FrameReader(stream)
            challenge = secrets.token_bytes(CHALLENGE_BYTES)
            try:
                await stream.send_all(frame(challenge))
                with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                    hello = await reader.read()
                peer = self._verify(hello, challenge) if hello is not None else None
                if peer is None:
                    self.stats.auth_failures += 1
                    return
                while (payload := await reader.read()) is not None:
                    batch = decode_batch(payload)
                    if batch.src != peer or batch.dst != self.node_id:
                        raise FrameError(f"batch {batch.src}->{batch.dst} on {peer}'s connection")
                    self.stats.batches_received += 1
                    self._on_batch(batch)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, FrameError,
                    CodecError) as error:
                log.debug("inbound connection closed: %r", error)

    def _verify(self, hello: bytes, challenge: bytes) -> str | None:
        """The authenticated peer's node id, or None."""
        try:
            node_id, proof = cbor2.loads(hello)
        except (cbor2.CBORDecodeError, ValueError, TypeError):
            return None
        if not isinstance(node_id, str) or not isinstance(proof, bytes):
            return None
        return node_id if hmac.compare_digest(proof, _proof(self._secret, challenge, node_id)) else None

    async def _dial_forever(self, peer: NodeId) -> None:
        host, port = self.peers[peer]
        receive = self._channels[peer][1]
        backoff_s = BACKOFF_S_MIN
        while True:
            try:
                stream = await trio.open_tcp_stream(host, port)
            except OSError:
                await trio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, BACKOFF_S_MAX)
                continue
            backoff_s = BACKOFF_S_MIN
            async with stream:
                try:
                    await self._send_loop(stream, receive)
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, FrameError,
                        OSError) as error:
                    log.debug("connection to %s lost: %r", peer, error)
            await trio.sleep(backoff_s)

    async def _send_loop(self, stream: trio.SocketStream, receive: trio.MemoryReceiveChannel[bytes]) -> None:
        reader = FrameReader(stream)
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            challenge = await reader.read()
        if challenge is None:
            return
        await stream.send_all(frame(cbor2.dumps([self.node_id, _proof(self._secret, challenge, self.node_id)])))
        while True:
            payload = await receive.receive()
            chunks = [frame(payload)]
            while len(chunks) < 256:  # coalesce what is already queued into one write
                try:
                    chunks.append(frame(receive.receive_nowait()))
                except trio.WouldBlock:
                    break
            with trio.CancelScope(shield=True):  # never leave half a frame on the wire
                await stream.send_all(b"".join(chunks))
            self.stats.batches_sent += len(chunks)
