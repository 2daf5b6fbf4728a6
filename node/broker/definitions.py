"""Exchange, queue and binding methods: declare, delete, bind, unbind, purge (pure handlers on the Broker).

Checks run in RabbitMQ's order: name rules (default exchange, reserved "amq." prefix), permissions, existence,
exclusivity, then equivalence. Durable definitions produce `Persist` effects on the "definitions" stream. Deleting a
queue removes its bindings (auto-delete exchanges may follow), cancels its consumers with a server-sent basic.cancel
and forgets its messages; `expire_queues` applies x-expires and message TTL on `tick`. A new queue gets the
arguments of the policy that applies to it (node/broker/policies.py).
"""

from __future__ import annotations

from typing import Any

from cluster.queue import Expire
from node.amqp import methods as m
from node.broker import delivery, paged_tail, paging, policy_apply, vhost_limits
from node.broker.backend import QueueBackend, backend_of
from node.broker.channel import ChannelState, ConnState
from node.broker.effects import Effect, Send
from node.broker.errors import AmqpError, access_refused, precondition
from node.broker.exchanges import EXCHANGE_TYPES, Binding, Dest, Exchange
from node.broker.headers_match import x_match_mode
from node.broker.queue_lookup import (
    check_exclusive,
    exchange_not_found,
    expand_queue_name,
    lookup_queue,
    queue_not_found,
)
from node.broker.queues import (
    EQUIVALENCE_ARGS,
    QueueState,
    assert_args_equivalent,
    assert_flag_equivalent,
    inequivalent,
    validate_queue_args,
)
from node.broker.records import BindingRecord, ExchangeRecord, MessageRemovedRecord
from node.broker.state import BrokerState
from node.broker.vhost import VHost


def _send(broker: BrokerState, ch: ChannelState, method: Any) -> None:
    broker.out.append(Send(ch.conn_id, ch.number, method))


def exchange_resource(name: str, vhost: str) -> str:
    return f"exchange '{name}' in vhost '{vhost}'"


def _default_exchange_refused() -> AmqpError:
    return access_refused("operation not permitted on the default exchange")


# --- exchanges --------------------------------------------------------------------------------------------------


def exchange_declare(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.ExchangeDeclare) -> None:
    vhost = broker.vhost_of(conn)
    name = method.exchange
    resource = exchange_resource(name, vhost.name)
    if name == "":  # passive too, as RabbitMQ 3.10
        raise _default_exchange_refused()
    if method.passive:
        if name not in vhost.exchanges:
            raise exchange_not_found(broker, conn, name, vhost.name)
        _reply(broker, ch, method.nowait, m.ExchangeDeclareOk())
        return
    broker.check_access(conn, "configure", "exchange", name)
    if method.type not in EXCHANGE_TYPES:
        raise AmqpError(503, f"invalid exchange type '{method.type}'", connection=True)
    existing = vhost.exchanges.get(name)
    if existing is None:
        if name.startswith("amq."):
            raise access_refused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        args = dict(method.arguments)
        ae = args.get("alternate-exchange")
        if ae is not None:
            broker.check_access(conn, "read", "exchange", name)
            broker.check_access(conn, "write", "exchange", ae if isinstance(ae, str) else str(ae))
        exchange = Exchange(name, method.type, method.durable, method.auto_delete, method.internal, args)
        vhost.exchanges[name] = exchange
        vhost.invalidate()
        if exchange.durable or broker.definitions_shared:
            broker.persist((ExchangeRecord(vhost.name, name, exchange.type, exchange.auto_delete,
                                           exchange.internal, args, durable=exchange.durable),))
    else:
        if existing.type != method.type:
            raise inequivalent("type", resource, f"'{method.type}'", f"'{existing.type}'")
        assert_flag_equivalent("durable", existing.durable, method.durable, resource)
        assert_flag_equivalent("auto_delete", existing.auto_delete, method.auto_delete, resource)
        assert_flag_equivalent("internal", existing.internal, method.internal, resource)
        assert_args_equivalent(existing.arguments, method.arguments, ("alternate-exchange",), resource)
    _reply(broker, ch, method.nowait, m.ExchangeDeclareOk())


def exchange_delete(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.ExchangeDelete) -> None:
    vhost = broker.vhost_of(conn)
    name = method.exchange
    if name == "":
        raise _default_exchange_refused()
    broker.check_access(conn, "configure", "exchange", name)
    if name.startswith("amq."):
        raise access_refused(f"deletion of system {exchange_resource(name, vhost.name)} not allowed")
    exchange = vhost.exchanges.get(name)
    if exchange is not None:
        if method.if_unused and exchange.bindings:
            raise precondition(f"{exchange_resource(name, vhost.name)} in use")
        delete_exchange(broker, vhost, exchange)
    _reply(broker, ch, method.nowait, m.ExchangeDeleteOk())


def delete_exchange(broker: BrokerState, vhost: VHost[QueueState], exchange: Exchange) -> None:
    vhost.exchanges.pop(exchange.name, None)
    for binding in list(exchange.bindings.values()):
        _forget_binding(broker, vhost, binding, check_auto_delete=False)
    for binding in vhost.bindings_to(Dest("exchange", exchange.name)):
        _forget_binding(broker, vhost, binding)
    vhost.invalidate()
    if exchange.durable or broker.definitions_shared:
        broker.persist((ExchangeRecord(vhost.name, exchange.name, exchange.type, deleted=True,
                                       durable=exchange.durable),))


def exchange_bind(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.ExchangeBind) -> None:
    _bind(broker, conn, method.source, Dest("exchange", method.destination), method.routing_key,
          method.arguments, unbind=False)
    _reply(broker, ch, method.nowait, m.ExchangeBindOk())


def exchange_unbind(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.ExchangeUnbind) -> None:
    _bind(broker, conn, method.source, Dest("exchange", method.destination), method.routing_key,
          method.arguments, unbind=True)
    _reply(broker, ch, method.nowait, m.ExchangeUnbindOk())


def _bind(broker: BrokerState, conn: ConnState, source: str, dest: Dest, routing_key: str, arguments: dict[str, Any],
          unbind: bool) -> None:
    vhost = broker.vhost_of(conn)
    if source == "" or (dest.kind == "exchange" and dest.name == ""):
        raise _default_exchange_refused()
    broker.check_access(conn, "write", dest.kind, dest.name)
    broker.check_access(conn, "read", "exchange", source)
    if dest.kind == "queue":
        queue = vhost.queues.get(dest.name)
        if queue is None:
            if unbind:
                return
            raise queue_not_found(broker, conn, dest.name, vhost.name)
        check_exclusive(conn, queue)
    elif dest.name not in vhost.exchanges:
        if unbind:
            return
        raise exchange_not_found(broker, conn, dest.name, vhost.name)
    exchange = vhost.exchanges.get(source)
    if exchange is None:
        if unbind:
            return
        raise exchange_not_found(broker, conn, source, vhost.name)
    binding = Binding(source, dest, routing_key, dict(arguments))
    if unbind:
        _forget_binding(broker, vhost, binding)
        return
    if exchange.type == "headers" and x_match_mode(arguments) is None:
        raise precondition(f"Invalid x-match field value {arguments.get('x-match')!r}; "
                           "expected all, any, all-with-x, or any-with-x")
    if vhost.add_binding(binding) and (broker.definitions_shared or _binding_durable(vhost, binding)):
        broker.persist((BindingRecord(vhost.name, source, dest.kind, dest.name, routing_key, dict(arguments)),))


def _binding_durable(vhost: VHost[QueueState], binding: Binding) -> bool:
    source = vhost.exchanges.get(binding.source)
    if source is None or not source.durable:
        return False
    if binding.dest.kind == "queue":
        queue = vhost.queues.get(binding.dest.name)
        return queue is not None and queue.durable
    dest = vhost.exchanges.get(binding.dest.name)
    return dest is not None and dest.durable


def _forget_binding(broker: BrokerState, vhost: VHost[QueueState], binding: Binding, check_auto_delete: bool = True
                    ) -> None:
    durable = broker.definitions_shared or _binding_durable(vhost, binding)
    if not vhost.remove_binding(binding) and check_auto_delete:
        return
    if durable:
        broker.persist((BindingRecord(vhost.name, binding.source, binding.dest.kind, binding.dest.name,
                                      binding.routing_key, binding.arguments, deleted=True),))
    source = vhost.exchanges.get(binding.source)
    if check_auto_delete and source is not None and source.auto_delete and not source.bindings:
        delete_exchange(broker, vhost, source)


# --- queues -----------------------------------------------------------------------------------------------------


def queue_declare(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.QueueDeclare) -> None:
    vhost = broker.vhost_of(conn)
    name = method.queue
    if method.passive:
        queue = vhost.queues.get(expand_queue_name(ch, name))
        if queue is None:
            raise queue_not_found(broker, conn, name, vhost.name)
        check_exclusive(conn, queue)
    else:
        if name == "":
            name = broker.random_name("amq.gen-")
        elif name.startswith("amq."):
            raise access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        broker.check_access(conn, "configure", "queue", name)
        resource = f"queue '{name}' in vhost '{vhost.name}'"
        args = dict(method.arguments)
        validate_queue_args(args, resource)
        dlx = args.get("x-dead-letter-exchange")
        if isinstance(dlx, str):
            broker.check_access(conn, "read", "queue", name)
            broker.check_access(conn, "write", "exchange", dlx)
        queue = vhost.queues.get(name)
        if queue is None:
            limit = vhost_limits.reached(vhost.limits, vhost_limits.MAX_QUEUES, len(vhost.queues)) if vhost.limits else None
            if limit is not None:  # new queues only, as RabbitMQ (rabbit_channel:check_vhost_queue_limit)
                raise precondition(vhost_limits.queue_refusal(name, vhost.name, limit))
            queue = create_queue(broker, vhost, name, method.durable, method.auto_delete, args,
                                 conn.conn_id if method.exclusive else None)
            queue.transient_checked = True  # (new: nothing from an earlier life of its node to drop)
        else:
            owner = conn.conn_id if method.exclusive else None
            if queue.exclusive_owner != owner:
                check_exclusive(conn, queue)
                if queue.exclusive_owner is None or owner is None:
                    raise AmqpError(405, f"cannot obtain exclusive access to locked {queue.resource}. It could be "
                                         "originally declared on another connection or the exclusive property "
                                         "value does not match that of the original declaration.")
            assert_flag_equivalent("durable", queue.durable, method.durable, resource)
            assert_flag_equivalent("auto_delete", queue.auto_delete, method.auto_delete, resource)
            assert_args_equivalent(queue.arguments, args, EQUIVALENCE_ARGS, resource)
    backend_of(queue).declared(broker, queue)  # (a use: x-expires starts again)
    ch.last_queue = queue.name
    consumer_count = backend_of(queue).consumer_count(queue)  # (every node's)
    count = paging.message_count(queue)  # (a paged tail too)
    ok = m.QueueDeclareOk(queue=queue.name, message_count=count, consumer_count=consumer_count)
    _reply(broker, ch, method.nowait, ok)


def create_queue(broker: BrokerState, vhost: VHost[QueueState], name: str, durable: bool, auto_delete: bool,
                 args: dict[str, Any], owner: int | str | None) -> QueueState:
    queue = QueueState(vhost.name, name, durable, auto_delete, args, None, owner)
    backend: QueueBackend = broker.choose_backend(queue)
    queue.backend = backend  # (chosen once: the queue keeps it for life)
    backend.create(broker, vhost, queue)
    vhost.queues[name] = queue
    vhost.invalidate()
    if vhost.policies:
        policy_apply.apply_to_queue(broker, vhost, queue)  # (a Raft queue: its leader proposes SetArgs)
    return queue


def queue_bind(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.QueueBind) -> None:
    name = expand_queue_name(ch, method.queue)
    routing_key = method.routing_key or (ch.last_queue if method.queue == "" else "")
    _bind(broker, conn, method.exchange, Dest("queue", name), routing_key, method.arguments, unbind=False)
    _reply(broker, ch, method.nowait, m.QueueBindOk())


def queue_unbind(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.QueueUnbind) -> None:
    name = expand_queue_name(ch, method.queue)
    _bind(broker, conn, method.exchange, Dest("queue", name), method.routing_key, method.arguments, unbind=True)
    _send(broker, ch, m.QueueUnbindOk())


def queue_purge(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.QueuePurge) -> None:
    queue = lookup_queue(broker, conn, ch, method.queue)
    broker.check_access(conn, "read", "queue", queue.name)
    check_exclusive(conn, queue)
    backend_of(queue).purge(broker, ch, queue, method.nowait)


def queue_delete(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.QueueDelete) -> None:
    vhost = broker.vhost_of(conn)
    name = expand_queue_name(ch, method.queue)
    broker.check_access(conn, "configure", "queue", name)
    queue = vhost.queues.get(name)
    count = 0
    if queue is not None:
        check_exclusive(conn, queue)
        if method.if_unused and (queue.consumers or backend_of(queue).consumer_count(queue)):
            raise precondition(f"{queue.resource} in use")
        count = paging.message_count(queue)
        if method.if_empty and count:
            raise precondition(f"{queue.resource} not empty")
        # RabbitMQ sends queue.delete-ok before the consumer_cancel_notify basic.cancels (the channel replies when
        # the queue process has gone; the cancels follow from its monitor), so a client waiting for delete-ok on
        # a channel that also consumes from the queue (kombu without on_cancel) sees its reply first.
        cancels: list[Effect] = []
        delete_queue(broker, queue, cancels)
        _reply(broker, ch, method.nowait, m.QueueDeleteOk(message_count=count))
        broker.out.extend(cancels)
        return
    _reply(broker, ch, method.nowait, m.QueueDeleteOk(message_count=count))


def delete_queue(broker: BrokerState, queue: QueueState, cancels: list[Effect] | None = None) -> None:
    """Drop the queue, its bindings and consumers; consumer cancels go to `cancels` if given, else out."""
    vhost = broker.vhosts.get(queue.vhost)
    if vhost is None or vhost.queues.get(queue.name) is not queue:
        return
    for binding in vhost.bindings_to(Dest("queue", queue.name)):
        _forget_binding(broker, vhost, binding)
    del vhost.queues[queue.name]
    vhost.invalidate()
    delivery.cancel_queue_consumers(broker, queue, cancels)
    # The definition's deletion is written first, its messages' removals after it (one Persist): a crash that
    # cuts the batch leaves a deleted queue, never a live one missing some messages. Removals a crash cut off
    # cannot bring a message back: a queue declared again under this name starts its stream afresh (the store
    # writes a QueueStreamStartRecord before its QueueRecord; recovery drops what precedes it).
    backend_of(queue).delete(broker, queue)
    if queue.tail is not None:
        paged_tail.forget_tail(broker, queue)
    if queue.persisted_ids:  # (not stored: paged-in persistent messages; the stream stays consistent on its own)
        removed = sorted(queue.persisted_ids)
        queue.persisted_ids.clear()
        broker.persist(tuple(MessageRemovedRecord(queue.vhost, queue.name, i) for i in removed))


def delete_exclusive_queues(broker: BrokerState, conn: ConnState) -> None:
    vhost = broker.vhosts.get(conn.vhost)
    if vhost is None:
        return
    for queue in [q for q in vhost.queues.values() if q.exclusive_owner == conn.conn_id]:
        delete_queue(broker, queue)


def expire_queues(broker: BrokerState, now_ms: int, backend: QueueBackend) -> None:
    """Message TTL and x-expires of the queues `backend` holds (one whose machine applies commands at once): an
    `Expire` when the machine's `next_expiry_ms()` is due; a `QueueExpired` among its effects deletes the queue
    (delivery.apply_queue)."""
    for vhost in list(broker.vhosts.values()):
        for queue in list(vhost.queues.values()):
            if queue.backend is not backend:
                continue
            expiry = queue.machine.next_expiry_ms()
            if expiry is not None and expiry <= now_ms:
                delivery.apply_queue(broker, queue, Expire(now_ms))


def _reply(broker: BrokerState, ch: ChannelState, nowait: bool, method: Any) -> None:
    if not nowait:
        _send(broker, ch, method)
