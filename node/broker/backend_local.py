"""The local queue backend: the queue machine lives in this process and commands apply at once (pure).

A single node's queues. The machine is a `cluster.queue.Queue`; a durable, non-exclusive queue writes its
definition and persistent messages to the node's own storage, and may keep its backlog on disk (paging). Its
timers (message TTL, x-expires: `Expire` when the machine's `next_expiry_ms()` is due) and the memory alarm's
spilling run from `tick`; credit flow slows a publisher
whose queues have a backlog their consumers drain (`after_read` remembers the queues a read published to,
`publish_flow_behind` answers the runtime through `Broker.publish_flow_behind`). See node/broker/backend.py for
the interface.
"""

from __future__ import annotations

from typing import Any

from cluster.queue import Declare, MemoryPressure, PagedDropped, Purge, Purged, Queue, SetArgs
from node.amqp import methods as m
from node.broker import definitions, delivery, paged_tail, paging
from node.broker.backend import QueueBackend, expiry_deadline_ms
from node.broker.channel import ChannelState
from node.broker.effects import Send
from node.broker.policies import machine_args
from node.broker.queues import QueueState, queue_args
from node.broker.records import MessageRemovedRecord, QueueRecord
from node.broker.state import BrokerState
from node.broker.vhost import VHost

FLOW_ROUTES_MAX = 64  # queues remembered per publishing connection for `publish_flow_behind`


class LocalBackend(QueueBackend):
    """The queue machine in this process (see the module docstring)."""

    name = "local"
    can_page = True

    def create(self, broker: BrokerState, vhost: VHost[QueueState], queue: QueueState) -> None:
        queue.machine = Queue(queue.name, queue_args(queue.arguments, queue.auto_delete),
                              page_limit=paging.page_limit(broker))  # (paging: node/broker/paging.py)
        queue.machine.apply(Declare(broker.now_ms))  # (x-expires counts from here; an empty machine: no effect)
        floor = paging.memory_floor(broker)
        if floor is not None:
            queue.machine.apply(MemoryPressure(floor))  # (an empty machine: no effect)
        if queue.stored:
            broker.persist((QueueRecord(vhost.name, queue.name, queue.auto_delete, queue.arguments),))

    def delete(self, broker: BrokerState, queue: QueueState) -> None:
        if queue.stored:
            broker.persist((QueueRecord(queue.vhost, queue.name, deleted=True),))

    def purge(self, broker: BrokerState, ch: ChannelState, queue: QueueState, nowait: bool) -> None:
        """At once; the machine's paged tail goes too (its records removed after the ready ones')."""
        count = 0
        ready_ids = set(queue.machine.ready_msg_ids()) if queue.persisted_ids else set()
        dropped: PagedDropped | None = None
        for effect in queue.machine.apply(Purge()):
            if isinstance(effect, Purged):
                count += effect.count
            elif isinstance(effect, PagedDropped):
                dropped = effect
        if queue.persisted_ids:
            # the ready ones before the purge (computed after it, "unacked" would be every persisted id)
            removed = queue.persisted_ids & ready_ids
            queue.persisted_ids -= removed
            broker.persist(tuple(MessageRemovedRecord(queue.vhost, queue.name, i) for i in sorted(removed)))
        if dropped is not None:
            paged_tail.paged_dropped(broker, queue, dropped)
        if not nowait:
            broker.out.append(Send(ch.conn_id, ch.number, m.QueuePurgeOk(message_count=count)))

    def get(self, broker: BrokerState, ch: ChannelState, queue: QueueState, no_ack: bool) -> None:
        delivery.get_now(broker, ch, queue, no_ack)

    def declared(self, broker: BrokerState, queue: QueueState) -> None:
        delivery.apply_queue(broker, queue, Declare(broker.now_ms))

    def consumer_count(self, queue: QueueState) -> int:
        return len(queue.consumers)

    def apply_args(self, broker: BrokerState, queue: QueueState, merged: dict[str, Any]) -> None:
        """`SetArgs` applies to the machine at once (its effects, e.g. drop-head or dead letters past a new
        max-length, handled as any command's; whether it may page follows its arguments)."""
        wanted = machine_args(merged, queue.auto_delete)
        if queue.machine.args != wanted:
            delivery.apply_queue(broker, queue, SetArgs(wanted, broker.now_ms))

    def tick(self, broker: BrokerState) -> None:
        definitions.expire_queues(broker, broker.now_ms, self)
        paging.spill_under_alarm(broker)  # (only under the memory alarm)

    def next_deadline_ms(self, broker: BrokerState) -> int | None:
        return expiry_deadline_ms(broker, self)

    def after_read(self, broker: BrokerState, conn_id: int) -> None:
        """Remember the queues this read published to (`publish_flow_behind` looks at their backlog)."""
        touched = broker.flow_touched
        if touched:
            broker.flow_routes[conn_id] = list(touched.values())[:FLOW_ROUTES_MAX]
            touched.clear()
        elif broker.flow_routes:
            broker.flow_routes.pop(conn_id, None)


def publish_flow_behind(broker: BrokerState, conn_id: int) -> int:
    """Credit flow for the runtime: the ready messages of the fullest queue this connection's last read
    published to (`LocalBackend.after_read`) that has more than `publish_flow_ready_max` of them and a consumer
    whose connection drains (so deliveries, not the socket, are behind); 0 when there is none. The runtime then
    reads the publisher more slowly, as RabbitMQ's credit flow does, while the count goes down."""
    queues = broker.flow_routes.get(conn_id)
    limit = broker.config.publish_flow_ready_max
    if not queues or limit <= 0:
        return 0
    backlog = 0
    for queue in queues:
        ready = queue.machine.ready_count
        if ready > limit and ready > backlog and _has_draining_consumer(queue):
            backlog = ready
    return backlog


def _has_draining_consumer(queue: QueueState) -> bool:
    for consumer in queue.consumers.values():
        conn = consumer.channel.conn
        if conn is not None and conn.writable and not consumer.cancelled and not consumer.channel.closed:
            return True
    return False
