"""Node-local exclusive queues of a cluster: the owner's backend and the other nodes' one (pure).

In a cluster an exclusive queue lives where its owning connection lives, as in RabbitMQ: no Raft group, no
election, no fsync (docs/cluster.md, "Node-local exclusive queues"). Its `QueueRecord` (owner as
"node/boot_id/conn_id") is in the metadata group, so every node knows it: other connections get 405 and publishes
on any node route to it.

- `OwnedBackend`, on the owner's node: the queue machine lives in this process and commands apply at once, as a
  single node's `LocalBackend`, but nothing goes to this node's storage (an exclusive queue dies with its
  connection); its definition and deletion go to the metadata group. A publish routed here is enqueued at once
  (`replica_publish._route`) and confirmed at once.
- `RemoteBackend`, on every other node: holds no messages (its machine stays empty). A publish routed here leaves
  as a `ForwardPublish` effect; the runtime sends it to the owner's node over a node-to-node link with confirms
  (node/runtime/cluster/forward.py) and reports the owner's answer with `Broker.forward_outcome`, which releases
  the publisher's confirm (or nack) through the same outcome path as a Raft queue's (`replica_publish.on_outcome`).
  Forwarded publishes count as in flight for credit flow (node/broker/credit_flow.py).

The owner closing deletes the queue (a metadata deletion every node mirrors); the owner's node dying is handled by
the metadata leader (it deletes the exclusive queues of nodes recorded down, node/runtime/cluster/liveness.py).
"""

from __future__ import annotations

from typing import Any

from cluster.queue import Declare, Purge, Purged, Queue, SetArgs
from node.amqp import methods as m
from node.broker import credit_flow, definitions, delivery, replica_publish
from node.broker.backend import PublishPath, QueueBackend, backend_of, expiry_deadline_ms
from node.broker.channel import ChannelState, Consumer
from node.broker.effects import Send
from node.broker.errors import AmqpError
from node.broker.policies import machine_args
from node.broker.queues import QueueState, queue_args
from node.broker.records import QueueRecord
from node.broker.replica_machine import ACCEPTED, REJECTED, global_owner
from node.broker.state import BrokerState
from node.broker.vhost import VHost


def _persist_definition(broker: BrokerState, vhost: str, queue: QueueState) -> None:
    owner = global_owner(broker, queue.exclusive_owner)
    broker.persist((QueueRecord(vhost, queue.name, queue.auto_delete, queue.arguments, durable=queue.durable,
                                exclusive_owner=owner),))


class OwnedBackend(QueueBackend):
    """An exclusive queue whose owner is a connection of this node (see the module docstring)."""

    name = "owned"

    def create(self, broker: BrokerState, vhost: VHost[QueueState], queue: QueueState) -> None:
        queue.machine = Queue(queue.name, queue_args(queue.arguments, queue.auto_delete))
        queue.machine.apply(Declare(broker.now_ms))  # (x-expires counts from here; an empty machine: no effect)
        _persist_definition(broker, vhost.name, queue)

    def delete(self, broker: BrokerState, queue: QueueState) -> None:
        replica_publish.forget_queue(broker, queue)
        broker.persist((QueueRecord(queue.vhost, queue.name, deleted=True),))

    def purge(self, broker: BrokerState, ch: ChannelState, queue: QueueState, nowait: bool) -> None:
        count = 0
        for effect in queue.machine.apply(Purge()):
            if isinstance(effect, Purged):
                count += effect.count
        if not nowait:
            broker.out.append(Send(ch.conn_id, ch.number, m.QueuePurgeOk(message_count=count)))

    def get(self, broker: BrokerState, ch: ChannelState, queue: QueueState, no_ack: bool) -> None:
        delivery.get_now(broker, ch, queue, no_ack)

    def declared(self, broker: BrokerState, queue: QueueState) -> None:
        delivery.apply_queue(broker, queue, Declare(broker.now_ms))

    def consumer_count(self, queue: QueueState) -> int:
        return len(queue.consumers)

    def apply_args(self, broker: BrokerState, queue: QueueState, merged: dict[str, Any]) -> None:
        wanted = machine_args(merged, queue.auto_delete)
        if queue.machine.args != wanted:
            delivery.apply_queue(broker, queue, SetArgs(wanted, broker.now_ms))

    def tick(self, broker: BrokerState) -> None:
        definitions.expire_queues(broker, broker.now_ms, self)

    def next_deadline_ms(self, broker: BrokerState) -> int | None:
        return expiry_deadline_ms(broker, self)

    def after_read(self, broker: BrokerState, conn_id: int) -> None:
        """(Credit flow of every queue is `ReplicatedBackend.after_read`'s, node/broker/credit_flow.py.)"""


def _locked(queue: QueueState) -> AmqpError:
    return AmqpError(405, f"cannot obtain exclusive access to locked {queue.resource}. It could be originally "
                          "declared on another connection or the exclusive property value does not match that of "
                          "the original declaration.")


class RemoteBackend(QueueBackend):
    """An exclusive queue owned by a connection of another node (see the module docstring)."""

    name = "remote"
    publish_path = PublishPath.FORWARD

    def create(self, broker: BrokerState, vhost: VHost[QueueState], queue: QueueState) -> None:
        queue.machine = Queue(queue.name, queue_args(queue.arguments))  # stays empty: the owner's node holds it

    def delete(self, broker: BrokerState, queue: QueueState) -> None:
        """Forwarded publishes still out are acked (as for a gone queue). The deletion is written too: it is a
        no-op while mirroring the owner's deletion, and it removes a queue whose owner was a connection of this
        node's earlier life (node/broker/committed_definitions.py deletes those)."""
        replica_publish.forget_queue(broker, queue)
        queue.flow_inflight = 0
        broker.persist((QueueRecord(queue.vhost, queue.name, deleted=True),))

    def purge(self, broker: BrokerState, ch: ChannelState, queue: QueueState, nowait: bool) -> None:
        raise _locked(queue)  # (check_exclusive refuses first: another node's connection owns it)

    def get(self, broker: BrokerState, ch: ChannelState, queue: QueueState, no_ack: bool) -> None:
        raise _locked(queue)

    def declared(self, broker: BrokerState, queue: QueueState) -> None:
        """(Only the owner may declare it, on its own node.)"""

    def consumer_count(self, queue: QueueState) -> int:
        return 0  # (not known here; only the owner may ask, on its own node)

    def credit_window(self, window: int, consumer: Consumer, prefetch: int) -> int:
        return window

    def apply_args(self, broker: BrokerState, queue: QueueState, merged: dict[str, Any]) -> None:
        """The owner's node applies policies to the queue it holds."""

    def tick(self, broker: BrokerState) -> None:
        """No timers: the owner's node runs them."""

    def next_deadline_ms(self, broker: BrokerState) -> int | None:
        return None

    def after_read(self, broker: BrokerState, conn_id: int) -> None:
        """(Credit flow: `ReplicatedBackend.after_read`.)"""


def forward_outcome(broker: BrokerState, vhost: str, name: str, publisher_id: Any, sequence: int, acked: bool,
                    messages: int = 1) -> None:
    """The owner's node answered `messages` forwarded publishes of `publisher_id` (its confirm or nack)."""
    queue = broker.vhosts[vhost].queues.get(name) if vhost in broker.vhosts else None
    if queue is not None and queue.backend is not None and backend_of(queue).publish_path is PublishPath.FORWARD:
        credit_flow.inflight_done(queue, messages)
    if publisher_id is not None and sequence:
        replica_publish.on_outcome(broker, (vhost, name), publisher_id, sequence, ACCEPTED if acked else REJECTED)
