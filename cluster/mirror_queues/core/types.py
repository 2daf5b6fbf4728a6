"""Settings, log records, replica-to-replica messages and effects of the mirrored-queue core (all frozen).

Offsets count from 0; a log end offset (LEO) is the offset the next record will get. The high watermark (HW) is
the first offset not yet committed: consumers read only offsets below it. The log start offset is the first
offset still held as a record; everything below it is a `Snapshot` of the host's state machine (the host's bytes,
opaque to the core), taken at an offset the host had applied (at most the HW).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Truncation = Literal["leader-epoch", "leader-epoch-v0", "hw"]
Flush = Literal["fsync", "unsynced"]
Promote = Literal["always", "when-synced"]


@dataclass(frozen=True, slots=True)
class Settings:
    """`truncation`: how a replica that becomes a follower finds where its log agrees with the leader's.
    `leader-epoch` is KIP-101 with KIP-279 (the reply names its epoch; repeat until the epochs agree);
    `leader-epoch-v0` is KIP-101 alone (one round, the reply is a bare offset; unsafe under fast failover);
    `hw` truncates to the replica's HW (its checkpoint after a restart), as Kafka before 0.11 (unsafe).
    `flush`: `fsync` makes every append durable at once; `unsynced` keeps appends in the page cache until
    `Replica.flush()` (the host's writeback), so a crash loses them.
    `promote_on_failure`: `always` lets the controller elect a replica outside the ISR (unclean election).
    `eligible_leader_replicas`: KIP-966's rules (replicas dropped while the ISR is below `min_insync` stay
    electable; a replica that restarts after a crash with unsynced flush leaves the ISR until it catches up, and
    is elected only when every candidate is in that state, then the one with the largest last epoch and LEO)."""

    min_insync: int = 1
    replica_lag_max_ms: int = 10_000
    hw_checkpoint_interval_ms: int = 5_000
    truncation: Truncation = "leader-epoch"
    flush: Flush = "fsync"
    promote_on_failure: Promote = "when-synced"
    eligible_leader_replicas: bool = True
    fetch_max_records: int = 100


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    epoch: int
    msg: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The host's state machine after applying every record below `offset` (the log start); `epoch` is the
    epoch of the record at `offset - 1`; `data` is the host's, opaque here."""

    offset: int
    epoch: int
    data: str


# --- messages between replicas -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchRequest:
    src: str
    epoch: int  # the leader epoch the follower believes current
    fetch_offset: int  # the follower's LEO


@dataclass(frozen=True, slots=True)
class FetchResponse:
    src: str
    epoch: int
    records: tuple[Record, ...]
    leader_hw: int
    out_of_range: bool = False  # fetch_offset was beyond the leader's LEO
    leader_leo: int = 0
    snapshot: Snapshot | None = None  # fetch_offset was below the leader's log start: start from this


@dataclass(frozen=True, slots=True)
class EpochEndRequest:
    """OffsetsForLeaderEpoch: where does `requested_epoch` end in the leader's log?"""

    src: str
    epoch: int
    requested_epoch: int


@dataclass(frozen=True, slots=True)
class EpochEndResponse:
    """`end_epoch` is the largest epoch <= the requested one the leader knows (-1: none; v0 replies leave it -1
    and give only the offset); `end_offset` the first offset after it in the leader's log."""

    src: str
    epoch: int
    end_epoch: int
    end_offset: int


Message = FetchRequest | FetchResponse | EpochEndRequest | EpochEndResponse


# --- effects -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    dst: str
    message: Message


@dataclass(frozen=True, slots=True)
class Confirmed:
    msg: str
    offset: int


@dataclass(frozen=True, slots=True)
class Nacked:
    """The publish may or may not survive (as an AMQP nack): `not-enough-replicas` before the append means it
    was never appended; `isr-below-min` after it means it stays in the log and may still become visible."""

    msg: str
    reason: str


@dataclass(frozen=True, slots=True)
class IsrChanged:
    """The leader asks the controller to record a new ISR for its epoch."""

    leader: str
    epoch: int
    isr: frozenset[str]


@dataclass(frozen=True, slots=True)
class Truncated:
    replica: str
    from_leo: int
    to_leo: int
    how: str


@dataclass(frozen=True, slots=True)
class SnapshotInstalled:
    """A follower replaced its log with the leader's snapshot: the host restores its state machine from it and
    applies the records from `snapshot.offset` on."""

    replica: str
    snapshot: Snapshot


Effect = Send | Confirmed | Nacked | IsrChanged | Truncated | SnapshotInstalled
