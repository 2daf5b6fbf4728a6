"""The fields of one Raft group's state machine and the small primitives every part of it uses.

`RaftState` is the bottom of the `RaftCore` stack (state.py -> replication.py -> election.py -> raft.py): it holds
the durable state (term, vote, the log), the volatile role state (role, leader, follower progress, election and
heartbeat clocks), the outgoing message queue, and the operations all layers share: queue a message, reset for a
new term, become a follower, the lease test. It also defines the configuration (`RaftConfig`) and the deliberate
bugs the checkers are kept sharp with (`BrokenVariant`). Nothing here decides anything on its own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from cluster.raft.core.log import RaftLog
from cluster.raft.core.progress import Inflights, Progress
from cluster.raft.core.types import (
    HardState,
    Index,
    Membership,
    Message,
    NodeId,
    PersistedState,
    Role,
    Snapshot,
    Term,
)

Rng = Callable[[int, int], int]  # rng(low, high_exclusive), e.g. random.Random(seed).randrange


class BrokenVariant(enum.Enum):
    """Deliberate bugs, reachable only by passing them in (tests and the simulator do), to keep checkers sharp."""

    COMMIT_OLD_TERM = "commit-old-term"  # count replicas of an old term's entry (figure 8)
    TRUNCATE_ON_APPEND = "truncate-on-append"  # drop the follower's tail on every append, even without conflict


@dataclass(frozen=True, slots=True)
class RaftConfig:
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    quiesce: bool = False
    msg_size_bytes_max: int = 64 * 1024  # entries per Append are cut after this many bytes
    inflight_msgs_max: int = 64
    inflight_bytes_max: int = 4 * 1024 * 1024
    uncommitted_entries_max: int = 10_000  # proposals beyond this are refused (back-pressure)
    # `leader_refused`: the surviving voters campaign in turn, rank * this many ticks apart (rank 0 at once), each
    # after a random 0..half of it more (a refused connection is the trigger; the election timeout applies otherwise)
    refused_campaign_ticks: int = 2


class RaftState:
    def __init__(
        self,
        node_id: NodeId,
        config: RaftConfig,
        rng: Rng,
        membership: Membership | None = None,
        persisted: PersistedState | None = None,
        broken: BrokenVariant | None = None,
    ) -> None:
        self.id = node_id
        self.config = config
        self._rng = rng
        self._broken = broken
        if persisted is None:
            assert membership is not None, "a new group needs its initial membership"
            persisted = PersistedState(HardState(Term(0), None, Index(0)), Snapshot(Index(0), Term(0), membership), ())
        hs = persisted.hard_state
        self.log = RaftLog(persisted.snapshot, persisted.entries, hs.commit)
        self.membership = persisted.snapshot.membership
        self.term = hs.term
        self.vote = hs.vote
        self._handed_hs = HardState(self.term, self.vote, self.log.committed)  # the last one a Ready carried
        self._applied_handed = self.log.applied  # the last committed entry a Ready handed out to apply
        self._snapshot_handed: Snapshot | None = None  # the pending snapshot a Ready handed out already
        self.role = Role.FOLLOWER
        self.lead: NodeId | None = None
        self.quiesced = False
        self.prs: dict[NodeId, Progress] = {}
        self._votes: dict[NodeId, bool] = {}
        self._msgs: list[Message] = []
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = 0
        self._fast_tries = 0  # `leader_refused` campaigns left on the short timing (then the ordinary timeout)
        self._pending_conf_index = Index(0)
        self.lead_transferee: NodeId | None = None
        self._reset_randomized_timeout()

    def _reset(self, term: Term) -> None:
        if term != self.term:
            self.term = term
            self.vote = None
        self.lead = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._votes = {}
        self.lead_transferee = None
        self.quiesced = False
        self._fast_tries = 0
        self._reset_randomized_timeout()

    def _reset_randomized_timeout(self) -> None:
        ticks = self.config.election_ticks
        self._randomized_timeout = ticks + self._rng(0, ticks)

    def _become_follower(self, term: Term, leader: NodeId | None) -> None:
        self._reset(term)
        self.role = Role.FOLLOWER
        self.lead = leader
        self.prs = {}

    def _new_progress(self, node: NodeId, last: Index) -> Progress:
        inflights = Inflights(self.config.inflight_msgs_max, self.config.inflight_bytes_max)
        return Progress(Index(0), Index(last + 1), inflights, is_learner=node in self.membership.learners)

    def _promotable(self) -> bool:
        return self.id in self.membership.voters and self.log.pending_snapshot is None

    def _in_lease(self) -> bool:
        return (
            self.config.check_quorum
            and self.lead is not None
            and self._election_elapsed < self.config.election_ticks
        )

    def _hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def _commit_fact(self) -> tuple[Index, Term]:
        term = self.log.term(self.log.committed)
        assert term is not None
        return self.log.committed, term

    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    def _wake_self(self) -> None:
        if not self.quiesced:
            return
        self.quiesced = False
        self._election_elapsed = 0
        if self.role is Role.LEADER:
            self._heartbeat_elapsed = self.config.heartbeat_ticks
            for node, pr in self.prs.items():
                pr.recent_active = node == self.id
