"""Replicated mode's queue machine stand-in, and the ids that say which node a party belongs to (pure).

Every queue's `QueueState.machine` is a `ProposingMachine` (docs/cluster.md): its `apply(command)` emits
`ProposeQueue` (through `propose`) and returns no effects, and the reads the shared handlers make of any queue's
machine (`ready_count`, `next_expiry_ms()`, `args`, ...: its properties) are answered by the local replica
(`.replica`, a `cluster.queue.replicated.ReplicatedQueue`), so the single-node handlers run unchanged and propose
instead of applying; replicated-only code reads the replica's machine itself (`replica_of(queue).queue`). Consumer ids are `ConsumerId(node, boot_id, n)`,
getter ids `GetterId(node, boot_id, n)` (cluster/queue/ids.py), exclusive owners "node/boot_id/conn_id" cluster-wide (`global_owner`,
`local_owner`). ACCEPTED, DUPLICATE and REJECTED name a target queue's answer to a publish. The rest of
replicated mode is built on this module: replica_wire (below it), replica_dead_letters, replica_publish, replica,
replica_control.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Final

from cluster.queue import Detach, Enqueue, QueueArgs
from cluster.queue.ids import ConsumerId, GetterId
from cluster.queue.replicated import ReplicatedQueue
from node.broker import read_your_writes
from node.broker.effects import ProposeQueue
from node.broker.queues import QueueState
from node.broker.replica_wire import Batch
from node.broker.state import BrokerState

TRACKED_IDS_MAX: Final = 65536  # bound of the detaching / down-consumer sets (cleared when full)
ACCEPTED, DUPLICATE, REJECTED = "accepted", "duplicate", "rejected"


# --- ids -------------------------------------------------------------------------------------------------------


def _id_parts(cid: Any) -> tuple[Any, Any]:
    """(node, boot_id) of a `ConsumerId` or `GetterId`; else (None, None)."""
    kind = type(cid)
    if kind is ConsumerId or kind is GetterId:
        return cid.node, cid.boot
    return None, None


def id_node(cid: Any) -> Any:
    return _id_parts(cid)[0]


def is_local(broker: BrokerState, cid: Any) -> bool:
    """An id of this node's current life."""
    return _id_parts(cid) == (broker.config.node_name, broker.config.boot_id)


def is_stale(broker: BrokerState, cid: Any) -> bool:
    """An id of an earlier life of this node."""
    node, boot = _id_parts(cid)
    return bool(node == broker.config.node_name and boot != broker.config.boot_id)


def global_owner(broker: BrokerState, owner: int | str | None) -> str | None:
    """An exclusive owner as the cluster knows it: "node/boot_id/conn_id" for a local connection."""
    if isinstance(owner, int):
        return f"{broker.config.node_name}/{broker.config.boot_id}/{owner}"
    return owner


def local_owner(broker: BrokerState, owner: str | None) -> tuple[int | str | None, bool]:
    """(the owner as QueueState keeps it, whether it is a connection of an earlier life of this node)."""
    if owner is None:
        return None, False
    parts = owner.rsplit("/", 2)
    if len(parts) == 3 and parts[0] == broker.config.node_name:
        if parts[1] == str(broker.config.boot_id) and parts[2].isdigit():
            return int(parts[2]), False
        return owner, True
    return owner, False


def track(ids: dict[Hashable, None], cid: Hashable) -> None:
    if len(ids) >= TRACKED_IDS_MAX:
        ids.clear()
    ids[cid] = None


# --- the proposing machine ---------------------------------------------------------------------------------------


class ProposingMachine:
    """Stands where the queue machine stands in single-node mode: commands are proposed, reads hit the replica."""

    __slots__ = ("_broker", "_queue", "batch", "replica")

    def __init__(self, broker: BrokerState, queue: QueueState, args: QueueArgs) -> None:
        self._broker = broker
        self._queue = queue
        self.replica = ReplicatedQueue(queue.name, args)
        self.batch: Batch | None = None  # the open publish batch (propose_enqueue)
        queue.is_leader = (queue.vhost, queue.name) in broker.leading

    def apply(self, command: Any) -> list[Any]:
        propose(self._broker, self._queue, command)
        return []

    # The reads the shared handlers and the management views make of any queue's machine, answered by the local
    # replica. Replicated-only code reads the replica itself (`replica_of(queue).queue`).

    @property
    def args(self) -> QueueArgs:
        return self.replica.queue.args

    @property
    def ready_count(self) -> int:
        return self.replica.queue.ready_count

    @property
    def ready_bytes(self) -> int:
        return self.replica.queue.ready_bytes

    @property
    def unacked_count(self) -> int:
        return self.replica.queue.unacked_count

    @property
    def consumer_count(self) -> int:
        return self.replica.queue.consumer_count

    @property
    def held_count(self) -> int:
        return self.replica.queue.held_count

    @property
    def held_bytes(self) -> int:
        return self.replica.queue.held_bytes

    @property
    def paged_count(self) -> int:
        """Always 0 (a replicated queue's machine never pages), read by declare-ok and delete's message count."""
        return self.replica.queue.paged_count

    def next_expiry_ms(self) -> int | None:
        return self.replica.queue.next_expiry_ms()


def propose(broker: BrokerState, queue: QueueState, command: Any) -> int:
    if type(command) is Detach and is_local(broker, command.consumer_id):
        track(broker.detaching, command.consumer_id)
    machine = queue.machine
    if type(machine) is ProposingMachine and machine.batch is not None:
        machine.batch.seal()
        machine.batch = None  # a later publish must not overtake this command: it starts a new batch
    if type(command) is Enqueue:
        queue.flow_inflight += 1  # credit_flow.py: applied (or given up) later
    proposal_id = broker.new_proposal_id()
    conn = broker.proposing_conn
    if conn is not None:
        read_your_writes.issue(broker, conn, queue, proposal_id)
    broker.out.append(ProposeQueue(queue.vhost, queue.name, command, proposal_id))
    return proposal_id


def queue_of(broker: BrokerState, vhost: str, name: str) -> QueueState | None:
    vh = broker.vhosts.get(vhost)
    queue = vh.queues.get(name) if vh is not None else None
    return queue if queue is not None and isinstance(queue.machine, ProposingMachine) else None


def replica_of(queue: QueueState) -> ReplicatedQueue:
    machine: ProposingMachine = queue.machine
    return machine.replica
