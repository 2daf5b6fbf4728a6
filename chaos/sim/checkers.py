"""Safety checkers run by the simulator after every step, on every group.

- election safety: at most one leader per term;
- log matching: an (index, term) pair names one entry everywhere, with the same predecessor term (checked when
  entries are persisted, which by induction gives the paper's log matching property);
- committed entries are never lost or changed: a global committed map per group, fed by every node's commit index,
  must agree with every node's log;
- leader completeness: a node that becomes leader holds every entry committed so far;
- state machine safety: every node applies the same entries in the same order, contiguously (a digest chains them;
  a snapshot must carry the digest of its index);
- durable acknowledgements: a follower never drops an entry it acknowledged while still in that term;
- liveness is checked by the simulator itself (a proposal after the faults heal must be applied everywhere).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from cluster.raft.core.raft import RaftCore
from cluster.raft.core.types import (
    INDEX_ZERO,
    AppendResp,
    Entry,
    EntryKind,
    GroupId,
    Index,
    NodeId,
    Ready,
    Role,
    Term,
)


class SafetyViolation(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


def chain_digest(previous: int, entry: Entry) -> int:
    return zlib.crc32(entry.term.to_bytes(8, "big") + entry.kind.value.to_bytes(1, "big") + entry.data, previous)


@dataclass(slots=True)
class AppliedState:
    """The simulated state machine of one group on one node: how far it applied and a digest of everything."""

    index: Index = INDEX_ZERO
    digest: int = 0

    def encode(self) -> bytes:
        return f"{self.index}:{self.digest}".encode()

    @staticmethod
    def decode(data: bytes) -> AppliedState:
        if not data:
            return AppliedState()
        index, digest = data.decode().split(":")
        return AppliedState(Index(int(index)), int(digest))


@dataclass(slots=True)
class GroupChecker:
    group: GroupId
    leaders: dict[Term, NodeId] = field(default_factory=dict)
    committed: dict[Index, tuple[Term, EntryKind, bytes]] = field(default_factory=dict)
    seen: dict[tuple[Index, Term], tuple[EntryKind, bytes, Term | None]] = field(default_factory=dict)
    digests: dict[Index, int] = field(default_factory=lambda: {Index(0): 0})
    checked_commit: dict[NodeId, Index] = field(default_factory=dict)
    leader_term_checked: dict[NodeId, Term] = field(default_factory=dict)
    acked: dict[NodeId, tuple[Term, Index]] = field(default_factory=dict)

    def fail(self, kind: str, detail: str) -> None:
        raise SafetyViolation(kind, f"group {self.group}: {detail}")

    def on_persist(self, node: NodeId, core: RaftCore, ready: Ready) -> None:
        for entry in ready.entries:
            prev_term = core.log.term(Index(entry.index - 1))
            fact = (entry.kind, entry.data, prev_term)
            known = self.seen.setdefault((entry.index, entry.term), fact)
            if known != fact:
                self.fail("log-matching", f"{node} persisted ({entry.index},{entry.term}) as {fact}, seen {known}")

    def on_send(self, node: NodeId, term: Term, message: AppendResp) -> None:
        if not message.reject:
            previous = self.acked.get(node)
            if previous is None or (term, message.index) > previous:
                self.acked[node] = (term, message.index)

    def on_apply(self, node: NodeId, state: AppliedState, entry: Entry) -> AppliedState:
        if entry.index != state.index + 1:
            self.fail("state-machine", f"{node} applied {entry.index} after {state.index}")
        self._check_committed(node, entry)
        digest = chain_digest(state.digest, entry)
        known = self.digests.setdefault(entry.index, digest)
        if known != digest:
            self.fail("state-machine", f"{node} applied a different history through {entry.index}")
        return AppliedState(entry.index, digest)

    def on_restore(self, node: NodeId, state: AppliedState) -> None:
        known = self.digests.get(state.index)
        if known is not None and known != state.digest:
            self.fail("state-machine", f"{node} restored a snapshot at {state.index} with a different history")

    def _check_committed(self, node: NodeId, entry: Entry) -> None:
        fact = (entry.term, entry.kind, entry.data)
        known = self.committed.setdefault(entry.index, fact)
        if known != fact:
            self.fail("committed-changed", f"{node} has {fact} at committed index {entry.index}, was {known}")

    def check_core(self, node: NodeId, core: RaftCore) -> None:
        if core.role is Role.LEADER:
            holder = self.leaders.setdefault(core.term, node)
            if holder != node:
                self.fail("election-safety", f"two leaders in term {core.term}: {holder} and {node}")
            if self.leader_term_checked.get(node) != core.term:
                self.leader_term_checked[node] = core.term
                self._check_leader_complete(node, core)
        self._check_commit(node, core)
        acked = self.acked.get(node)
        if acked is not None and acked[0] == core.term and core.log.last_index() < acked[1]:
            self.fail("ack-dropped", f"{node} acknowledged {acked[1]} in term {acked[0]}, now ends at "
                      f"{core.log.last_index()}")

    def _check_commit(self, node: NodeId, core: RaftCore) -> None:
        log = core.log
        start = max(self.checked_commit.get(node, Index(0)), log.snapshot.index)
        for index in range(start + 1, log.committed + 1):
            (entry,) = log.slice(Index(index), Index(index))
            self._check_committed(node, entry)
        self.checked_commit[node] = log.committed

    def _check_leader_complete(self, node: NodeId, core: RaftCore) -> None:
        log = core.log
        for index, (term, _, _) in self.committed.items():
            if index <= log.snapshot.index:
                continue
            if log.term(index) != term:
                self.fail("leader-completeness", f"{node} leads term {core.term} without committed entry {index}")

    def check_electable(self, cores: dict[NodeId, RaftCore]) -> None:
        """No node lacking the newest committed entry may be electable: that entry would be lost if it won.

        In correct Raft a node lacking committed (i, T) has a log less up to date than every node holding it, and
        those are a majority, so it can never gather a majority of votes. This sees figure 8's danger the moment
        the old-term entry is counted as committed, before a later election actually overwrites it.
        """
        if not self.committed or not cores:
            return
        index = max(self.committed)
        term = self.committed[index][0]
        for node, core in cores.items():
            voters = core.membership.voters  # a candidate counts votes in its own view of the membership
            if node not in voters or index <= core.log.snapshot.index or core.log.term(index) == term:
                continue
            mine = (core.log.last_term(), core.log.last_index())
            supporters = [v for v, other in cores.items() if v in voters
                          and (other.log.last_term(), other.log.last_index()) <= mine]
            if len(supporters) * 2 > len(voters):
                self.fail("commit-durability", f"{node} lacks committed entry {index}/{term} yet "
                          f"{sorted(supporters)} would elect it")

    def forget_node_progress(self, node: NodeId) -> None:
        """A restart: re-verify from the reloaded commit index. Acknowledgements stay: they were durable."""
        self.checked_commit.pop(node, None)
        self.leader_term_checked.pop(node, None)
