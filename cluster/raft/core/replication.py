"""Log replication of one Raft group: the follower's side of appends, heartbeats and snapshots, and the leader's.

A follower accepts an `Append` only if its log holds the previous entry (log matching) and truncates only at a real
conflict, never just because an append arrived; a rejection carries a hint (the conflicting term's first index) so
the leader skips back a term at a time. An `InstallSnapshot` replaces the log when the follower is too far behind
for the leader's compacted log. The leader pipelines appends per follower (`Progress`: probe one at a time, then
replicate up to the inflight limits, or wait for a snapshot), commits only by counting replicas of an entry of its
own term (section 5.4.2), heartbeats every `heartbeat_ticks`, steps down under check-quorum when it has not heard
from a quorum within an election timeout, and quiesces when idle (one final heartbeat, then nothing). Membership
changes are single-server, one at a time, effective when applied; a learner is promoted only once caught up.
"""

from __future__ import annotations

from cluster.raft.core.progress import Progress, ProgressState
from cluster.raft.core.quorum import VoteResult, committed_index, vote_result
from cluster.raft.core.state import BrokenVariant, RaftState
from cluster.raft.core.types import (
    Append,
    AppendResp,
    ConfChange,
    ConfOp,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResp,
    Index,
    InstallSnapshot,
    Message,
    NodeId,
    Role,
    TimeoutNow,
)


class Replication(RaftState):
    # --- follower ------------------------------------------------------------------------------------------
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
                pr.next = Index(max(pr.next, self.log.snapshot.index + 1))  # (of a seeded group: after its seed)
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
