"""One-line descriptions of messages and batches for the simulator's trace (and the scripted tests)."""

from __future__ import annotations

from cluster.raft.core.multiraft import NodeBatch
from cluster.raft.core.types import (
    Append,
    AppendResp,
    Heartbeat,
    HeartbeatResp,
    InstallSnapshot,
    Message,
    PreVote,
    PreVoteResp,
    TimeoutNow,
    Vote,
    VoteResp,
)


def describe_message(m: Message) -> str:
    head = f"{m.src}->{m.dst} {type(m).__name__} t{m.term}"
    if isinstance(m, PreVote | Vote):
        extra = " transfer" if isinstance(m, Vote) and m.transfer else ""
        return f"{head} last={m.last_index}/{m.last_term}{extra}"
    if isinstance(m, PreVoteResp | VoteResp):
        return f"{head} {'reject' if m.reject else 'grant'}"
    if isinstance(m, Append):
        entries = ",".join(f"{e.index}/{e.term}" + (f":{e.data.decode(errors='replace')}" if e.data else "")
                           for e in m.entries)
        return f"{head} prev={m.prev_index}/{m.prev_term} commit={m.commit} [{entries}]"
    if isinstance(m, AppendResp):
        if m.reject:
            return f"{head} reject={m.index} hint={m.hint_index}/{m.hint_term}"
        return f"{head} index={m.index}"
    if isinstance(m, Heartbeat):
        return f"{head} commit={m.commit}" + (" quiesce" if m.quiesce else "")
    if isinstance(m, InstallSnapshot):
        return f"{head} snapshot={m.snapshot.index}/{m.snapshot.term}"
    if isinstance(m, HeartbeatResp | TimeoutNow):
        return head
    raise TypeError(m)


def describe_batch(batch: NodeBatch) -> str:
    if not batch.messages:
        return f"{batch.src}->{batch.dst} node-heartbeat inc={batch.incarnation}"
    parts = [f"{group}:{describe_message(message)}" for group, message in batch.messages]
    return f"{batch.src}->{batch.dst} inc={batch.incarnation} " + "; ".join(parts)
