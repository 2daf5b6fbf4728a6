"""The Raft state machine of one group on one node (Ongaro & Ousterhout, with etcd-io/raft's shape).

Input: `tick()` (one logical clock tick), `step(message)`, `propose(data)`, `propose_conf_change(change)`,
`transfer_leadership(node)`, `compact(data)`, `wake(...)`, `leader_refused(nodes)`. Output: `ready()` returns a
`Ready` (see types.py for the persist -> send -> apply -> advance order) and `advance(ready)` acknowledges it.

A new group may be bootstrapped with a leader named in advance (`bootstrap_state`, then `start_bootstrapped`): every
member starts at term 1 with its vote already cast for that node, so no other node can win term 1; the named node
alone leads term 1 at once (no election) and the others know it as leader from the start. If it is down or cut off,
the others time out and elect a leader of term 2 as usual.

Elections use pre-vote (section 9.6: a node first asks whether it could win, without bumping its term) and
check-quorum (a leader that has not heard from a quorum within an election timeout steps down; followers that
heard from a leader within the timeout ignore vote requests: the "leader lease"). When the host knows that the
leader's node is gone (its port refuses connections: `leader_refused`), a follower drops the lease and campaigns at
once or within a few ticks, the surviving voters in id order, instead of waiting for the election timeout.
Replication pipelines appends per follower (progress.py) and a leader commits only by counting replicas of an entry
of its own term (section 5.4.2). A follower truncates only at a real conflict. Membership changes are single-server, take effect
when applied, one at a time, and a learner is promoted only once it has caught up. The group can quiesce: an idle
leader sends one final heartbeat and then nothing; see multiraft.py for the node-level failure detection that
replaces per-group heartbeats.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cluster.raft.core.log import RaftLog
from cluster.raft.core.progress import Inflights, Progress, ProgressState
from cluster.raft.core.quorum import VoteResult, committed_index, vote_result
from cluster.raft.core.types import (
    Append,
    AppendResp,
    ConfChange,
    ConfOp,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
    HeartbeatResp,
    Index,
    InstallSnapshot,
    Membership,
    Message,
    NodeId,
    PersistedState,
    PreVote,
    PreVoteResp,
    Ready,
    Role,
    Snapshot,
    Term,
    TimeoutNow,
    Vote,
    VoteResp,
    make_entry,
)

Rng = Callable[[int, int], int]  # rng(low, high_exclusive), e.g. random.Random(seed).randrange
BOOTSTRAP_TERM = Term(1)
REFUSED_CAMPAIGN_TRIES = 2  # `leader_refused`: pre-votes on the short timing (the first, and one retry a tick later)


def bootstrap_state(membership: Membership, leader: NodeId) -> PersistedState:
    """The first durable state of a new group whose first leader is named in advance: term 1, vote for `leader`.

    Every member that creates the group (a node with no stored state for it) starts from exactly this state, with
    the same `leader`: then term 1 has one possible leader, `leader`, which may take it without an election
    (`RaftCore.start_bootstrapped(lead=True)`) and must do so at most once: only in the life of the node in which
    its host created the group. A restarted node loads its stored state as an ordinary follower; one that lost the
    (not yet durable) state in a crash creates it again, identical, and does not lead. Losing it is harmless since
    every copy is the same: the state need not be durable before the first messages (the entries and votes that
    follow are written after it, in order)."""
    return PersistedState(HardState(BOOTSTRAP_TERM, leader, Index(0)), Snapshot(Index(0), Term(0), membership), ())


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


class RaftCore:
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

    def _campaign_on_timeout(self) -> None:
        if self._fast_tries:  # a `leader_refused` campaign: a pre-vote no one answered yet is asked again next
            self._fast_tries -= 1  # tick (a voter may learn of the refusal a moment after us), then the ordinary
            if self._fast_tries and self.config.pre_vote:  # timeout applies (a lost pre-vote, a split vote)
                self._randomized_timeout = 1
            else:
                self._fast_tries = 0
                self._reset_randomized_timeout()
        self.campaign()

    def campaign(self, transfer: bool = False) -> None:
        """Start an election now (a pre-vote round first, unless this is a leadership transfer)."""
        if not self._promotable() or self.role is Role.LEADER:
            return
        if self.config.pre_vote and not transfer:
            self._become_pre_candidate()
        else:
            self._become_candidate(transfer)

    def start_bootstrapped(self, lead: bool) -> bool:
        """A core just created from `bootstrap_state`: the named leader (with `lead`) becomes leader of term 1 at
        once and appends its no-op; any other member takes the named node as its leader and tells it so (a
        heartbeat answer, which makes a leader send its log at once). Returns whether this core now leads.

        `lead` is the host's promise that this node never led this group before (a fresh group, created in this
        life of the node); a core whose state is not the untouched bootstrap state ignores the call."""
        leader = self.vote
        untouched = (self.term == BOOTSTRAP_TERM and self.role is Role.FOLLOWER and self.lead is None
                     and self.log.last_index() == 0 and self.log.snapshot.index == 0)
        if leader is None or not untouched or leader not in self.membership.voters:
            return False
        if leader == self.id:
            if lead and self._promotable():
                self._become_leader(empty_followers=True)
                return True
            return False
        self.lead = leader
        self._send(HeartbeatResp(self.id, leader, self.term))
        return False

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

    def leader_refused(self, refusing: frozenset[NodeId]) -> bool:
        """Node-level evidence that the nodes `refusing` are gone: their port refuses connections after our link to
        them was lost (the host's transport sees it; a paused, slow or partitioned node does not refuse). If our
        leader is one of them, we forget it (no lease: we grant votes) and campaign at once or within a few ticks
        instead of after the election timeout: the surviving voters, ranked by id, take turns; the first campaigns at
        once, the one of rank r after r * `refused_campaign_ticks` ticks plus a random 0..half of that (for two
        that see different survivors and so take the same rank), so that they rarely split the vote; and one that
        grants another's pre-vote before its own turn leaves it to that one, keeping only the ordinary timeout. A
        pre-vote is asked once more a tick later, as the other voters may learn of the refusal a moment after us
        (until then the leader's lease makes them ignore it). Whether such a campaign started or is scheduled.

        Safe as any campaign: it is an ordinary (pre-)vote; only its timing and our lease change. If the leader is
        in fact alive, the voters that still hear it are in its lease and ignore the pre-vote (no term is bumped),
        and after the short tries the ordinary timeout applies again (a lost pre-vote, a split vote)."""
        if self.role is not Role.FOLLOWER or self.lead is None or self.lead not in refusing or not self._promotable():
            return False
        self.quiesced = False
        self.lead = None  # gone: no lease, and the host holds commands for the group until a new leader is known
        survivors = sorted(self.membership.voters - refusing)
        rank = survivors.index(self.id) if self.id in survivors else len(survivors)
        gap = max(1, self.config.refused_campaign_ticks)
        delay = 0 if rank == 0 else rank * gap + self._rng(0, (gap + 1) // 2)
        self._election_elapsed = max(self._election_elapsed, self.config.election_ticks)  # the lease is over
        self._fast_tries = REFUSED_CAMPAIGN_TRIES
        if delay == 0:
            self._election_elapsed = 0
            self._campaign_on_timeout()
        else:
            self._randomized_timeout = self._election_elapsed + delay
        return True

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

    def soft_state(self) -> tuple[Role, NodeId | None]:
        return self.role, self.lead

    # --- roles ---------------------------------------------------------------------------------------------
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

    def _become_pre_candidate(self) -> None:
        self.role = Role.PRE_CANDIDATE
        self.lead = None
        self._votes = {self.id: True}
        self.prs = {}
        for voter in sorted(self.membership.voters - {self.id}):
            self._send(PreVote(self.id, voter, Term(self.term + 1), self.log.last_index(), self.log.last_term()))
        self._tally()

    def _become_candidate(self, transfer: bool) -> None:
        self._reset(Term(self.term + 1))
        self.role = Role.CANDIDATE
        self.vote = self.id
        self._votes = {self.id: True}
        for voter in sorted(self.membership.voters - {self.id}):
            last_index, last_term = self.log.last_index(), self.log.last_term()
            self._send(Vote(self.id, voter, self.term, last_index, last_term, transfer))
        self._tally()

    def _become_leader(self, empty_followers: bool = False) -> None:
        """Lead this term: append the no-op and send it. `empty_followers` (a bootstrapped term 1): every other
        member's log is known to be a prefix of ours (empty at first), so appends stream to them at once instead of
        one probe at a time."""
        self._reset(self.term)
        self.role = Role.LEADER
        self.lead = self.id
        self.vote = self.id
        last = self.log.last_index()
        self.prs = {node: self._new_progress(node, last) for node in self.membership.members}
        self.prs[self.id].match = self.log.persisted
        self.prs[self.id].recent_active = True
        if empty_followers:
            for node, pr in self.prs.items():
                if node != self.id:
                    pr.become_replicate()
        self._pending_conf_index = last  # no conf change until everything before our term is applied
        self.log.append((Entry(self.term, Index(last + 1), b"", EntryKind.EMPTY),))
        self._broadcast_append()

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

    # --- elections -----------------------------------------------------------------------------------------
    def _handle_vote_request(self, m: PreVote | Vote) -> None:
        pre = isinstance(m, PreVote)
        can_vote = (
            self.vote == m.src
            or (self.vote is None and self.lead is None)
            or (pre and m.term > self.term)
        )
        if can_vote and self.log.is_up_to_date(m.last_index, m.last_term):
            if pre:
                self._send(PreVoteResp(self.id, m.src, m.term, reject=False))
                if self._fast_tries and self.role is Role.FOLLOWER:  # another survivor campaigns before our turn:
                    self._fast_tries = 0  # leave it to them (a second campaign could split the vote), keeping
                    self._election_elapsed = 0  # the ordinary timeout in case theirs fails
                    self._reset_randomized_timeout()
            else:
                self._election_elapsed = 0
                self.vote = m.src
                self._send(VoteResp(self.id, m.src, m.term, reject=False))
        elif pre:
            self._send(PreVoteResp(self.id, m.src, self.term, True, *self._commit_fact()))
        else:
            self._send(VoteResp(self.id, m.src, self.term, True, *self._commit_fact()))

    def _commit_fact(self) -> tuple[Index, Term]:
        term = self.log.term(self.log.committed)
        assert term is not None
        return self.log.committed, term

    def _learn_commit(self, commit: Index, commit_term: Term) -> None:
        """A voter's commit index is a fact; if our log holds its (index, term), our prefix through it is the same
        (log matching), so it is committed here too. This un-sticks a stale voter: with membership effective when
        applied, a voter that never heard that its config change committed (say the leader removed itself and
        stepped down) would campaign in the old config, where the up-to-date nodes are non-voters that reject it;
        the rejection now tells it the change committed, it applies it and campaigns in the new config (a bug the
        simulator found: tests/sim/regressions/seed-70285.txt)."""
        if commit > self.log.committed and commit <= self.log.last_index() and self.log.term(commit) == commit_term:
            self.log.commit_to(commit)

    def _step_candidate(self, m: Message) -> None:
        if isinstance(m, Append | Heartbeat | InstallSnapshot):
            self._become_follower(m.term, m.src)
            self._step_follower(m)
        elif self._is_poll_response(m):
            assert isinstance(m, PreVoteResp | VoteResp)
            self._votes.setdefault(m.src, not m.reject)
            self._tally()

    def _is_poll_response(self, m: Message) -> bool:
        if self.role is Role.PRE_CANDIDATE:
            return isinstance(m, PreVoteResp)
        return isinstance(m, VoteResp)

    def _tally(self) -> None:
        if self.id not in self.membership.voters:  # removed (or demoted) while campaigning: it cannot lead
            self._become_follower(self.term, None)  # (the remaining voters alone could otherwise elect it)
            return
        result = vote_result(self.membership.voters, self._votes)
        if result is VoteResult.WON:
            if self.role is Role.PRE_CANDIDATE:
                self._become_candidate(transfer=False)
            else:
                self._become_leader()
        elif result is VoteResult.LOST:
            self._become_follower(self.term, None)

    # --- follower ------------------------------------------------------------------------------------------
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

    def _handle_append(self, m: Append) -> None:
        log = self.log
        if m.prev_index < log.committed:
            self._send(AppendResp(self.id, m.src, self.term, log.committed))
            return
        if not log.matches(m.prev_index, m.prev_term):
            hint_index, hint_term = log.find_conflict_by_term(Index(min(m.prev_index, log.last_index())), m.prev_term)
            self._send(AppendResp(self.id, m.src, self.term, m.prev_index, True, hint_index, hint_term))
            return
        last_new = Index(m.prev_index + len(m.entries))
        if self._broken is BrokenVariant.TRUNCATE_ON_APPEND and m.entries:
            if log.last_index() > m.prev_index:
                log.truncate_from(Index(m.prev_index + 1))
            log.append(m.entries)
        else:
            self._append_from_conflict(m.entries)
        log.commit_to(Index(min(m.commit, last_new)))
        self._send(AppendResp(self.id, m.src, self.term, last_new))

    def _append_from_conflict(self, entries: tuple[Entry, ...]) -> None:
        """Skip entries we already hold (same index and term); truncate only at the first real conflict."""
        for position, entry in enumerate(entries):
            if self.log.matches(entry.index, entry.term):
                continue
            if entry.index <= self.log.last_index():
                self.log.truncate_from(entry.index)
            self.log.append(entries[position:])
            return

    def _handle_heartbeat(self, m: Heartbeat) -> None:
        self.log.commit_to(m.commit)
        if m.quiesce and self.config.quiesce:
            self.quiesced = True
            return  # no answer: an answer would wake the leader
        self._send(HeartbeatResp(self.id, m.src, self.term))

    def _handle_snapshot(self, m: InstallSnapshot) -> None:
        snapshot = m.snapshot
        if snapshot.index <= self.log.committed:
            pass
        elif self.log.matches(snapshot.index, snapshot.term):
            self.log.commit_to(snapshot.index)
        else:
            self.log.restore(snapshot)
            self.membership = snapshot.membership
        self._send(AppendResp(self.id, m.src, self.term, self.log.committed))

    # --- leader --------------------------------------------------------------------------------------------
    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self.config.election_ticks:
            self._election_elapsed = 0
            self.lead_transferee = None
            for pr in self.prs.values():
                if pr.state is ProgressState.SNAPSHOT:
                    pr.become_probe()  # the snapshot may have been lost: try again
            if self.config.check_quorum and not self._quorum_active():
                self._become_follower(self.term, None)
                return
        if self._heartbeat_elapsed >= self.config.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            if self.config.quiesce and self._can_quiesce():
                self._broadcast_heartbeat(quiesce=True)
                self.quiesced = True
            else:
                self._broadcast_heartbeat(quiesce=False)

    def _quorum_active(self) -> bool:
        active = {node: pr.recent_active for node, pr in self.prs.items()}
        for node, pr in self.prs.items():
            pr.recent_active = node == self.id
        return vote_result(self.membership.voters, active) is VoteResult.WON

    def _can_quiesce(self) -> bool:
        last = self.log.last_index()
        return (
            self.lead_transferee is None
            and self.log.committed == last
            and self.log.persisted == last
            and all(pr.match == last for pr in self.prs.values())
        )

    def _broadcast_heartbeat(self, quiesce: bool) -> None:
        for node in sorted(self.prs):
            if node != self.id:
                commit = Index(min(self.prs[node].match, self.log.committed))
                self._send(Heartbeat(self.id, node, self.term, commit, quiesce))

    def _broadcast_append(self) -> None:
        for node in sorted(self.prs):
            if node != self.id:
                self._send_append(node)

    def _send_append(self, to: NodeId, send_if_empty: bool = True) -> bool:
        pr = self.prs[to]
        if pr.is_paused():
            return False
        prev_index = Index(pr.next - 1)
        prev_term = self.log.term(prev_index)
        if prev_term is None:  # compacted away: only a snapshot can bring this follower up
            self._send(InstallSnapshot(self.id, to, self.term, self.log.snapshot))
            pr.become_snapshot(self.log.snapshot.index)
            return True
        entries = self.log.slice(pr.next, self.log.last_index(), self.config.msg_size_bytes_max)
        if not entries and not send_if_empty:
            return False
        self._send(Append(self.id, to, self.term, prev_index, prev_term, entries, self.log.committed))
        if entries:
            pr.sent_entries(entries[-1].index, sum(entry.size_bytes for entry in entries))
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return True

    def _step_leader(self, m: Message) -> None:
        pr = self.prs.get(m.src)
        if pr is None:
            return
        if isinstance(m, AppendResp):
            pr.recent_active = True
            self._handle_append_resp(m, pr)
        elif isinstance(m, HeartbeatResp):
            pr.recent_active = True
            pr.probe_sent = False
            if pr.state is ProgressState.REPLICATE and pr.match == 0:
                pr.become_probe()  # a bootstrapped follower that has acknowledged nothing: resend from the start
            elif pr.state is ProgressState.REPLICATE and pr.inflights.full():
                pr.inflights.free_first()  # an append may be lost: let one more through (it will probe)
            if pr.match < self.log.last_index():
                self._send_append(m.src)

    def _handle_append_resp(self, m: AppendResp, pr: Progress) -> None:
        if m.reject:
            probe_hint, _ = self.log.find_conflict_by_term(m.hint_index, m.hint_term)
            if pr.maybe_decrease_to(m.index, probe_hint):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(m.src)
            return
        was_paused = pr.is_paused()
        if not pr.maybe_update(m.index):
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
            pr.become_probe()
        else:
            pr.inflights.free_through(m.index)
        if self._maybe_commit():
            self._broadcast_append()
        elif was_paused:
            self._send_append(m.src)
        while self._send_append(m.src, send_if_empty=False):
            pass
        if m.src == self.lead_transferee and pr.match == self.log.last_index():
            self._send(TimeoutNow(self.id, m.src, self.term))

    def _maybe_commit(self) -> bool:
        match = {node: pr.match for node, pr in self.prs.items()}
        index = committed_index(self.membership.voters, match)
        if index <= self.log.committed:
            return False
        if self.log.term(index) != self.term and self._broken is not BrokenVariant.COMMIT_OLD_TERM:
            return False  # section 5.4.2: never commit an old term's entry by counting replicas
        return self.log.commit_to(index)

    def _propose(self, data: bytes, kind: EntryKind) -> Index | None:
        if self.role is not Role.LEADER or self.lead_transferee is not None:
            return None
        if self.log.last_index() - self.log.committed >= self.config.uncommitted_entries_max:
            return None
        self._wake_self()
        index = Index(self.log.last_index() + 1)
        self.log.append((Entry(self.term, index, data, kind),))
        self._broadcast_append()
        return index

    # --- membership ----------------------------------------------------------------------------------------
    def _conf_change_allowed(self, change: ConfChange) -> bool:
        members = self.membership
        if change.op is ConfOp.ADD_LEARNER:
            return change.node not in members.members
        if change.op is ConfOp.PROMOTE:
            pr = self.prs.get(change.node)
            return change.node in members.learners and pr is not None and pr.match >= self.log.committed
        return change.node in members.members and members.voters != {change.node}

    def _apply_conf_change(self, change: ConfChange) -> None:
        self.membership = self.membership.changed(change)
        voters = self.membership.voters
        if self.role in (Role.PRE_CANDIDATE, Role.CANDIDATE) and self.id not in voters:
            self._become_follower(self.term, None)  # removed while campaigning: stop (a sim-found bug)
        if self.role is not Role.LEADER:
            return
        if change.node == self.id and change.op is ConfOp.REMOVE:
            self._become_follower(self.term, None)
            return
        if change.op is ConfOp.ADD_LEARNER:
            self.prs[change.node] = self._new_progress(change.node, self.log.last_index())
            self._send_append(change.node)
        elif change.op is ConfOp.PROMOTE:
            self.prs[change.node].is_learner = False
        else:
            self.prs.pop(change.node, None)
        if self._maybe_commit():
            self._broadcast_append()
