"""Value types of the pure Raft core: ids, entries, snapshots, hard state, messages and the Ready batch.

Everything here is a frozen, slotted dataclass so that a message or a Ready can be shared, compared, hashed and
replayed without aliasing bugs. Terms are the leader epochs of the whole system and every entry carries its term.

Ready order (the contract between a core and its host):
  1. persist `snapshot` (if any), then `entries` (truncating every stored entry at index >= entries[0].index
     first), then `hard_state` (if any) -- and fsync (not needed when the hard state only moved `commit` and
     nothing else must be durable: `image.must_sync`; the next fsync covers it);
  2. send `messages` (they may depend on what was just made durable: votes and append acknowledgements);
  3. apply `snapshot` (if any) then `committed_entries` to the state machine, in order;
  4. call `advance(ready)` before the next `step`, `tick` or `propose`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType

Term = NewType("Term", int)
Index = NewType("Index", int)
NodeId = NewType("NodeId", str)
GroupId = NewType("GroupId", str)

INDEX_ZERO = Index(0)
TERM_ZERO = Term(0)


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class EntryKind(enum.Enum):
    NORMAL = 0
    EMPTY = 1  # the no-op a new leader appends to commit earlier terms (section 5.4.2 / 8)
    CONF_CHANGE = 2


class ConfOp(enum.Enum):
    ADD_LEARNER = "add-learner"
    PROMOTE = "promote"  # learner -> voter, only once it has caught up
    REMOVE = "remove"


@dataclass(frozen=True, slots=True)
class ConfChange:
    op: ConfOp
    node: NodeId

    def encode(self) -> bytes:
        return f"{self.op.value} {self.node}".encode()

    @staticmethod
    def decode(data: bytes) -> ConfChange:
        op, node = data.decode().split(" ", 1)
        return ConfChange(ConfOp(op), NodeId(node))


@dataclass(frozen=True, slots=True)
class Entry:
    term: Term
    index: Index
    data: bytes = b""
    kind: EntryKind = EntryKind.NORMAL

    @property
    def size_bytes(self) -> int:
        return len(self.data) + 16


_new_object = object.__new__
_ENTRY_SLOTS = tuple(Entry.__dict__[name].__set__ for name in ("term", "index", "data", "kind"))


def make_entry(term: Term, index: Index, data: bytes, kind: EntryKind) -> Entry:
    """`Entry(term, index, data, kind)`, built through the slot descriptors instead of the frozen dataclass
    `__init__` (its four `object.__setattr__` calls): 2-3x cheaper, for the per-entry hot paths (decoding,
    batched proposals). The result is an ordinary Entry, equal to the one the constructor makes."""
    entry = _new_object(Entry)
    set_term, set_index, set_data, set_kind = _ENTRY_SLOTS
    set_term(entry, term)
    set_index(entry, index)
    set_data(entry, data)
    set_kind(entry, kind)
    return entry


@dataclass(frozen=True, slots=True)
class HardState:
    term: Term
    vote: NodeId | None
    commit: Index


@dataclass(frozen=True, slots=True)
class Membership:
    voters: frozenset[NodeId]
    learners: frozenset[NodeId] = frozenset()

    @property
    def members(self) -> frozenset[NodeId]:
        return self.voters | self.learners

    def changed(self, change: ConfChange) -> Membership:
        """The membership after `change` (add a learner, promote a learner to voter, or remove a node)."""
        voters, learners = set(self.voters), set(self.learners)
        if change.op is ConfOp.ADD_LEARNER:
            learners.add(change.node)
        elif change.op is ConfOp.PROMOTE:
            learners.discard(change.node)
            voters.add(change.node)
        else:
            voters.discard(change.node)
            learners.discard(change.node)
        return Membership(frozenset(voters), frozenset(learners))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """State machine image through `index` (whose entry had `term`), with the membership in force there."""

    index: Index
    term: Term
    membership: Membership
    data: bytes = b""


# --- messages -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreVote:
    src: NodeId
    dst: NodeId
    term: Term  # the term the sender would campaign in (its own term + 1); no one adopts it
    last_index: Index
    last_term: Term


@dataclass(frozen=True, slots=True)
class PreVoteResp:
    src: NodeId
    dst: NodeId
    term: Term
    reject: bool
    # A rejection carries the voter's commit index and its term: a candidate whose log holds that (index, term)
    # has, by log matching, the same prefix, so it learns that prefix is committed (see RaftCore._learn_commit).
    commit: Index = Index(0)
    commit_term: Term = Term(0)


@dataclass(frozen=True, slots=True)
class Vote:
    src: NodeId
    dst: NodeId
    term: Term
    last_index: Index
    last_term: Term
    transfer: bool = False  # leadership transfer: voters ignore their leader lease


@dataclass(frozen=True, slots=True)
class VoteResp:
    src: NodeId
    dst: NodeId
    term: Term
    reject: bool
    # A rejection carries the voter's commit index and its term: a candidate whose log holds that (index, term)
    # has, by log matching, the same prefix, so it learns that prefix is committed (see RaftCore._learn_commit).
    commit: Index = Index(0)
    commit_term: Term = Term(0)


@dataclass(frozen=True, slots=True)
class Append:
    src: NodeId
    dst: NodeId
    term: Term
    prev_index: Index
    prev_term: Term
    entries: tuple[Entry, ...]
    commit: Index


@dataclass(frozen=True, slots=True)
class AppendResp:
    """Success: `index` is the last index the follower now holds matching the leader (durably).
    Reject: `index` is the rejected prev_index; (`hint_index`, `hint_term`) is the follower's best guess of where
    its log last agrees (the largest index <= min(prev_index, last) whose term <= the leader's prev_term)."""

    src: NodeId
    dst: NodeId
    term: Term
    index: Index
    reject: bool = False
    hint_index: Index = INDEX_ZERO
    hint_term: Term = TERM_ZERO


@dataclass(frozen=True, slots=True)
class Heartbeat:
    src: NodeId
    dst: NodeId
    term: Term
    commit: Index
    quiesce: bool = False  # the group is idle: stop ticking until woken


@dataclass(frozen=True, slots=True)
class HeartbeatResp:
    src: NodeId
    dst: NodeId
    term: Term


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    src: NodeId
    dst: NodeId
    term: Term
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    src: NodeId
    dst: NodeId
    term: Term


Message = (
    PreVote
    | PreVoteResp
    | Vote
    | VoteResp
    | Append
    | AppendResp
    | Heartbeat
    | HeartbeatResp
    | InstallSnapshot
    | TimeoutNow
)


@dataclass(frozen=True, slots=True)
class Ready:
    """One batch of work for the host; see the module header for the order."""

    hard_state: HardState | None
    snapshot: Snapshot | None
    entries: tuple[Entry, ...]
    committed_entries: tuple[Entry, ...]
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class PersistedState:
    """What a host reloads from disk to restart a core."""

    hard_state: HardState
    snapshot: Snapshot
    entries: tuple[Entry, ...]  # contiguous, starting at snapshot.index + 1
