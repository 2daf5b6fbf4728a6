"""The Raft state machine of one group on one node (Ongaro & Ousterhout, with etcd-io/raft's shape): its public API.

Input: `tick()` (one logical clock tick), `step(message)`, `propose(data)`, `propose_many(datas)`,
`propose_conf_change(change)`, `transfer_leadership(node)`, `compact(data)`, `wake(...)`, `campaign()`,
`leader_refused(nodes)`, `start_bootstrapped(lead)`. Output: `ready()` returns a `Ready` (see types.py for the
persist -> send -> apply -> advance order) and `advance(ready)` acknowledges it.

`RaftCore` is built in layers, each a class adding one concern to the one below: state.py (`RaftState`: the
fields, the configuration and shared primitives), replication.py (`Replication`: appends, heartbeats, snapshots,
commit, membership changes), election.py (`Elections`: pre-vote and votes, the bootstrapped first leader, the fast
campaign when the leader's node refuses connections), and this module (`RaftCore`: ticks, proposals, message
dispatch by role, and the Ready/advance hand-off to the host). Each layer calls only its own methods and those
below it. The group can quiesce: an idle leader sends one final heartbeat and then nothing; see multiraft.py for
the node-level failure detection that replaces per-group heartbeats.
"""

from __future__ import annotations

from collections.abc import Sequence

from cluster.raft.core.election import BOOTSTRAP_TERM, Elections, bootstrap_state
from cluster.raft.core.state import BrokenVariant, RaftConfig, Rng
from cluster.raft.core.types import (
    Append,
    ConfChange,
    EntryKind,
    Heartbeat,
    HeartbeatResp,
    Index,
    InstallSnapshot,
    Message,
    NodeId,
    PreVote,
    PreVoteResp,
    Ready,
    Role,
    Snapshot,
    TimeoutNow,
    Vote,
    VoteResp,
    make_entry,
)

__all__ = ["BOOTSTRAP_TERM", "BrokenVariant", "RaftConfig", "RaftCore", "Rng", "bootstrap_state"]


class RaftCore(Elections):
    # --- public API ----------------------------------------------------------------------------------------
    def tick(self) -> None:
        if self.quiesced:
            return
        if self.role is Role.LEADER:
            self._tick_leader()
        else:
            self._election_elapsed += 1
            if self._promotable() and self._election_elapsed >= self._randomized_timeout:
                self._election_elapsed = 0
                self._campaign_on_timeout()

    def propose(self, data: bytes) -> Index | None:
        """Append a command if this node leads; None means refused (not leader, transferring, or full)."""
        return self._propose(data, EntryKind.NORMAL)

    def propose_many(self, datas: Sequence[bytes]) -> int:
        """Append several commands as one batch and send one round of appends for all of them (not one per
        command, as `propose` does). Returns how many were accepted: a prefix of `datas`, cut by the same
        refusals as `propose` (0 when not leader or transferring; fewer when `uncommitted_entries_max` is hit)."""
        if self.role is not Role.LEADER or self.lead_transferee is not None or not datas:
            return 0
        room = self.config.uncommitted_entries_max - (self.log.last_index() - self.log.committed)
        count = max(0, min(room, len(datas)))
        if count == 0:
            return 0
        self._wake_self()
        first, term, normal = self.log.last_index() + 1, self.term, EntryKind.NORMAL
        self.log.append(tuple([make_entry(term, Index(first + offset), datas[offset], normal)
                               for offset in range(count)]))
        self._broadcast_append()
        return count

    def propose_conf_change(self, change: ConfChange) -> Index | None:
        if self.role is not Role.LEADER or self._pending_conf_index > self.log.applied:
            return None
        if not self._conf_change_allowed(change):
            return None
        index = self._propose(change.encode(), EntryKind.CONF_CHANGE)
        if index is not None:
            self._pending_conf_index = index
        return index

    def transfer_leadership(self, target: NodeId) -> bool:
        if self.role is not Role.LEADER or target == self.id or target not in self.membership.voters:
            return False
        self._wake_self()
        self.lead_transferee = target
        self._election_elapsed = 0
        if self.prs[target].match == self.log.last_index():
            self._send(TimeoutNow(self.id, target, self.term))
        else:
            self._send_append(target)
        return True

    def compact(self, data: bytes) -> Snapshot:
        """The host's state machine image at the applied index; the host must persist it, then entries go."""
        index = self.log.applied
        term = self.log.term(index)
        assert term is not None
        snapshot = Snapshot(index, term, self.membership, data)
        self.log.compact(snapshot)
        return snapshot

    def wake(self, suspect_leader: bool = False) -> None:
        """Leave quiescence. `suspect_leader`: node-level failure detection says our leader is gone."""
        if suspect_leader and self.role is not Role.LEADER:
            self.quiesced = False
            self._election_elapsed = max(self._election_elapsed, self.config.election_ticks)
            return
        if self.quiesced:
            self._wake_self()
            if self.role is Role.FOLLOWER and self.lead is not None:
                self._send(HeartbeatResp(self.id, self.lead, self.term))  # wake the leader too

    # --- messages ------------------------------------------------------------------------------------------
    def step(self, m: Message) -> None:
        if self.quiesced and not (isinstance(m, Heartbeat) and m.quiesce):
            self.wake()
        if m.term > self.term:
            if isinstance(m, PreVote | Vote):
                transfer = isinstance(m, Vote) and m.transfer
                if self._in_lease() and not transfer:
                    return
            if isinstance(m, PreVote) or (isinstance(m, PreVoteResp) and not m.reject):
                pass  # no one adopts a pre-vote's term
            else:
                leader = m.src if isinstance(m, Append | Heartbeat | InstallSnapshot) else None
                self._become_follower(m.term, leader)
        elif m.term < self.term:
            if isinstance(m, Append | Heartbeat):
                self._send(HeartbeatResp(self.id, m.src, self.term))  # tell a stale leader to step down
            elif isinstance(m, PreVote):
                self._send(PreVoteResp(self.id, m.src, self.term, True, *self._commit_fact()))
            return
        if isinstance(m, PreVoteResp | VoteResp) and m.reject:
            self._learn_commit(m.commit, m.commit_term)
        if isinstance(m, PreVote | Vote):
            self._handle_vote_request(m)
        elif self.role is Role.LEADER:
            self._step_leader(m)
        elif self.role is Role.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    def _step_follower(self, m: Message) -> None:
        if self._fast_tries and isinstance(m, Append | Heartbeat | InstallSnapshot):
            self._fast_tries = 0  # the leader is alive after all: the ordinary timeout again
            self._reset_randomized_timeout()
        if isinstance(m, Append):
            self._election_elapsed = 0
            self.lead = m.src
            self._handle_append(m)
        elif isinstance(m, Heartbeat):
            self._election_elapsed = 0
            self.lead = m.src
            self._handle_heartbeat(m)
        elif isinstance(m, InstallSnapshot):
            self._election_elapsed = 0
            self.lead = m.src
            self._handle_snapshot(m)
        elif isinstance(m, TimeoutNow):
            self.campaign(transfer=True)

    def _step_candidate(self, m: Message) -> None:
        if isinstance(m, Append | Heartbeat | InstallSnapshot):
            self._become_follower(m.term, m.src)
            self._step_follower(m)
        elif self._is_poll_response(m):
            assert isinstance(m, PreVoteResp | VoteResp)
            self._votes.setdefault(m.src, not m.reject)
            self._tally()

    # --- hand-off to the host ------------------------------------------------------------------------------
    def has_ready(self) -> bool:
        return bool(
            self._msgs
            or (self.log.pending_snapshot is not None and self.log.pending_snapshot is not self._snapshot_handed)
            or self.log.handed < self.log.last_index()
            or self._applied_handed < self.log.committed
            or self._hard_state() != self._handed_hs
        )

    def ready(self) -> Ready:
        """Hand out pending work: what to persist, send and apply. Messages are drained, entries and committed
        entries handed out once. Several Readies may be outstanding (pipelined writes; `tick`, `step` and
        `propose` are fine in between): `advance` each one, in order, once it is durable."""
        hs = self._hard_state()
        snapshot = self.log.pending_snapshot
        if snapshot is self._snapshot_handed:
            snapshot = None
        self._snapshot_handed = self.log.pending_snapshot
        start = max(self._applied_handed, snapshot.index if snapshot else Index(0))
        committed = self.log.slice(Index(start + 1), self.log.committed) if self.log.committed > start else ()
        self._applied_handed = committed[-1].index if committed else start
        messages = tuple(self._msgs)
        self._msgs.clear()
        entries = self.log.unstable_entries()
        if entries:
            self.log.handed = entries[-1].index
        hard_state = hs if hs != self._handed_hs else None
        self._handed_hs = hs
        return Ready(hard_state=hard_state, snapshot=snapshot, entries=entries, committed_entries=committed,
                     messages=messages)

    def advance(self, ready: Ready) -> None:
        """The host made `ready` durable and applied its committed entries (Readies advance in the order given)."""
        if ready.snapshot is not None:
            if self.log.pending_snapshot is ready.snapshot:
                self.log.pending_snapshot = None
                self._snapshot_handed = None
            self.log.applied = Index(max(self.log.applied, ready.snapshot.index))
        if ready.entries:
            self.log.persist_through(ready.entries)
        for entry in ready.committed_entries:
            self.log.applied = Index(max(self.log.applied, entry.index))
            if entry.kind is EntryKind.CONF_CHANGE:
                self._apply_conf_change(ConfChange.decode(entry.data))
        if self.role is Role.LEADER:
            self.prs[self.id].match = self.log.persisted
            if self._maybe_commit():
                self._broadcast_append()

    @property
    def applied_handed(self) -> Index:
        """The last committed entry handed out by a Ready to be applied (the host applies as it takes a Ready,
        so this is what its state machine reflects; `log.applied` moves only at `advance`)."""
        return self._applied_handed

