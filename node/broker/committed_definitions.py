"""Replicated mode: apply the definitions other nodes committed to the metadata group to this broker (pure).

Not to be confused with mirrored queues (backend_mirror.py, ha_policy.py): this module copies *definitions*
(vhosts, users, permissions, exchanges, queues, bindings) that the cluster's metadata group committed.

`apply_records(broker, records)` applies the storage records (`node/broker/records.py`) in order without writing
any: the broker's `persist` is shadowed for the duration, so the cascades a local change would persist (a queue's
bindings, auto-delete exchanges) happen locally and silently, exactly as they did on the node that made the change
(whose own records say so too; applying one twice is harmless). A record for an existing queue or exchange with
other properties (it was deleted and declared again differently meanwhile) replaces it. A queue deleted elsewhere goes through
`delete_queue`, so its local consumers are cancelled (basic.cancel when the client supports it) as for a local
delete. An exclusive queue whose owner is a connection of an earlier life of this node is deleted for real (that
deletion is persisted), as RabbitMQ deletes exclusive queues whose owner is gone. A deleted user's connections and
the connections into a deleted vhost are closed (node/broker/admin_delete.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from node.broker.admin_delete import close_connections
from node.broker.auth import Permission, User
from node.broker.definitions import create_queue, delete_exchange, delete_queue
from node.broker.exchanges import Binding, Dest, Exchange
from node.broker.queues import QueueState
from node.broker.records import (
    BindingRecord,
    ExchangeRecord,
    PermissionRecord,
    QueueRecord,
    Record,
    UserRecord,
    VHostRecord,
)
from node.broker.replica_machine import global_owner, local_owner
from node.broker.state import BrokerState
from node.broker.vhost import VHost


def _no_persist(records: object) -> int:
    return 0


def apply_records(broker: BrokerState, records: Iterable[Record]) -> None:
    stale: list[QueueState] = []
    setattr(broker, "persist", _no_persist)  # noqa: B010 (shadows the method while mirroring)
    try:
        for record in records:
            _apply(broker, record, stale)
    finally:
        delattr(broker, "persist")
    for queue in stale:
        delete_queue(broker, queue)


def _apply(broker: BrokerState, record: Record, stale: list[QueueState]) -> None:
    if isinstance(record, VHostRecord):
        if record.deleted:
            if broker.vhosts.pop(record.name, None) is not None:
                close_connections(broker, vhost=record.name)  # (as RabbitMQ, on every node)
        else:
            if record.name not in broker.vhosts:
                broker.vhosts[record.name] = VHost.create(record.name)
            broker.vhosts[record.name].limits = dict(record.limits)
    elif isinstance(record, UserRecord):
        if record.deleted:
            if record.name in broker.users.users:
                close_connections(broker, user=record.name)
            broker.users.delete_user(record.name)
        else:
            broker.users.put_user(User(record.name, record.password_hash, tuple(record.tags)), record.limits)
    elif isinstance(record, PermissionRecord):
        permission = Permission(record.configure, record.write, record.read)
        broker.set_permissions(record.user, record.vhost, permission)  # also clears the permission caches
        if record.deleted:
            broker.users.clear_permissions(record.user, record.vhost)
    elif isinstance(record, ExchangeRecord):
        _apply_exchange(broker, record)
    elif isinstance(record, QueueRecord):
        _apply_queue(broker, record, stale)
    elif isinstance(record, BindingRecord):
        _apply_binding(broker, record)


def _apply_exchange(broker: BrokerState, record: ExchangeRecord) -> None:
    vhost = broker.vhosts.get(record.vhost)
    if vhost is None:
        return
    existing = vhost.exchanges.get(record.name)
    if existing is not None and not record.deleted and (
            (existing.type, existing.durable, existing.auto_delete, existing.internal, existing.arguments)
            != (record.type, record.durable, record.auto_delete, record.internal, record.arguments)):
        delete_exchange(broker, vhost, existing)  # deleted and declared again differently meanwhile
        existing = None
    if record.deleted:
        if existing is not None:
            delete_exchange(broker, vhost, existing)
    elif existing is None:
        vhost.exchanges[record.name] = Exchange(record.name, record.type, record.durable, record.auto_delete,
                                                record.internal, dict(record.arguments))
        vhost.invalidate()


def _apply_queue(broker: BrokerState, record: QueueRecord, stale: list[QueueState]) -> None:
    vhost = broker.vhosts.get(record.vhost)
    if vhost is None:
        return
    existing = vhost.queues.get(record.name)
    if existing is not None and not record.deleted and (
            (existing.durable, existing.auto_delete, existing.arguments, global_owner(broker, existing.exclusive_owner))
            != (record.durable, record.auto_delete, record.arguments, record.exclusive_owner)):
        delete_queue(broker, existing)  # deleted and declared again differently meanwhile
        existing = None
    if record.deleted:
        if existing is not None:
            delete_queue(broker, existing)
        return
    if existing is not None:
        return
    owner, owner_gone = local_owner(broker, record.exclusive_owner)
    queue = create_queue(broker, vhost, record.name, record.durable, record.auto_delete, dict(record.arguments),
                         owner)
    if owner_gone:
        stale.append(queue)


def _apply_binding(broker: BrokerState, record: BindingRecord) -> None:
    vhost = broker.vhosts.get(record.vhost)
    if vhost is None:
        return
    binding = Binding(record.source, Dest(record.dest_kind, record.destination), record.routing_key,
                      dict(record.arguments))
    if record.deleted:
        vhost.remove_binding(binding)
    elif record.source in vhost.exchanges and (
            record.destination in (vhost.queues if record.dest_kind == "queue" else vhost.exchanges)):
        vhost.add_binding(binding)
