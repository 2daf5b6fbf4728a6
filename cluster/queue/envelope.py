"""One queue log entry, and its one codec: `Envelope(incarnation, origin, proposal_id, command)`.

What it is for: every entry a node writes into a queue's Raft group is an envelope. Its fields say which declaration
of the queue it belongs to (`incarnation`: a queue deleted and declared again gets a new one), which node proposed it
(`origin`), that node's number for it (`proposal_id`: a retry carries the same one, so a replica applies it once),
and the queue command itself. `EnvelopeCodec` is the only code that turns envelopes into bytes and back; the cluster
runtime hands it the entries Raft committed and gets envelopes, the broker gets those envelopes, and neither reads
an entry's bytes.

Bytes: `0xFF` (cbor's "break", never the first byte of an encoded item), the incarnation as 8 bytes big-endian, then
the proposal `[origin, proposal_id, kind, *fields]` of `replicated_codec` (where the command layouts live).
Incarnation 0 is written without the 9-byte frame, as before incarnations existed. Snapshots are framed the same way
(`frame_snapshot` / `open_snapshot`).

Messages are opaque here: the codec is built with the owner's payload codec (`encode_payload(message) -> cbor-able
value`, `decode_payload(value) -> message`; the broker's are in node/broker/replica_wire.py).

Decode once: the codec keeps the envelopes it encoded, keyed by their bytes (bounded by count and bytes, oldest out
first), and `read_batch` hands back that same object when the entry commits instead of decoding it; only entries of
the codec's own origin are looked up (their header is read first, a few bytes). Other nodes decode.

`read_batch` skips, and counts, entries of another incarnation than the group's (written into the group by an earlier
declaration of the queue) and entries that do not decode (every replica decodes the same bytes alike, so all skip
them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from cluster.queue.replicated_codec import (
    DecodePayload,
    EncodePayload,
    Proposal,
    ProposalDecodeError,
    decode_proposal,
    encode_proposal,
    peek_proposal,
)
from cluster.queue.seal import Seal
from cluster.queue.types import QueueCommand

FRAME_MARK: Final = b"\xff"
FRAME_BYTES: Final = 9
INCARNATION_MAX: Final = 2**64 - 1
PROPOSAL_IDS_PER_BOOT: Final = 1_000_000  # an origin numbers from boot_id * this: a restart never reuses an id
KEPT_MAX: Final = 4096
KEPT_BYTES_MAX: Final = 64 * 1024 * 1024


class EnvelopeDecodeError(ValueError):
    """The bytes are not an encoded envelope (the only exception `decode` raises)."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """One entry of a queue's log: `command` proposed by node `origin` as its `proposal_id`, for the queue's
    declaration `incarnation`."""

    incarnation: int
    origin: str
    proposal_id: int
    command: QueueCommand | Seal

    @property
    def proposal(self) -> Proposal:
        """What the replicated queue applies (it deduplicates on origin and proposal id)."""
        return Proposal(self.origin, self.proposal_id, self.command)


@dataclass(frozen=True, slots=True)
class EnvelopeBatch:
    """What `read_batch` made of one group's committed entries."""

    envelopes: list[Envelope]
    stale: int = 0  # entries of another incarnation, skipped
    undecodable: int = 0  # entries that do not decode, skipped


def frame_snapshot(incarnation: int, data: bytes) -> bytes:
    """A queue snapshot tagged with its incarnation (0 is left plain)."""
    return _frame(incarnation) + data if incarnation else data


def open_snapshot(data: bytes) -> tuple[int, bytes]:
    """(incarnation, snapshot) of what `frame_snapshot` wrote; plain data is incarnation 0."""
    incarnation = _incarnation_of(data)
    return incarnation, (data[FRAME_BYTES:] if data[:1] == FRAME_MARK and len(data) >= FRAME_BYTES else data)


def _frame(incarnation: int) -> bytes:
    if not 0 <= incarnation <= INCARNATION_MAX:
        raise ValueError(f"incarnation out of range: {incarnation}")
    return FRAME_MARK + incarnation.to_bytes(8, "big")


def _incarnation_of(data: bytes) -> int:
    if data[:1] == FRAME_MARK and len(data) >= FRAME_BYTES:
        return int.from_bytes(data[1:FRAME_BYTES], "big")
    return 0


@dataclass(slots=True)
class EnvelopeCodec:
    """Envelopes to entry bytes and back, for one node (`origin`), with its owner's payload codec."""

    origin: str
    encode_payload: EncodePayload
    decode_payload: DecodePayload
    kept_max: int = KEPT_MAX
    kept_bytes_max: int = KEPT_BYTES_MAX
    _kept: dict[bytes, Envelope] = field(default_factory=dict)
    _kept_bytes: int = 0

    def encode(self, envelope: Envelope) -> bytes:
        """The entry bytes; raises ValueError/TypeError for what `decode` would reject."""
        body = encode_proposal(envelope.proposal, self.encode_payload)
        data = _frame(envelope.incarnation) + body if envelope.incarnation else body
        if envelope.origin == self.origin:
            self._keep(data, envelope)
        return data

    def reframed(self, data: bytes, incarnation: int) -> bytes:
        """The same entry for another incarnation of its queue (a proposal that waited for the queue's next
        declaration); the envelope it was encoded from stays kept under the new bytes."""
        if _incarnation_of(data) == incarnation:
            return data
        body = data[FRAME_BYTES:] if data[:1] == FRAME_MARK and len(data) >= FRAME_BYTES else data
        new = _frame(incarnation) + body if incarnation else body
        kept = self._kept.pop(data, None)
        if kept is not None:
            self._kept_bytes -= len(data)
            self._keep(new, Envelope(incarnation, kept.origin, kept.proposal_id, kept.command))
        return new

    def decode(self, data: bytes) -> Envelope:
        """The envelope of entry bytes (this codec's own: the object it encoded, kept or not afterwards)."""
        incarnation = _incarnation_of(data)
        body = data[FRAME_BYTES:] if incarnation or data[:1] == FRAME_MARK else data
        try:
            proposal = decode_proposal(body, self.decode_payload)
        except ProposalDecodeError as exc:
            raise EnvelopeDecodeError(str(exc)) from None
        return Envelope(incarnation, proposal.origin, proposal.proposal_id, proposal.command)

    def read_batch(self, entries: Iterable[bytes], incarnation: int) -> EnvelopeBatch:
        """The envelopes of a group's committed entries, in order, for the queue's `incarnation` (see the header)."""
        out: list[Envelope] = []
        stale = undecodable = 0
        kept = self._kept
        for data in entries:
            if _incarnation_of(data) != incarnation:
                stale += 1
                continue
            if kept and self._own(data):
                envelope = kept.pop(data, None)
                if envelope is not None:
                    self._kept_bytes -= len(data)
                    out.append(envelope)
                    continue
            try:
                out.append(self.decode(data))
            except EnvelopeDecodeError:
                undecodable += 1
        return EnvelopeBatch(out, stale, undecodable)

    def _own(self, data: bytes) -> bool:
        start = FRAME_BYTES if data[:1] == FRAME_MARK else 0
        try:
            origin, _ = peek_proposal(memoryview(data)[start:])
        except ProposalDecodeError:
            return False
        return origin == self.origin

    def _keep(self, data: bytes, envelope: Envelope) -> None:
        size = len(data)
        if size > self.kept_bytes_max // 16:
            return
        kept = self._kept
        while kept and (len(kept) >= self.kept_max or self._kept_bytes + size > self.kept_bytes_max):
            oldest = next(iter(kept))
            del kept[oldest]
            self._kept_bytes -= len(oldest)
        if data not in kept:
            self._kept_bytes += size
        kept[data] = envelope
