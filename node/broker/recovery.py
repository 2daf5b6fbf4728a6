"""Rebuild the broker from the records storage returned at start (`Broker.recover`), pure.

Records are folded in the order given (last record per key wins; `deleted=True` and MessageRemoved erase, and so
does a `QueueStreamStartRecord` for every earlier record of its queue's stream: the queue was deleted and declared
again, so those were the old queue's, whatever removals a crash cut off; a
message record of an id already live is that message's new place: a persistent message spilled under the memory
alarm is written again as one record, never as a removal then a copy, so no crash point loses it), then
applied: vhosts, users, permissions, durable exchanges, durable queues, bindings whose ends both survived, then each
durable queue's persistent messages in msg_id order through the machine's `Recover` command. A long queue stream
comes from storage as one `MessageIndexRecord` (ids and log offsets, no bodies): it becomes the queue's paged tail
(node/broker/paging.py) and is read back from the log in batches as consumers need it. Recovered messages
come back flagged redelivered (the machine's Recover semantics): we do not persist per-delivery state, so the broker
cannot tell which were delivered before the restart, and RabbitMQ's guidance is that a consumer must treat any
message after a restart as possibly seen. Their delivery_count is what the record says (0 unless set).
"""

from __future__ import annotations

from typing import Any

from cluster.queue import MsgId, QueuedMessage, Recover
from node.amqp.properties import BasicProperties
from node.broker import paging
from node.broker.auth import Permission, User
from node.broker.channel import Message
from node.broker.definitions import create_queue
from node.broker.delivery import apply_queue
from node.broker.exchanges import Binding, Dest, Exchange, freeze_args
from node.broker.records import (
    BindingRecord,
    ExchangeRecord,
    MessageIndexRecord,
    MessageRecord,
    MessageRemovedRecord,
    PermissionRecord,
    QueueRecord,
    QueueStreamStartRecord,
    Record,
    UserRecord,
    VHostRecord,
)
from node.broker.state import BrokerState
from node.broker.vhost import VHost


class _Fold:
    def __init__(self) -> None:
        self.vhosts: dict[str, VHostRecord] = {}
        self.users: dict[str, UserRecord] = {}
        self.perms: dict[tuple[str, str], PermissionRecord] = {}
        self.exchanges: dict[tuple[str, str], ExchangeRecord] = {}
        self.queues: dict[tuple[str, str], QueueRecord] = {}
        self.bindings: dict[Any, BindingRecord] = {}
        self.messages: dict[tuple[str, str], dict[int, MessageRecord]] = {}
        self.indexes: dict[tuple[str, str], MessageIndexRecord] = {}

    def add(self, record: Record) -> None:
        if isinstance(record, VHostRecord):
            self.vhosts[record.name] = record
        elif isinstance(record, UserRecord):
            self.users[record.name] = record
        elif isinstance(record, PermissionRecord):
            self.perms[(record.user, record.vhost)] = record
        elif isinstance(record, ExchangeRecord):
            self.exchanges[(record.vhost, record.name)] = record
        elif isinstance(record, QueueRecord):
            self.queues[(record.vhost, record.name)] = record
            if record.deleted:
                self.messages.pop((record.vhost, record.name), None)
                self.indexes.pop((record.vhost, record.name), None)
        elif isinstance(record, BindingRecord):
            key = (record.vhost, record.source, record.dest_kind, record.destination, record.routing_key,
                   freeze_args(record.arguments))
            self.bindings[key] = record
        elif isinstance(record, MessageRecord):
            if record.properties.get("delivery_mode") != 2:
                return  # a transient message spilled by paging: dropped at restart, as RabbitMQ does
            self.messages.setdefault((record.vhost, record.queue), {})[record.msg_id] = record
        elif isinstance(record, MessageRemovedRecord):
            self.messages.get((record.vhost, record.queue), {}).pop(record.msg_id, None)
        elif isinstance(record, MessageIndexRecord):
            self.indexes[(record.vhost, record.queue)] = record
        elif isinstance(record, QueueStreamStartRecord):  # a re-declared queue: what came before was the old one's
            self.messages.pop((record.vhost, record.queue), None)
            self.indexes.pop((record.vhost, record.queue), None)


def recover(broker: BrokerState, records: list[Record]) -> None:
    fold = _Fold()
    for record in records:
        fold.add(record)
    for name, vrec in fold.vhosts.items():
        if vrec.deleted:
            broker.vhosts.pop(name, None)
        else:
            if name not in broker.vhosts:
                broker.vhosts[name] = VHost.create(name)
            broker.vhosts[name].limits = dict(vrec.limits)
    for name, urec in fold.users.items():
        if urec.deleted:
            broker.users.delete_user(name)
        else:
            broker.users.put_user(User(name, urec.password_hash, tuple(urec.tags)), urec.limits)
    for (user, vhost_name), prec in fold.perms.items():
        if prec.deleted:
            broker.users.clear_permissions(user, vhost_name)
        else:
            broker.users.set_permissions(user, vhost_name, Permission(prec.configure, prec.write, prec.read))
    _recover_exchanges(broker, fold)
    _recover_queues(broker, fold)
    _recover_bindings(broker, fold)


def _recover_exchanges(broker: BrokerState, fold: _Fold) -> None:
    for (vhost_name, name), rec in fold.exchanges.items():
        vhost = broker.vhosts.get(vhost_name)
        if vhost is None:
            continue
        if rec.deleted:
            vhost.exchanges.pop(name, None)
        else:
            vhost.exchanges[name] = Exchange(name, rec.type, True, rec.auto_delete, rec.internal, dict(rec.arguments))
        vhost.invalidate()


def _recover_queues(broker: BrokerState, fold: _Fold) -> None:
    for (vhost_name, name), rec in fold.queues.items():
        vhost = broker.vhosts.get(vhost_name)
        if vhost is None or rec.deleted:
            continue
        queue = create_queue(broker, vhost, name, True, rec.auto_delete, dict(rec.arguments), None)
        for msg_id in sorted(fold.messages.get((vhost_name, name), {})):
            mrec = fold.messages[(vhost_name, name)][msg_id]
            props = BasicProperties(**mrec.properties)
            msg = Message(mrec.exchange, mrec.routing_key, props, mrec.body)
            queued = QueuedMessage(msg, len(mrec.body), True, props.priority or 0, None)
            queue.persisted_ids.add(msg_id)
            apply_queue(broker, queue, Recover(MsgId(msg_id), queued, mrec.delivery_count))
        index = fold.indexes.get((vhost_name, name))
        if index is not None:
            paging.attach_recovered_tail(broker, queue, index.msg_ids, index.offsets)


def _recover_bindings(broker: BrokerState, fold: _Fold) -> None:
    for rec in fold.bindings.values():
        vhost = broker.vhosts.get(rec.vhost)
        if vhost is None or rec.deleted or rec.source not in vhost.exchanges:
            continue
        dest = Dest(rec.dest_kind, rec.destination)
        if (dest.kind == "queue" and dest.name not in vhost.queues) or (
                dest.kind == "exchange" and dest.name not in vhost.exchanges):
            continue
        vhost.add_binding(Binding(rec.source, dest, rec.routing_key, dict(rec.arguments)))
