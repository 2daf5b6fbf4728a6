"""Regression: an ack followed by a clean channel close must never be redelivered (docs/chaos.md, finding).

The cause: a consumer's ack is proposed as `Settle`, its channel close as `Detach`, in that order, but one copy of
a proposal can be overtaken by a later proposal on the way into the queue's log. The Raft router holds a command
while no leader is known and the runtime used to route fresh commands before the held ones in the loop turn in which
the leader becomes known (fixed: `test_the_raft_runtime_routes_held_commands_before_fresh_ones`), and a forward can be lost with
its connection while the next one gets through; the runtime's retry then puts the lost `Settle` into the log after
the `Detach`, whose effect (the consumer's unacked messages return, redelivered) has already handed the acked
message to another consumer. The fix (node/clustering/proposals.py): a `Detach` is a barrier, proposed only
once every earlier proposal of its queue was applied (or given up).
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cluster.queue import (
    Attach,
    Deliver,
    Detach,
    Enqueue,
    MsgId,
    Proposal,
    QueueCommand,
    QueuedMessage,
    ReplicatedQueue,
    Settle,
    decode_proposal,
)
from cluster.queue.envelope import PROPOSAL_IDS_PER_BOOT, Envelope, EnvelopeCodec
from cluster.raft.core.types import Entry, GroupId, Index, NodeId, Role, Term
from cluster.raft.runtime.codec import Command, Forward
from cluster.raft.runtime.node import RaftNodeRuntime
from node.broker.effects import ProposeQueue
from node.clustering.proposals import Pending, ProposalTracker
from node.runtime.cluster.runtime import ClusterRuntime
from node.runtime.config import NodeConfig, cluster_layout

SECRET = "0123456789abcdef-secret"
GROUP = GroupId("q/%2F/orders")
C1 = ("a", 7, 1)  # the consumer on node a that acks and closes
C2 = ("b", 9, 1)  # another consumer of the queue, on node b


def _payload(value: Any) -> Any:
    return value


# ------------------------------------------------------------------------------------------- the exact cause


async def test_the_raft_runtime_routes_held_commands_before_fresh_ones() -> None:
    """A follower that knows no leader holds the Settle. In the loop turn in which it learns the leader (from an
    append it steps in that turn; no tick, no recheck) it routes before it notices leaders after the cycles: the
    held Settle must still go before the fresh Detach (cluster/raft/runtime/node.py `_step_inbox`, `_route`; it
    used to forward the Detach first and the Settle one turn later, so the leader appended them out of order)."""
    core = SimpleNamespace(role=Role.FOLLOWER, lead=None)

    def step(batch: Any) -> None:
        core.lead = batch.src  # an append from the new leader

    multi: Any = SimpleNamespace(groups={GROUP: core}, step=step)
    runtime = RaftNodeRuntime(NodeId("a"), Path("unused"), ("127.0.0.1", 0), {}, b"secret", lambda g, e: None,
                              telemetry=False, forward_hold_ms=2000)
    sent: list[Forward] = []
    runtime.transport = SimpleNamespace(send_forward=sent.append)  # type: ignore[assignment]
    runtime.router.offer(Command("propose", GROUP, b"settle"))
    assert runtime._step_inbox(multi) == (set(), False)
    runtime._route(multi, retry_held=False)
    assert sent == [] and runtime.router.held_count == 1
    runtime._inbox.append(SimpleNamespace(src=NodeId("b"), messages=[(GROUP, None)]))  # type: ignore[arg-type]
    runtime.router.offer(Command("propose", GROUP, b"detach"))
    touched, leader_learned = runtime._step_inbox(multi)  # the _loop turn: step, then route
    runtime._route(multi, retry_held=leader_learned)  # no tick, no recheck in this turn
    assert touched == {GROUP} and leader_learned
    assert [c.data for f in sent for c in f.commands] == [b"settle", b"detach"]
    assert runtime.router.held_count == 0


# ------------------------------------------------------------------------------------------- the runtime fix


class FakeBroker:
    """Just the broker calls the runtime's proposal path makes."""

    def __init__(self) -> None:
        self.envelope_codec = EnvelopeCodec("a", _payload, _payload)
        self.proposal_ids = itertools.count(7 * PROPOSAL_IDS_PER_BOOT)  # the broker numbers its proposals

    def propose(self, command: QueueCommand) -> ProposeQueue:
        return ProposeQueue("/", "orders", command, next(self.proposal_ids))

    def apply_committed(self, vhost: str, queue: str, envelopes: Any) -> list[Any]:
        return []

    def proposal_abandoned(self, vhost: str, queue: str, envelope: Envelope) -> list[Any]:
        return []


class FakeNode:
    def __init__(self) -> None:
        self.effect_sinks: dict[type, Any] = {}

    def dispatch(self, effects: Any) -> None:
        self.apply_effects(effects)

    def apply_effects(self, effects: Any) -> None:
        for effect in effects:
            self.effect_sinks[type(effect)](effect)


class LossyLog:
    """The queue group: every proposal handed to it is appended in arrival order, except copies the test says
    are lost on the way (a dropped forward, a held command overtaken). `commit` applies the appended entries to a
    replica of the queue and reports them to the runtime, as the Raft apply callback does."""

    def __init__(self, runtime: ClusterRuntime, replica: ReplicatedQueue) -> None:
        self.runtime = runtime
        self.replica = replica
        self.inbox: list[bytes] = []
        self.lose_first: set[type] = set()
        self.index = 0
        self.log: list[str] = []
        self.deliveries: list[Deliver] = []
        self.timing = None  # RaftNodeRuntime's stage timings: off, as without RAFTMQ_RAFT_TIMING

    def propose(self, group: GroupId, data: bytes) -> bool:
        kind = type(decode_proposal(data, _payload).command)
        if kind in self.lose_first:
            self.lose_first.discard(kind)
            return True
        self.inbox.append(data)
        return True

    def commit(self) -> None:
        while self.inbox:
            data = self.inbox.pop(0)
            self.index += 1
            proposal = decode_proposal(data, _payload)
            effects = self.replica.apply(proposal)
            if effects is not None:
                self.log.append(type(proposal.command).__name__)
                self.deliveries.extend(e for e in effects if isinstance(e, Deliver))
            self.runtime._on_apply_many(GROUP, (Entry(Term(1), Index(self.index), data),))  # may propose (released barriers)


def _runtime() -> tuple[ClusterRuntime, LossyLog]:
    config = dataclasses.replace(
        NodeConfig(), node_name="a", cluster_secret=SECRET,
        cluster_nodes=("a=127.0.0.1:5000", "b=127.0.0.1:5001", "c=127.0.0.1:5002"))
    runtime = ClusterRuntime(config, cluster_layout(config), FakeBroker(), boot_id=7)
    runtime.attach(FakeNode())
    replica = ReplicatedQueue("orders")
    message = QueuedMessage(b"m1", 2, True)
    setup: list[QueueCommand] = [Attach(C1, 0), Enqueue(message, 0, "pub", 1), Attach(C2, 0)]
    for n, command in enumerate(setup, start=1):
        replica.apply(Proposal("setup", n, command))  # m1 (msg id 1) is delivered to C1 and unacked
    assert list(replica.queue.unacked_msg_ids(C1)) == [1]
    log = LossyLog(runtime, replica)
    runtime.raft = log  # type: ignore[assignment]
    runtime.group_queues[GROUP] = ("/", "orders")
    return runtime, log


def test_an_acked_message_is_not_redelivered_when_the_settle_copy_is_lost() -> None:
    runtime, log = _runtime()
    log.lose_first = {Settle}  # the Settle's first copy is lost on its way to the leader
    runtime._on_propose(runtime.broker.propose(Settle(C1, (MsgId(1),))))  # basic.ack
    runtime._on_propose(runtime.broker.propose(Detach(C1, 0)))  # channel.close
    log.commit()
    assert runtime.stats["barriers_held"] == 1  # the Detach waits for the Settle
    runtime._send_group(GROUP, 10_000)  # the retry timer sends the group's proposals again
    log.commit()
    assert log.log == ["Settle", "Detach"]
    assert [d.consumer_id for d in log.deliveries] == []  # m1 was never handed to C2
    assert log.replica.queue.ready_count == 0 and len(runtime.tracker) == 0


def test_a_detach_with_nothing_before_it_goes_at_once() -> None:
    runtime, log = _runtime()
    runtime._on_propose(runtime.broker.propose(Detach(C1, 0)))
    log.commit()
    assert log.log == ["Detach"] and runtime.stats["barriers_held"] == 0
    assert [(d.consumer_id, d.redelivered) for d in log.deliveries] == [(C2, True)]  # unacked: back, flagged


def test_a_detach_waits_for_an_earlier_settle_that_is_given_up() -> None:
    runtime, log = _runtime()
    log.lose_first = {Settle}
    runtime._on_propose(runtime.broker.propose(Settle(C1, (MsgId(1),))))
    runtime._on_propose(runtime.broker.propose(Detach(C1, 0)))
    log.commit()
    assert log.log == []
    settle = runtime.tracker.of_group(GROUP)[0]
    settle.first_ms -= runtime.config.proposal_timeout_ms  # the Settle alone is past its time
    expired = runtime.tracker.expired(settle.first_ms + runtime.config.proposal_timeout_ms)
    assert expired == [settle]
    runtime._abandon(settle)  # as the retry timer does
    runtime._release(GROUP)
    log.commit()
    assert log.log == ["Detach"]  # the ack is lost (at least once), but the Detach is not stuck behind it


# ------------------------------------------------------------------------------------------- the tracker


def _pending(tracker: ProposalTracker, barrier: bool = False) -> Pending:
    pending = Pending(tracker.next_id(), "g", "/", "q", b"x", 0, barrier=barrier)
    tracker.add(pending)
    return pending


def test_a_barrier_goes_once_everything_before_it_applied() -> None:
    tracker = ProposalTracker(first_id=1)
    settle, detach, publish, detach2 = _pending(tracker), _pending(tracker, True), _pending(tracker), \
        _pending(tracker, True)
    assert tracker.held_back(detach) and tracker.held_back(detach2) and not tracker.held_back(publish)
    assert tracker.sendable("g") == [settle, publish]  # later ordinary proposals are not held back
    assert tracker.released("g") == []
    tracker.applied(settle.proposal_id)
    assert tracker.sendable("g") == [detach, publish] and tracker.released("g") == [detach]
    detach.sent_ms = 5
    assert tracker.released("g") == []
    tracker.applied(publish.proposal_id)
    assert tracker.released("g") == [detach2]  # only barriers before it: both may go, in order
    assert tracker.sendable("g") == [detach, detach2]
    tracker.applied(detach.proposal_id)
    tracker.applied(detach2.proposal_id)
    assert not tracker.has_barriers("g") and len(tracker) == 0


def test_dropping_a_group_forgets_its_barriers() -> None:
    tracker = ProposalTracker(first_id=1)
    _pending(tracker)
    _pending(tracker, True)
    assert tracker.has_barriers("g")
    assert len(tracker.drop_group("g")) == 2 and not tracker.has_barriers("g")
