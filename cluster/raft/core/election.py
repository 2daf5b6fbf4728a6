"""Elections of one Raft group: pre-vote, votes, the tally, the first leader named in advance, and the fast campaign
when the leader's node is known to be gone.

Elections use pre-vote (section 9.6: a node first asks whether it could win, without bumping its term) and
check-quorum's "leader lease" (a follower that heard from a leader within the election timeout ignores vote
requests; the lease test itself is in state.py, applied by `RaftCore.step`). A rejected (pre-)vote carries the
voter's commit index and term, which may tell a stale voter that its own config change committed (`_learn_commit`).

A new group may be bootstrapped with a leader named in advance (`bootstrap_state`, then `start_bootstrapped`): every
member starts at term 1 with its vote already cast for that node, so no other node can win term 1; the named node
alone leads term 1 at once (no election) and the others know it as leader from the start. If it is down or cut off,
the others time out and elect a leader of term 2 as usual.

When the host knows that the leader's node is gone (its port refuses connections: `leader_refused`), a follower
drops the lease and campaigns at once or within a few ticks, the surviving voters in id order, instead of waiting
for the election timeout.
"""

from __future__ import annotations

from cluster.raft.core.quorum import VoteResult, vote_result
from cluster.raft.core.replication import Replication
from cluster.raft.core.types import (
    Entry,
    EntryKind,
    HardState,
    HeartbeatResp,
    Index,
    Membership,
    Message,
    NodeId,
    PersistedState,
    PreVote,
    PreVoteResp,
    Role,
    Snapshot,
    Term,
    Vote,
    VoteResp,
)

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


class Elections(Replication):
    def campaign(self, transfer: bool = False) -> None:
        """Start an election now (a pre-vote round first, unless this is a leadership transfer)."""
        if not self._promotable() or self.role is Role.LEADER:
            return
        if self.config.pre_vote and not transfer:
            self._become_pre_candidate()
        else:
            self._become_candidate(transfer)

    def _campaign_on_timeout(self) -> None:
        if self._fast_tries:  # a `leader_refused` campaign: a pre-vote no one answered yet is asked again next
            self._fast_tries -= 1  # tick (a voter may learn of the refusal a moment after us), then the ordinary
            if self._fast_tries and self.config.pre_vote:  # timeout applies (a lost pre-vote, a split vote)
                self._randomized_timeout = 1
            else:
                self._fast_tries = 0
                self._reset_randomized_timeout()
        self.campaign()

    def start_bootstrapped(self, lead: bool) -> bool:
        """A core just created from `bootstrap_state`: the named leader (with `lead`) becomes leader of term 1 at
        once and appends its no-op; any other member takes the named node as its leader and tells it so (a
        heartbeat answer, which makes a leader send its log at once). Returns whether this core now leads.

        `lead` is the host's promise that this node never led this group before (a fresh group, created in this
        life of the node); a core whose state is not the untouched bootstrap state (no entry after its snapshot,
        which is empty or the seed the group was created with: node.py's `Bootstrap.seed`) ignores the call."""
        leader = self.vote
        untouched = (self.term == BOOTSTRAP_TERM and self.role is Role.FOLLOWER and self.lead is None
                     and self.log.last_index() == self.log.snapshot.index == self.log.applied)
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

    # --- roles ---------------------------------------------------------------------------------------------
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
                    pr.next = Index(max(pr.next, self.log.snapshot.index + 1))  # (a seeded group: after the seed)
        self._pending_conf_index = last  # no conf change until everything before our term is applied
        self.log.append((Entry(self.term, Index(last + 1), b"", EntryKind.EMPTY),))
        self._broadcast_append()

    # --- votes ---------------------------------------------------------------------------------------------
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

    def _learn_commit(self, commit: Index, commit_term: Term) -> None:
        """A voter's commit index is a fact; if our log holds its (index, term), our prefix through it is the same
        (log matching), so it is committed here too. This un-sticks a stale voter: with membership effective when
        applied, a voter that never heard that its config change committed (say the leader removed itself and
        stepped down) would campaign in the old config, where the up-to-date nodes are non-voters that reject it;
        the rejection now tells it the change committed, it applies it and campaigns in the new config (a bug the
        simulator found: tests/sim/regressions/seed-70285.txt)."""
        if commit > self.log.committed and commit <= self.log.last_index() and self.log.term(commit) == commit_term:
            self.log.commit_to(commit)

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
