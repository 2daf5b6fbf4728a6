"""Bookkeeping of cluster mode that needs no I/O: proposals in flight and peer liveness.

What it is for: `ProposalTracker` remembers every queue command this node proposed until its own replica applied
it (the runtime reports that with `applied(proposal_id)` from the Raft apply callback). It says when to send again
(`groups_due`: `retry_ms` after the last send, because a forwarded proposal may have been dropped; the runtime also
sends a group's proposals again at once when its leader changes) and when to give up (`timeout_ms`). While the
leader stays the same, each timer resend (`retried`) doubles the group's interval, up to `retry_ms *
retry_backoff_max`: resending every pending proposal at a fixed pace to a leader that is merely slow adds duplicates
faster than they commit (a livelock, docs/raft.md); `leader_changed` and an emptied group go back to `retry_ms`. A group's proposals are always (re)sent together, oldest first, so a retry never
puts a later proposal of a queue into the log ahead of an earlier one. At most `pending_max` proposals wait.

Sending in order is not enough for every command: a copy sent earlier can be lost (a forward dropped with its
connection, a command held while no leader was known and then overtaken by a fresh one in the Raft router) and
commit after a later one. For most commands that is harmless; a `Detach` is not: committed before the `Settle` of an
ack its consumer sent first, it returns the acked message to the queue (redelivered to another consumer, which
RabbitMQ never does once the ack arrived before the channel closed). So a proposal marked `barrier` (the runtime
marks every Detach) is held back, unsent, until every earlier proposal of its group is applied by this node's
replica or given up (`sendable`); only then does it enter the log, necessarily after them.

`PeerLiveness` turns "which peers are connected now" samples into down/up transitions after `down_after_ms`, or at
once for a peer the transport reports refusing connections (its process is gone: docs/cluster.md, "Liveness").
Both take time as `now_ms` arguments, so they are unit-tested without clocks.

Queue incarnations: `stale_groups` says which local groups to delete at start: those the node recorded (group ->
incarnation, persisted by the runtime) that the metadata no longer has, or has under another incarnation. How an
entry carries its incarnation is `cluster.queue.envelope`'s business (the one owner of a queue log entry's bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cluster.queue.envelope import PROPOSAL_IDS_PER_BOOT as PROPOSAL_IDS_PER_BOOT
from cluster.queue.envelope import Envelope

PENDING_MAX = 100_000


def incarnation_of_cid(cid: str) -> int:
    """A declaration's incarnation from its command id (a uuid's hex): 63 bits of it, never 0."""
    try:
        value = int(cid[:16], 16) & (2**63 - 1)
    except ValueError:
        value = 0
    return value or 1


def stale_groups(recorded: Mapping[str, int], wanted: Mapping[str, int]) -> list[str]:
    """Local groups to delete: recorded here under an incarnation the metadata does not have (anymore)."""
    return sorted(g for g, incarnation in recorded.items() if wanted.get(g) != incarnation)


@dataclass(slots=True)
class Pending:
    """One proposal in flight."""

    proposal_id: int
    group: str
    vhost: str
    queue: str
    data: bytes
    first_ms: int
    sent_ms: int | None = None  # None: never handed to Raft (its group was not running yet, or a held barrier)
    barrier: bool = False  # sent only once every earlier proposal of the group was applied (or given up)
    envelope: Envelope | None = None  # what `data` encodes (the runtime hands it back when it gives up)


@dataclass(slots=True)
class ProposalTracker:
    """Proposals in flight, per group in id order."""

    first_id: int
    retry_ms: int = 500
    timeout_ms: int = 10_000
    pending_max: int = PENDING_MAX
    _next_id: int = 0
    _by_id: dict[int, Pending] = field(default_factory=dict)
    _by_group: dict[str, dict[int, Pending]] = field(default_factory=dict)  # insertion (= id) order
    _barriers: dict[str, int] = field(default_factory=dict)  # group -> barriers it tracks (count)
    retry_backoff_max: int = 8  # the resend interval grows to retry_ms * this while the leader is unchanged
    _retries: dict[str, int] = field(default_factory=dict)  # group -> timer resends since its leader changed

    def __post_init__(self) -> None:
        self._next_id = self.first_id

    def __len__(self) -> int:
        return len(self._by_id)

    def next_id(self) -> int:
        proposal_id = self._next_id
        self._next_id += 1
        return proposal_id

    def peek_id(self) -> int:
        """The id the next proposal will get (proposals from then on have ids >= it); ids numbered elsewhere (the
        broker numbers its own) move it past every id added."""
        return self._next_id

    def full(self) -> bool:
        return len(self._by_id) >= self.pending_max

    def add(self, pending: Pending) -> None:
        if pending.proposal_id >= self._next_id:
            self._next_id = pending.proposal_id + 1
        self._by_id[pending.proposal_id] = pending
        self._by_group.setdefault(pending.group, {})[pending.proposal_id] = pending
        if pending.barrier:
            self._barriers[pending.group] = self._barriers.get(pending.group, 0) + 1

    def applied(self, proposal_id: int) -> Pending | None:
        """This node's replica applied the proposal: stop tracking it."""
        pending = self._by_id.pop(proposal_id, None)
        if pending is not None:
            group = self._by_group.get(pending.group)
            if group is not None:
                group.pop(proposal_id, None)
                if not group:
                    del self._by_group[pending.group]
                    self._retries.pop(pending.group, None)
            if pending.barrier:
                self._forget_barrier(pending.group)
        return pending

    def _forget_barrier(self, group: str) -> None:
        count = self._barriers.get(group, 0) - 1
        if count > 0:
            self._barriers[group] = count
        else:
            self._barriers.pop(group, None)

    def has_barriers(self, group: str) -> bool:
        """Whether the group tracks a barrier (cheap: the apply path asks after every batch)."""
        return group in self._barriers

    def sendable(self, group: str) -> list[Pending]:
        """The group's proposals that may go to Raft now, in id order: every ordinary one, and a barrier only when
        nothing but barriers precedes it (what comes before it was applied or given up)."""
        pendings = self._by_group.get(group)
        if not pendings:
            return []
        if group not in self._barriers:
            return list(pendings.values())
        out: list[Pending] = []
        clear = True
        for pending in pendings.values():
            if not pending.barrier:
                clear = False
                out.append(pending)
            elif clear:
                out.append(pending)
        return out

    def held_back(self, pending: Pending) -> bool:
        """Whether `pending` (tracked) is a barrier that must wait for an earlier proposal of its group."""
        if not pending.barrier:
            return False
        for earlier in self._by_group.get(pending.group, {}).values():
            if earlier is pending:
                return False
            if not earlier.barrier:
                return True
        return False

    def released(self, group: str) -> list[Pending]:
        """Barriers of the group that may go now and were never sent (to send right after an apply)."""
        if group not in self._barriers:
            return []
        return [p for p in self.sendable(group) if p.barrier and p.sent_ms is None]

    def of_group(self, group: str) -> list[Pending]:
        """The group's proposals in id order (to send them all again)."""
        return list(self._by_group.get(group, {}).values())

    def drop_group(self, group: str) -> list[Pending]:
        """Forget a group's proposals (its queue is gone); returns them, to be abandoned."""
        dropped = list(self._by_group.pop(group, {}).values())
        self._barriers.pop(group, None)
        self._retries.pop(group, None)
        for pending in dropped:
            self._by_id.pop(pending.proposal_id, None)
        return dropped

    def expired(self, now_ms: int) -> list[Pending]:
        """Proposals older than `timeout_ms`: removed and returned (the caller abandons them)."""
        old = [p for p in self._by_id.values() if now_ms - p.first_ms >= self.timeout_ms]
        for pending in old:
            self.applied(pending.proposal_id)
        return old

    def groups_due(self, now_ms: int) -> list[str]:
        """Groups whose oldest proposal was last sent the group's retry interval ago or more (or never sent): `retry_ms`,
        doubled for each `retried` since the leader changed, at most `retry_ms * retry_backoff_max`."""
        due = []
        for group, pendings in self._by_group.items():
            oldest = next(iter(pendings.values()))
            interval = self.retry_ms * min(2 ** min(self._retries.get(group, 0), 16), self.retry_backoff_max)
            if oldest.sent_ms is None or now_ms - oldest.sent_ms >= interval:
                due.append(group)
        return due

    def retried(self, group: str) -> None:
        """The timer is sending the group's proposals again (its next interval doubles, up to the bound); a group
        whose oldest proposal was never sent (its Raft group was not running yet) does not count."""
        pendings = self._by_group.get(group)
        if pendings and next(iter(pendings.values())).sent_ms is not None:
            self._retries[group] = self._retries.get(group, 0) + 1

    def leader_changed(self, group: str) -> None:
        """The group has a new leader (the runtime sends its proposals at once): back to `retry_ms`."""
        self._retries.pop(group, None)


@dataclass(slots=True)
class PeerLiveness:
    """Peers are down after `down_after_ms` without a connection, or at once while refusing connections (the
    transport's `refusing_peers()`), and up again at their first connection."""

    peers: tuple[str, ...]
    down_after_ms: int
    start_ms: int
    _last_seen_ms: dict[str, int] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)
    down_since_ms: dict[str, int] = field(default_factory=dict)  # when each down peer was found down

    def observe(self, connected: Iterable[str], now_ms: int,
                refusing: Iterable[str] = ()) -> tuple[list[str], list[str]]:
        """One sample of the connected peers (and of those refusing connections); returns (peers now down, peers
        back up)."""
        connected = set(connected)
        refusing = set(refusing)
        went_down, came_up = [], []
        for peer in self.peers:
            if peer in connected:
                self._last_seen_ms[peer] = now_ms
                if peer in self.down:
                    self.down.discard(peer)
                    self.down_since_ms.pop(peer, None)
                    came_up.append(peer)
            elif peer not in self.down:
                seen = self._last_seen_ms.get(peer, self.start_ms)
                if now_ms - seen >= self.down_after_ms or peer in refusing:
                    self.down.add(peer)
                    self.down_since_ms[peer] = now_ms
                    went_down.append(peer)
        return went_down, came_up
