"""Per-frame authentication of the queue Raft transport: an HMAC-SHA256 tag and a sequence number on every frame.

What it is for: the transport's handshake proves both peers hold the cluster secret, but without more, anyone on
the path could alter, inject, replay or reorder the frames that follow (Raft messages: votes, appends, commits).
Every frame after the handshake is therefore sealed with a key only this connection's two ends know, and a frame
that does not open is dropped and closes the connection (transport.py counts and logs it). Frames are
authenticated, not encrypted: someone on the path can still read queue contents and Raft metadata.

How it works: `session_keys` derives the connection's key from the cluster secret and both handshake challenges
(each side sent one fresh random challenge, so no two connections share a key and nothing recorded from an older
connection opens on a new one), then one key per direction (a frame cannot be reflected back to its sender).
`FrameSealer.seal(payload)` returns the wire frame: a 4-byte big-endian length, an 8-byte sequence number (0, 1,
2... per direction), the payload, and HMAC-SHA256(direction key, sequence + payload) (32 bytes); the length counts
all but itself. `FrameOpener.open(body)` (body = the frame without its length) checks the tag first, then that the
sequence number is the next one expected: a bad tag is a forged or altered frame (`FrameForged`); a good tag on an
unexpected sequence number is a replayed or reordered one (`FrameReplayed`). Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

SEQ_BYTES = 8
TAG_BYTES = 32
OVERHEAD_BYTES = SEQ_BYTES + TAG_BYTES  # per frame, besides the 4-byte length
_KEY_LABEL = b"raftmq queue-raft frames v1"


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
                 *, dialer_side: bool) -> SessionKeys:
    """The keys of the connection `dialer` opened to `listener` after a handshake with these challenges."""
    context = (_KEY_LABEL + listener_challenge + dialer_challenge + dialer.encode() + b"\x00" + listener.encode())
    base = hmac.new(secret, context, hashlib.sha256).digest()
    to_listener = hmac.new(base, b"dialer->listener", hashlib.sha256).digest()
    to_dialer = hmac.new(base, b"listener->dialer", hashlib.sha256).digest()
    return SessionKeys(to_listener, to_dialer) if dialer_side else SessionKeys(to_dialer, to_listener)


class FrameSealer:
    """Seals outgoing frames of one direction of one connection (sequence numbers from 0)."""

    __slots__ = ("_mac", "seq")

    def __init__(self, key: bytes) -> None:
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self.seq = 0

    def seal(self, payload: bytes) -> bytes:
        seq = self.seq.to_bytes(SEQ_BYTES, "big")
        self.seq += 1
        mac = self._mac.copy()
        mac.update(seq)
        mac.update(payload)
        return (len(payload) + OVERHEAD_BYTES).to_bytes(4, "big") + seq + payload + mac.digest()


class FrameOpener:
    """Opens incoming frames of one direction of one connection, in order."""

    __slots__ = ("_mac", "expected")

    def __init__(self, key: bytes) -> None:
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self.expected = 0

    def open(self, body: bytes) -> bytes:
        """The payload of a frame (`body`: sequence number, payload, tag); FrameAuthError if it does not open."""
        if len(body) < OVERHEAD_BYTES:
            raise FrameForged(f"frame of {len(body)} bytes is shorter than its sequence number and tag")
        mac = self._mac.copy()
        mac.update(body[:-TAG_BYTES])
        if not hmac.compare_digest(mac.digest(), body[-TAG_BYTES:]):
            raise FrameForged(f"frame {self.expected}: bad tag (forged or altered)")
        seq = int.from_bytes(body[:SEQ_BYTES], "big")
        if seq != self.expected:
            raise FrameReplayed(f"frame with sequence number {seq}, expected {self.expected} (replayed or reordered)")
        self.expected += 1
        return body[SEQ_BYTES:-TAG_BYTES]
