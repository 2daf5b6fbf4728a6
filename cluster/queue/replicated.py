"""The queue machine as a replicated state machine: apply committed proposals once, snapshot and restore.

Every replica of a queue's Raft group feeds the committed entries, in log order, to `ReplicatedQueue.apply`. A
proposer retries until its own replica has applied its proposal, so the same `(origin, proposal_id)` may commit
twice; the second one is skipped (`apply` returns None). The machine itself is deterministic, so replicas that
apply the same log end in the same state and emit the same effects.

Dedup, per origin (deterministic, bounded):
- the ids of the last `window` proposals applied from that origin are remembered (in apply order), so a retry is
  skipped even when later ids of the same origin were applied in between, and ids need not arrive in order (an
  origin may number its proposals with one counter across many queues);
- `floor` is the highest id ever forgotten from the window: an id <= floor that is not remembered is treated as
  applied too (it was proposed before an id that has since been followed by `window` applications, far longer
  than any retry lasts); the alternative, applying it, could apply a command twice;
- at most `origins_max` origins are tracked, the least recently applied one is forgotten first (its later retries
  would be applied again: the machine's own publisher dedup still catches a retried Enqueue).
A proposal is recorded as applied before the machine runs, so a command the machine rejects with an exception
(a caller error) is recorded on every replica alike and the exception propagates.

The seal (cluster/queue/seal.py): a `Seal` proposal is recorded and sets `sealed`; a sealed replica refuses every
later proposal (`apply` returns None and records nothing: the log it came from is being replaced, and the proposer
sends it again to the new one). `sealed` travels in the snapshot; `snapshot(..., sealed=False)` is the seed of the
new log.

Snapshots are cbor: the machine's snapshot (args, name and all state; ids through `encode_id`) plus the dedup
tables in their LRU order, so a restored replica behaves exactly like one that applied the whole log.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Any, Final

import cbor2

from cluster.queue.machine import PUBLISHERS_MAX_DEFAULT, Queue
from cluster.queue.replicated_codec import (
    PROPOSAL_ID_MAX,
    DecodePayload,
    EncodePayload,
    Proposal,
    ProposalDecodeError,
    decode_id,
    decode_proposal,
    encode_id,
    encode_proposal,
    parse_queue_group_id,
    peek_proposal,
    queue_group_id,
)
from cluster.queue.seal import Seal
from cluster.queue.types import QueueArgs, QueueEffect

__all__ = [
    "Proposal",
    "ProposalDecodeError",
    "ReplicatedQueue",
    "SnapshotDecodeError",
    "decode_id",
    "decode_proposal",
    "encode_id",
    "encode_proposal",
    "parse_queue_group_id",
    "peek_proposal",
    "queue_group_id",
]

SNAPSHOT_VERSION: Final = 1
WINDOW_DEFAULT: Final = 4096
ORIGINS_MAX_DEFAULT: Final = 256
WINDOW_MAX: Final = 1 << 20  # 8 MiB of ids per origin: a sanity bound, also on restored snapshots
ORIGINS_MAX_LIMIT: Final = 1 << 16


class SnapshotDecodeError(ValueError):
    """The bytes are not a valid replicated queue snapshot (the only exception `restore` raises)."""


class _OriginWindow:
    """The recently applied proposal ids of one origin (see the module header).

    Compact on purpose (a node holds one per origin per queue): ids live in a ring of 8-byte slots in apply order.
    A fresh id (above every remembered one, the common case) is known unseen without a scan; an id at or below
    the highest remembered one is looked up by a byte search of the ring (a few microseconds for 4096 ids).
    """

    __slots__ = ("floor", "high", "ids", "next_slot")

    def __init__(self, floor: int = -1) -> None:
        self.floor = floor  # the highest id forgotten from the ring (-1: none)
        self.high = -1  # >= every id in the ring
        self.ids = array("Q")
        self.next_slot = 0  # once the ring is full: the slot of the oldest id

    def seen(self, proposal_id: int) -> bool:
        if proposal_id <= self.floor:
            return True
        return proposal_id <= self.high and _ring_holds(self.ids, proposal_id)

    def record(self, proposal_id: int, window: int) -> None:
        self.high = max(self.high, proposal_id)
        if len(self.ids) < window:
            self.ids.append(proposal_id)
            return
        slot = self.next_slot
        self.floor = max(self.floor, self.ids[slot])
        self.ids[slot] = proposal_id
        self.next_slot = (slot + 1) % window

    def in_apply_order(self) -> list[int]:
        slot = self.next_slot
        return self.ids[slot:].tolist() + self.ids[:slot].tolist()


class ReplicatedQueue:
    """One replica of a replicated queue: the `Queue` machine behind a dedup envelope."""

    __slots__ = ("_origins", "applied_count", "origins_max", "queue", "refused_count", "sealed", "skipped_count",
                 "window")

    def __init__(
        self,
        name: str,
        args: QueueArgs | None = None,
        window: int = WINDOW_DEFAULT,
        origins_max: int = ORIGINS_MAX_DEFAULT,
        publishers_max: int = PUBLISHERS_MAX_DEFAULT,
    ) -> None:
        if not 1 <= window <= WINDOW_MAX or not 1 <= origins_max <= ORIGINS_MAX_LIMIT:
            raise ValueError(f"window must be in 1..{WINDOW_MAX} and origins_max in 1..{ORIGINS_MAX_LIMIT}")
        self.queue = Queue(name, args, publishers_max, hold_dead_letters=True)
        self.window = window
        self.origins_max = origins_max
        self.applied_count = 0
        self.skipped_count = 0
        self.sealed = False  # a Seal was applied: every later proposal of this log is refused (seal.py)
        self.refused_count = 0
        self._origins: OrderedDict[str, _OriginWindow] = OrderedDict()  # least recently applied first

    @property
    def name(self) -> str:
        return self.queue.name

    @property
    def args(self) -> QueueArgs:
        return self.queue.args

    def seen(self, origin: str, proposal_id: int) -> bool:
        """Whether `apply` would skip this proposal as applied already (read-only)."""
        tracked = self._origins.get(origin)
        return tracked is not None and tracked.seen(proposal_id)

    def apply(self, proposal: Proposal) -> list[QueueEffect] | None:
        """Apply one committed proposal; None when this origin's proposal id was applied already, or when the
        replica is sealed (the proposal is then not recorded)."""
        if not 0 <= proposal.proposal_id <= PROPOSAL_ID_MAX:
            raise ValueError(f"proposal id out of range: {proposal.proposal_id}")
        if self.sealed:
            self.refused_count += 1
            return None
        tracked = self._origins.get(proposal.origin)
        if tracked is None:
            tracked = _OriginWindow()
            self._origins[proposal.origin] = tracked
            if len(self._origins) > self.origins_max:
                self._origins.popitem(last=False)
        elif tracked.seen(proposal.proposal_id):
            self.skipped_count += 1
            return None
        else:
            self._origins.move_to_end(proposal.origin)
        tracked.record(proposal.proposal_id, self.window)
        self.applied_count += 1
        command = proposal.command
        if isinstance(command, Seal):
            self.sealed = True
            return []
        return self.queue.apply(command)

    # --- snapshots ------------------------------------------------------------------------------------------

    def snapshot(self, encode_payload: EncodePayload, sealed: bool | None = None) -> bytes:
        """cbor bytes of the whole replica: machine state, args, dedup tables, counters; `sealed=False`: as if the
        seal were lifted (the seed of a new log, seal.py)."""
        state = {
            "version": SNAPSHOT_VERSION,
            "window": self.window,
            "origins_max": self.origins_max,
            "applied": self.applied_count,
            "skipped": self.skipped_count,
            "origins": [[origin, w.floor, _runs(w.in_apply_order())] for origin, w in self._origins.items()],
            "queue": self.queue.snapshot(encode_payload, encode_id),
        }
        if self.sealed if sealed is None else sealed:
            state["sealed"] = True  # (absent when not sealed: snapshots from before the seal stay as they were)
        return cbor2.dumps(state)

    @classmethod
    def restore(cls, data: bytes, decode_payload: DecodePayload) -> ReplicatedQueue:
        """Inverse of `snapshot`; raises SnapshotDecodeError (only) for anything malformed."""
        try:
            return cls._restore(cbor2.loads(data), decode_payload)
        except SnapshotDecodeError:
            raise
        except Exception as exc:  # malformed input can fail anywhere below; report one type
            raise SnapshotDecodeError(f"bad replicated queue snapshot: {exc!r:.200}") from exc

    @classmethod
    def _restore(cls, state: Any, decode_payload: DecodePayload) -> ReplicatedQueue:
        if not isinstance(state, dict) or state.get("version") != SNAPSHOT_VERSION:
            raise SnapshotDecodeError("not a replicated queue snapshot of a known version")
        queue = Queue.restore(state["queue"], decode_payload, decode_id)
        queue.hold_dead_letters = True
        replica = cls(queue.name, queue.args, state["window"], state["origins_max"], queue.publishers_max)
        replica.queue = queue
        replica.applied_count = _count(state["applied"])
        replica.skipped_count = _count(state["skipped"])
        replica.sealed = state.get("sealed", False) is True
        for origin, floor, runs in state["origins"]:
            if not isinstance(origin, str) or type(floor) is not int or not -1 <= floor <= PROPOSAL_ID_MAX:
                raise SnapshotDecodeError("bad dedup table")
            tracked = _OriginWindow(floor)
            for proposal_id in _ids_from_runs(runs, replica.window):
                tracked.record(proposal_id, replica.window)
            replica._origins[origin] = tracked
        if len(replica._origins) > replica.origins_max:
            raise SnapshotDecodeError("more origins than origins_max")
        return replica


def _ring_holds(ids: array[int], proposal_id: int) -> bool:
    """`proposal_id in ids`, as a byte search (`in` on an array boxes every element: ~25x slower)."""
    data = ids.tobytes()
    needle = array("Q", (proposal_id,)).tobytes()
    start = data.find(needle)
    while start >= 0:
        if start % ids.itemsize == 0:
            return True
        start = data.find(needle, start + 1)
    return False


def _runs(ids: list[int]) -> list[list[int]]:
    """Ids in apply order as [first, length] runs of consecutive ids (one run when an origin counts per queue)."""
    runs: list[list[int]] = []
    for proposal_id in ids:
        if runs and runs[-1][0] + runs[-1][1] == proposal_id:
            runs[-1][1] += 1
        else:
            runs.append([proposal_id, 1])
    return runs


def _ids_from_runs(runs: Any, window: int) -> list[int]:
    if not isinstance(runs, list):
        raise SnapshotDecodeError("bad dedup runs")
    ids: list[int] = []
    for run in runs:
        if not isinstance(run, list) or len(run) != 2:
            raise SnapshotDecodeError("bad dedup run")
        first, length = _count(run[0]), _count(run[1])
        if len(ids) + length > window or first + length - 1 > PROPOSAL_ID_MAX:
            raise SnapshotDecodeError("dedup run out of range")
        ids.extend(range(first, first + length))
    return ids


def _count(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise SnapshotDecodeError(f"expected a non-negative int, got {value!r:.80}")
    return value
