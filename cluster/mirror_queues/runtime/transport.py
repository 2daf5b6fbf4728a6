"""The fetch transport between mirrored-queue processes: trio TCP, authenticated like the queue Raft transport.

What it is for: followers send fetch and epoch-end requests to their leader and get the responses back; the
harness's controller and clients use the same links for their control messages (wire.py). Every frame is
authenticated with the cluster secret, so nobody on the path can inject a fetch response (which a follower would
append) or an ISR change.

How it works: one connection per direction. `send(dst, message)` queues the message for `dst` (a bounded queue;
when full the message is dropped: fetches are retried by the follower's poll, and a lost reply only delays it) and
a dialer task keeps a connection to `dst` open, writing that queue; a connection accepted from a peer is only read.
A request's reply therefore travels on the replier's own connection to the requester. The handshake is the Raft
transport's (cluster/raft/runtime/transport.py) with this protocol's own labels, so a proof made for one protocol
never opens the other:

    listener -> dialer    challenge_l (16 random bytes)
    dialer   -> listener  [dialer_id, hmac(secret, "mirror-dial" + challenge_l + dialer_id), challenge_d]
    listener -> dialer    [listener_id, hmac(secret, "mirror-accept" + challenge_d + listener_id)]

The listener refuses an unknown id or a wrong proof; the dialer refuses a listener that is not the peer it dialled.
After it, frames are sealed and opened by cluster/raft/runtime/frame_auth.py (HMAC-SHA256 per frame under
per-connection, per-direction keys, with sequence numbers): a forged, altered, replayed or undecodable frame is
counted and closes the connection. A lost connection is redialled with backoff (50 ms doubling to 1 s).
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

from cluster.mirror_queues.runtime.wire import WireError, WireMessage, decode, encode
from cluster.raft.runtime.frame_auth import FrameAuthError, FrameOpener, FrameSealer, session_keys
from cluster.raft.runtime.transport import FrameError, FrameReader, frame

log = logging.getLogger(__name__)

CHALLENGE_BYTES = 16
HANDSHAKE_BYTES_MAX = 1024
HANDSHAKE_TIMEOUT_S = 5.0
FRAME_BYTES_MAX = 16 * 1024 * 1024
QUEUE_MAX = 1024
BACKOFF_S_MIN = 0.05
BACKOFF_S_MAX = 1.0
_LINK_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


def _proof(secret: bytes, role: bytes, challenge: bytes, node_id: str) -> bytes:
    return hmac.new(secret, b"mirror-" + role + challenge + node_id.encode(), hashlib.sha256).digest()


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
        reader = FrameReader(stream)
        mine = secrets.token_bytes(CHALLENGE_BYTES)
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                challenge = await reader.read(HANDSHAKE_BYTES_MAX)
                if challenge is None or len(challenge) != CHALLENGE_BYTES:
                    return None
                proof = _proof(self._secret, b"dial", challenge, self.node_id)
                await stream.send_all(frame(cbor2.dumps([self.node_id, proof, mine])))
                reply = await reader.read(HANDSHAKE_BYTES_MAX)
        except _LINK_ERRORS as error:
            log.debug("handshake with %s failed: %r", peer, error)
            return None
        try:
            node_id, their_proof = cbor2.loads(reply) if reply is not None else (None, b"")
        except (cbor2.CBORDecodeError, ValueError, TypeError):
            node_id, their_proof = None, b""
        if node_id != peer or not isinstance(their_proof, bytes) or not hmac.compare_digest(
                their_proof, _proof(self._secret, b"accept", mine, peer)):
            self.stats.auth_failures += 1
            return None
        keys = session_keys(self._secret, challenge, mine, self.node_id, peer, dialer_side=True)
        return FrameSealer(keys.send)

    # --- listener: reads ----------------------------------------------------------------------------------------

    async def _handle_inbound(self, stream: trio.SocketStream) -> None:
        async with stream:
            reader = FrameReader(stream)
            challenge = secrets.token_bytes(CHALLENGE_BYTES)
            try:
                with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                    await stream.send_all(frame(challenge))
                    hello = await reader.read(HANDSHAKE_BYTES_MAX)
                    if hello is None:
                        return
                    verified = self._verify_hello(hello, challenge)
                    if verified is None:
                        self.stats.auth_failures += 1
                        return
                    peer, theirs = verified
                    await stream.send_all(frame(cbor2.dumps([self.node_id,
                                                             _proof(self._secret, b"accept", theirs, self.node_id)])))
                keys = session_keys(self._secret, challenge, theirs, peer, self.node_id, dialer_side=False)
                opener = FrameOpener(keys.receive)
                while True:
                    body = await reader.read(FRAME_BYTES_MAX)
                    if body is None:
                        return
                    message = decode(opener.open(body))
                    self.stats.received += 1
                    self._on_message(peer, message)
            except (FrameAuthError, FrameError, WireError) as error:
                self.stats.frames_rejected += 1
                log.warning("closing the link from a peer: %s", error)
            except _LINK_ERRORS as error:
                log.debug("inbound link failed: %r", error)

    def _verify_hello(self, hello: bytes, challenge: bytes) -> tuple[str, bytes] | None:
        try:
            node_id, proof, theirs = cbor2.loads(hello)
        except (cbor2.CBORDecodeError, ValueError, TypeError):
            return None
        if not (isinstance(node_id, str) and isinstance(proof, bytes) and isinstance(theirs, bytes)):
            return None
        if node_id not in self.peers or len(theirs) != CHALLENGE_BYTES:
            return None
        if not hmac.compare_digest(proof, _proof(self._secret, b"dial", challenge, node_id)):
            return None
        return node_id, theirs
