"""The fetch transport between mirrored-queue processes: trio TCP, authenticated like the queue Raft transport.

What it is for: followers send fetch and epoch-end requests to their leader and get the responses back; the
harness's controller and clients use the same links for their control messages (wire.py). Every frame is
authenticated with the cluster secret, so nobody on the path can inject a fetch response (which a follower would
append) or an ISR change.

How it works: one connection per direction. `send(dst, message)` queues the message for `dst` (a bounded queue;
when full the message is dropped: fetches are retried by the follower's poll, and a lost reply only delays it) and
a dialer task keeps a connection to `dst` open, writing that queue; a connection accepted from a peer is only read.
A request's reply therefore travels on the replier's own connection to the requester. The handshake and the frame
sealing are the shared ones of cluster/authlink (`MIRROR_LINK`: its own label, so a proof or frame made for the
queue Raft transport never opens here): both sides prove the cluster secret, and every frame after it is encrypted
and authenticated (AES-256-GCM, per-connection and per-direction keys, sequence numbers). The listener refuses an
unknown id or a wrong proof; the dialer refuses a listener that is not the peer it dialled. A forged, altered,
replayed or undecodable frame is counted and closes the connection. A lost connection is redialled with backoff (50 ms doubling to 1 s).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import trio

from cluster.authlink.frames import FrameAuthError, FrameOpener, FrameSealer
from cluster.authlink.handshake import (
    MIRROR_LINK,
    FrameError,
    FrameReader,
    HandshakeRefused,
    accept_link,
    dial_link,
)
from cluster.mirror_queues.runtime.wire import WireError, WireMessage, decode, encode

log = logging.getLogger(__name__)

FRAME_BYTES_MAX = 16 * 1024 * 1024
QUEUE_MAX = 1024
BACKOFF_S_MIN = 0.05
BACKOFF_S_MAX = 1.0
_LINK_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


@dataclass(slots=True)
class TransportStats:
    sent: int = 0
    received: int = 0
    dropped: int = 0  # queue full
    auth_failures: int = 0  # handshakes refused
    frames_rejected: int = 0  # forged, replayed or undecodable frames after the handshake


class MirrorTransport:
    def __init__(self, node_id: str, secret: bytes, peers: dict[str, tuple[str, int]],
                 on_message: Callable[[str, WireMessage], None]) -> None:
        self.node_id = node_id
        self.peers = dict(peers)
        self._secret = secret
        self._on_message = on_message
        self._queues: dict[str, tuple[trio.MemorySendChannel[bytes], trio.MemoryReceiveChannel[bytes]]] = {}
        self._nursery: trio.Nursery | None = None
        self.stats = TransportStats()

    async def serve(self, host: str, port: int, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(partial(trio.serve_tcp, self._handle_inbound, port, host=host))
            task_status.started()

    def send(self, dst: str, message: WireMessage) -> None:
        if dst not in self.peers or self._nursery is None:
            self.stats.dropped += 1
            return
        if dst not in self._queues:
            self._queues[dst] = trio.open_memory_channel[bytes](QUEUE_MAX)
            self._nursery.start_soon(self._dial_forever, dst)
        try:
            self._queues[dst][0].send_nowait(encode(message))
        except trio.WouldBlock:
            self.stats.dropped += 1

    # --- dialer: writes -----------------------------------------------------------------------------------------

    async def _dial_forever(self, peer: str) -> None:
        host, port = self.peers[peer]
        outbox = self._queues[peer][1]
        backoff_s = BACKOFF_S_MIN
        while True:
            try:
                stream = await trio.open_tcp_stream(host, port)
            except OSError as error:
                log.debug("dial %s failed: %r", peer, error)
            else:
                async with stream:
                    sealer = await self._dialer_handshake(peer, stream)
                    if sealer is not None:
                        backoff_s = BACKOFF_S_MIN
                        try:
                            async for payload in outbox:
                                await stream.send_all(sealer.seal(payload))
                                self.stats.sent += 1
                        except _LINK_ERRORS as error:
                            log.debug("link to %s lost: %r", peer, error)
            await trio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, BACKOFF_S_MAX)

    async def _dialer_handshake(self, peer: str, stream: trio.SocketStream) -> FrameSealer | None:
        try:
            keys = await dial_link(MIRROR_LINK, self._secret, self.node_id, peer, stream, FrameReader(stream))
        except HandshakeRefused as refusal:
            self.stats.auth_failures += 1
            log.info("link to %s refused: %s", peer, refusal)
            return None
        return None if keys is None else FrameSealer(keys.send)

    # --- listener: reads ----------------------------------------------------------------------------------------

    async def _handle_inbound(self, stream: trio.SocketStream) -> None:
        async with stream:
            reader = FrameReader(stream)
            try:
                accepted = await accept_link(MIRROR_LINK, self._secret, self.node_id, stream, reader,
                                             self.peers.__contains__)
            except HandshakeRefused as refusal:
                self.stats.auth_failures += 1
                log.info("inbound link refused: %s", refusal)
                return
            if accepted is None:
                return
            peer, keys = accepted
            opener = FrameOpener(keys.receive)
            try:
                while True:
                    body = await reader.read(FRAME_BYTES_MAX)
                    if body is None:
                        return
                    message = decode(opener.open(body))
                    self.stats.received += 1
                    self._on_message(peer, message)
            except (FrameAuthError, FrameError, WireError) as error:
                self.stats.frames_rejected += 1
                log.warning("closing the link from %s: frame dropped: %s", peer, error)
            except _LINK_ERRORS as error:
                log.debug("inbound link failed: %r", error)
