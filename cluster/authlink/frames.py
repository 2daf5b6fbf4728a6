"""Sealed frames of an authenticated link: every frame after the handshake is encrypted and authenticated
(AES-256-GCM) and carries a sequence number.

What it is for: the handshake (handshake.py) proves both peers hold the cluster secret, but without more, anyone on
the path could read, alter, inject, replay or reorder the frames that follow (Raft messages: votes, appends,
commits; mirrored replicas' fetches and their records). Every frame is therefore sealed with a key only this
connection's two ends know, and a frame that does not open is dropped and closes the connection (the transports
count and log it). Both the queue Raft transport and the mirrored fetch transport use this.

How it works: `session_keys` derives the connection's key from the cluster secret, the protocol's label and both
handshake challenges (each side sent one fresh random challenge, so no two connections share a key and nothing
recorded from an older connection opens on a new one), then one key per direction (a frame cannot be reflected
back to its sender). `FrameSealer.seal(payload)` returns the wire frame: a 4-byte big-endian length, an 8-byte
sequence number (0, 1, 2... per direction), then the payload encrypted with AES-256-GCM under the direction's key
with the sequence number as nonce and as associated data, followed by the 16-byte GCM tag; the length counts all
but itself. A key never seals two frames with the same nonce (the sequence number only grows; a connection is
closed long before 2^64 frames). `FrameOpener.open(body)` (body = the frame without its length) decrypts and checks
the tag first, then that the sequence number is the next one expected: a bad tag is a forged or altered frame
(`FrameForged`); a good tag on an unexpected sequence number is a replayed or reordered one (`FrameReplayed`).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SEQ_BYTES = 8
TAG_BYTES = 16
OVERHEAD_BYTES = SEQ_BYTES + TAG_BYTES  # per frame, besides the 4-byte length
_NONCE_PAD = bytes(12 - SEQ_BYTES)
RAFT_KEY_LABEL = b"raftmq queue-raft frames v2"


class FrameAuthError(Exception):
    """A frame after the handshake did not authenticate; the connection must be closed."""


class FrameForged(FrameAuthError):
    """The tag does not match: the frame was forged, altered, or cut."""


class FrameReplayed(FrameAuthError):
    """The tag matches but the sequence number is not the next one: the frame was replayed or reordered."""


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """One connection's keys as seen from one end: `send` seals our frames, `receive` opens the peer's."""

    send: bytes
    receive: bytes


def session_keys(secret: bytes, listener_challenge: bytes, dialer_challenge: bytes, dialer: str, listener: str,
                 *, dialer_side: bool, label: bytes = RAFT_KEY_LABEL) -> SessionKeys:
    """The keys of the connection `dialer` opened to `listener` after a handshake with these challenges (`label`
    names the protocol, so two protocols never share a key)."""
    context = (label + b"\x00" + listener_challenge + dialer_challenge + dialer.encode() + b"\x00"
               + listener.encode())
    base = hmac.new(secret, context, hashlib.sha256).digest()
    to_listener = hmac.new(base, b"dialer->listener", hashlib.sha256).digest()
    to_dialer = hmac.new(base, b"listener->dialer", hashlib.sha256).digest()
    return SessionKeys(to_listener, to_dialer) if dialer_side else SessionKeys(to_dialer, to_listener)


class FrameSealer:
    """Seals outgoing frames of one direction of one connection (sequence numbers from 0)."""

    __slots__ = ("_aead", "seq")

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self.seq = 0

    def seal(self, payload: bytes) -> bytes:
        seq = self.seq.to_bytes(SEQ_BYTES, "big")
        self.seq += 1
        sealed = self._aead.encrypt(_NONCE_PAD + seq, payload, seq)
        return (len(sealed) + SEQ_BYTES).to_bytes(4, "big") + seq + sealed


class FrameOpener:
    """Opens incoming frames of one direction of one connection, in order."""

    __slots__ = ("_aead", "expected")

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self.expected = 0

    def open(self, body: bytes) -> bytes:
        """The payload of a frame (`body`: sequence number, sealed payload, tag); FrameAuthError if it does not
        open."""
        if len(body) < OVERHEAD_BYTES:
            raise FrameForged(f"frame of {len(body)} bytes is shorter than its sequence number and tag")
        seq_bytes = body[:SEQ_BYTES]
        try:
            payload = self._aead.decrypt(_NONCE_PAD + seq_bytes, body[SEQ_BYTES:], seq_bytes)
        except InvalidTag:
            raise FrameForged(f"frame {self.expected}: bad tag (forged or altered)") from None
        seq = int.from_bytes(seq_bytes, "big")
        if seq != self.expected:
            raise FrameReplayed(f"frame with sequence number {seq}, expected {self.expected} (replayed or reordered)")
        self.expected += 1
        return payload
