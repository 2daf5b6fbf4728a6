"""The handshake and framing of an authenticated node-to-node link (trio): both sides prove the cluster secret, then
every frame is sealed (frames.py). One module for the queue Raft transport and the mirrored fetch transport.

What it is for: both transports (cluster/raft/runtime/transport.py, cluster/mirror_queues/runtime/transport.py)
open TCP connections between nodes that hold one cluster secret; this module is the one place that decides whether
the other end holds it and derives the connection's frame keys. A `LinkProtocol` names the protocol: its label is
part of every proof and key, so a proof or frame made for one protocol never opens the other.

How it works (the role is part of what is signed, so one side's proof cannot be reflected back as the other's):

    listener -> dialer    challenge_l (16 random bytes)
    dialer   -> listener  [dialer_id, hmac(secret, prefix + "dial" + challenge_l + dialer_id), challenge_d]
    listener -> dialer    [listener_id, hmac(secret, prefix + "accept" + challenge_d + listener_id)]

Handshake frames are length-prefixed (`frame`, `FrameReader`) and at most `HANDSHAKE_BYTES_MAX`, so an
unauthenticated stranger cannot make us buffer more than that, and the whole handshake must finish within
`HANDSHAKE_TIMEOUT_S`. `accept_link` (listener) refuses a dialer that `admit` rejects (an unknown id, or one the
caller's pairing rule says should not dial it) or whose proof is wrong; `dial_link` refuses a listener that is not
the peer it dialled or whose proof is wrong. Either raises `HandshakeRefused` for a proof that failed (callers count
those); a connection that closed or failed on the way gives None. Both return the connection's `SessionKeys`
(frames.py), from which each side builds its `FrameSealer` and `FrameOpener`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import cbor2
import trio

from cluster.authlink.frames import RAFT_KEY_LABEL, SessionKeys, session_keys

CHALLENGE_BYTES = 16
HANDSHAKE_BYTES_MAX = 1024
HANDSHAKE_TIMEOUT_S = 5.0
FRAME_BYTES_MAX = 64 * 1024 * 1024  # the default bound of `FrameReader.read`
log = logging.getLogger(__name__)


class FrameError(Exception):
    """A frame larger than allowed, or otherwise unusable: the connection is closed."""


class HandshakeRefused(Exception):
    """The other end did not prove the cluster secret (or is not who it should be)."""


@dataclass(frozen=True, slots=True)
class LinkProtocol:
    """One protocol on authenticated links: `proof_prefix` goes into every proof, `key_label` into every key."""

    name: str
    proof_prefix: bytes
    key_label: bytes

    def proof(self, secret: bytes, role: bytes, challenge: bytes, node_id: str) -> bytes:
        return hmac.new(secret, self.proof_prefix + role + challenge + node_id.encode(), hashlib.sha256).digest()


RAFT_LINK = LinkProtocol("queue-raft", b"", RAFT_KEY_LABEL)
MIRROR_LINK = LinkProtocol("mirror-fetch", b"mirror-", b"raftmq mirror-fetch frames v2")
_LINK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, FrameError, OSError)


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


class FrameReader:
    """Incremental reader of length-prefixed frames from a trio stream."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def read(self, size_max: int = FRAME_BYTES_MAX) -> bytes | None:
        while True:
            if len(self._buffer) >= 4:
                size = int.from_bytes(self._buffer[:4], "big")
                if size > size_max:
                    raise FrameError(f"frame of {size} bytes exceeds {size_max}")
                if len(self._buffer) >= 4 + size:
                    payload = bytes(self._buffer[4 : 4 + size])
                    del self._buffer[: 4 + size]
                    return payload
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                return None
            self._buffer += chunk


async def accept_link(protocol: LinkProtocol, secret: bytes, my_id: str, stream: trio.abc.Stream,
                      reader: FrameReader, admit: Callable[[str], bool]) -> tuple[str, SessionKeys] | None:
    """Listener side: (the authenticated dialer's id, the connection's keys); None if the connection closed or
    failed first (e.g. a peer's bare refusal probe); HandshakeRefused if the dialer did not prove the secret."""
    challenge = secrets.token_bytes(CHALLENGE_BYTES)
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            await stream.send_all(frame(challenge))
            hello = await reader.read(HANDSHAKE_BYTES_MAX)
            if hello is None:
                return None
            peer, theirs = _verify_hello(protocol, secret, hello, challenge, admit)
            proof = protocol.proof(secret, b"accept", theirs, my_id)
            await stream.send_all(frame(cbor2.dumps([my_id, proof])))
    except _LINK_ERRORS as error:
        log.debug("%s: inbound handshake failed: %r", protocol.name, error)
        return None
    return peer, session_keys(secret, challenge, theirs, peer, my_id, dialer_side=False, label=protocol.key_label)


def _verify_hello(protocol: LinkProtocol, secret: bytes, hello: bytes, challenge: bytes,
                  admit: Callable[[str], bool]) -> tuple[str, bytes]:
    try:
        node_id, proof, theirs = cbor2.loads(hello)
    except (cbor2.CBORDecodeError, ValueError, TypeError):
        raise HandshakeRefused("undecodable hello") from None
    if not (isinstance(node_id, str) and isinstance(proof, bytes) and isinstance(theirs, bytes)):
        raise HandshakeRefused("malformed hello")
    if len(theirs) != CHALLENGE_BYTES or not admit(node_id):
        raise HandshakeRefused(f"dialer {node_id!r} not admitted")
    if not hmac.compare_digest(proof, protocol.proof(secret, b"dial", challenge, node_id)):
        raise HandshakeRefused(f"dialer {node_id!r}: wrong proof")
    return node_id, theirs


async def dial_link(protocol: LinkProtocol, secret: bytes, my_id: str, peer: str, stream: trio.abc.Stream,
                    reader: FrameReader) -> SessionKeys | None:
    """Dialer side: the connection's keys once `peer` proved the secret; None if the connection closed or failed
    first (a listener that refuses our proof just closes); HandshakeRefused if the listener's proof is wrong."""
    mine = secrets.token_bytes(CHALLENGE_BYTES)
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            challenge = await reader.read(HANDSHAKE_BYTES_MAX)
            if challenge is None or len(challenge) != CHALLENGE_BYTES:
                return None  # closed (e.g. it refused our id) or not a raftmq peer
            await stream.send_all(frame(cbor2.dumps([my_id, protocol.proof(secret, b"dial", challenge, my_id),
                                                     mine])))
            reply = await reader.read(HANDSHAKE_BYTES_MAX)
    except _LINK_ERRORS as error:
        log.debug("%s: handshake with %s failed: %r", protocol.name, peer, error)
        return None
    if reply is None:
        return None  # the listener refused our proof
    try:
        node_id, proof = cbor2.loads(reply)
    except (cbor2.CBORDecodeError, ValueError, TypeError):
        raise HandshakeRefused(f"{peer}: undecodable reply") from None
    if node_id != peer or not isinstance(proof, bytes) or \
            not hmac.compare_digest(proof, protocol.proof(secret, b"accept", mine, peer)):
        raise HandshakeRefused(f"{peer}: wrong proof or identity")
    return session_keys(secret, challenge, mine, my_id, peer, dialer_side=True, label=protocol.key_label)
