"""Finding the queue a method names, and the exclusive-queue check (pure; used by every handler module that takes
a queue name: definitions, delivery, publish, replica).

`lookup_queue` expands "" to the channel's last declared queue (`expand_queue_name`) and raises 404 for an unknown
one; `check_exclusive` raises 405 when another connection owns an exclusive queue; `exchange_not_found` is the 404
of an unknown exchange. In replicated mode these errors are first `MetadataUnconfirmed` (`queue_not_found`,
`exchange_not_found`; an owner that is another node's connection): the answer waits
for a metadata read barrier, so a queue whose owner closed (its deletion committed before the close-ok) is not
reported locked here, and a queue declared on another node (committed before its declare-ok) is not reported
missing. `REPLY_TO_QUEUE` is the
pseudo-queue of direct reply-to.
"""

from __future__ import annotations

from node.broker.channel import ChannelState, ConnState
from node.broker.errors import AmqpError, MetadataUnconfirmed, not_found
from node.broker.queues import QueueState
from node.broker.state import BrokerState

REPLY_TO_QUEUE = "amq.rabbitmq.reply-to"


def check_exclusive(conn: ConnState, queue: QueueState) -> None:
    owner = queue.exclusive_owner
    if owner is not None and owner != conn.conn_id:
        if type(owner) is str and not conn.metadata_confirmed:  # another node's connection ("node/boot/conn")
            raise MetadataUnconfirmed(queue.vhost, queue.name)
        raise AmqpError(405, f"cannot obtain exclusive access to locked {queue.resource}. It could be originally "
                             "declared on another connection or the exclusive property value does not match "
                             "that of the original declaration.")


def queue_not_found(broker: BrokerState, conn: ConnState, name: str, vhost: str) -> Exception:
    """The error for a queue this node does not know: 404, or first `MetadataUnconfirmed` where definitions come from other nodes too."""
    if broker.definitions_shared and not conn.metadata_confirmed:
        return MetadataUnconfirmed(vhost, name)
    return not_found("queue", name, vhost)


def exchange_not_found(broker: BrokerState, conn: ConnState, name: str, vhost: str) -> Exception:
    """The error for an exchange this node does not know (a passive declare, a bind's source or destination): 404,
    or first `MetadataUnconfirmed` where definitions come from other nodes too (it may have just been declared
    through another node). A publish to it is not deferred (publish.py): a client that publishes and closes at
    once must get the 404 before its close, and a deferred publish is dropped with its channel."""
    if broker.definitions_shared and not conn.metadata_confirmed:
        return MetadataUnconfirmed(vhost, name)
    return not_found("exchange", name, vhost)


def expand_queue_name(ch: ChannelState, name: str) -> str:
    if name == "":
        if ch.last_queue == "":
            raise AmqpError(404, "no previously declared queue")
        return ch.last_queue
    return name


def lookup_queue(broker: BrokerState, conn: ConnState, ch: ChannelState, name: str) -> QueueState:
    vhost = broker.vhost_of(conn)
    queue = vhost.queues.get(expand_queue_name(ch, name))
    if queue is None:
        raise queue_not_found(broker, conn, name, vhost.name)
    return queue
