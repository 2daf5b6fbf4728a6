"""The replicated queue backend: the queue machine is this node's replica of the queue's log (pure).

Every non-exclusive queue of a cluster: quorum and classic queues, whose log is a Raft group, and mirrored queues,
whose log is a mirror log (ISR, leader epochs: node/runtime/cluster/mirror_groups.py); the broker sees the same
committed entries from both (docs/cluster.md, "node/broker, replicated mode"). The machine is
a `replica_machine.ProposingMachine`: commands come out as `ProposeQueue` effects and reads answer from the local
replica; committed entries come back through `Broker.apply_committed` (node/broker/replica.py). A publish is
confirmed when its Enqueue is applied; the definition goes to the cluster's metadata group (with the exclusive
owner as "node/boot/conn"). Consumers cluster-wide count (the machine knows every node's Attach); the machine
decides auto-delete and x-expires (`QueueUnused`, `QueueExpired`: the node that proposed the command deletes the
queue, node/broker/replica.py) and the leader proposes `Expire` when its `next_expiry_ms()` is due
(`replica_control.tick`); credit flow pauses a publisher while
its queues are behind (node/broker/credit_flow.py). See node/broker/backend.py for the interface.
"""

from __future__ import annotations

from typing import Any, Final

from cluster.queue import Declare
from node.broker import (
    credit_flow,
    policy_apply,
    read_your_writes,
    replica,
    replica_control,
    replica_machine,
)
from node.broker.backend import PublishPath, QueueBackend
from node.broker.channel import ChannelState, Consumer
from node.broker.policies import machine_args
from node.broker.queues import QueueState, queue_args
from node.broker.records import QueueRecord
from node.broker.replica_publish import forget_queue
from node.broker.state import BrokerState
from node.broker.vhost import VHost

CREDIT_WINDOW_MAX: Final = 4096  # the largest credit window of a consumer with a prefetch (`credit_window`)


class ReplicatedBackend(QueueBackend):
    """A replica of the queue's Raft group (see the module docstring)."""

    name = "raft"
    publish_path = PublishPath.PROPOSE

    def create(self, broker: BrokerState, vhost: VHost[QueueState], queue: QueueState) -> None:
        queue.machine = replica_machine.ProposingMachine(broker, queue,
                                                         queue_args(queue.arguments, queue.auto_delete))
        owner = replica_machine.global_owner(broker, queue.exclusive_owner)
        broker.persist((QueueRecord(vhost.name, queue.name, queue.auto_delete, queue.arguments,
                                    durable=queue.durable, exclusive_owner=owner),))

    def delete(self, broker: BrokerState, queue: QueueState) -> None:
        forget_queue(broker, queue)
        broker.persist((QueueRecord(queue.vhost, queue.name, deleted=True),))

    def purge(self, broker: BrokerState, ch: ChannelState, queue: QueueState, nowait: bool) -> None:
        replica.queue_purge(broker, ch, queue, nowait)

    def get(self, broker: BrokerState, ch: ChannelState, queue: QueueState, no_ack: bool) -> None:
        replica.basic_get(broker, ch, queue, no_ack)

    def declared(self, broker: BrokerState, queue: QueueState) -> None:
        """A `Declare` proposal, only when x-expires counts (a declare is a use; otherwise nothing to tell)."""
        if queue.machine.args.expires_ms is not None:
            queue.machine.apply(Declare(broker.now_ms))

    def consumer_count(self, queue: QueueState) -> int:
        return int(queue.machine.consumer_count)  # every node's: the Attaches the replica applied

    def credit_window(self, window: int, consumer: Consumer, prefetch: int) -> int:
        """Twice the prefetch (at most CREDIT_WINDOW_MAX) for a consumer with one: every top-up is an AddCredit
        through Raft (a commit round trip, tens of ms on a loaded node), so a window smaller than the prefetch,
        not the client, capped deliveries at about a window per round trip; the prefetch bounds what the node
        holds for the consumer anyway."""
        if prefetch and not consumer.no_ack:
            return max(window, min(2 * prefetch, CREDIT_WINDOW_MAX))
        return window

    def apply_args(self, broker: BrokerState, queue: QueueState, merged: dict[str, Any]) -> None:
        """Only the queue's Raft leader proposes `SetArgs`, and only when the replica's arguments differ (a retry
        is harmless: the same arguments again), so all replicas change at one log index."""
        policy_apply.propose_if_leader(broker, queue, machine_args(merged, queue.auto_delete))

    def tick(self, broker: BrokerState) -> None:
        read_your_writes.expire(broker)
        replica_control.tick(broker)
        if broker.now_ms - broker.policy_checked_ms >= policy_apply.POLICY_RESEND_MS:
            broker.policy_checked_ms = broker.now_ms
            policy_apply.resend_leader_policies(broker)

    def next_deadline_ms(self, broker: BrokerState) -> int | None:
        due = replica_control.next_deadline_ms(broker)
        stall = credit_flow.next_deadline_ms(broker)
        return due if stall is None else stall if due is None else min(due, stall)

    def after_read(self, broker: BrokerState, conn_id: int) -> None:
        credit_flow.after_read(broker, conn_id)
