"""Deleting users, permissions and vhosts, as RabbitMQ 3.10 does (the management API's DELETE /api/users/{name},
POST /api/users/bulk-delete, DELETE /api/permissions/{vhost}/{user}, DELETE /api/vhosts/{name}). Pure: no I/O.

How it works: each function changes the broker's tables and queues the deletion records (`deleted=True`) with
`broker.persist`, so a single node writes them to its definitions stream and a cluster node turns them into the
metadata group's `DeleteUser` / `ClearPermissions` (node/clustering/definitions.py) exactly as a creation travels.
A deleted user takes its permissions and user limits with it (a permission record per vhost is written too, so a
single node's recovery does not bring them back); a deleted vhost takes its queues (and their messages), exchanges,
bindings, permissions and policies (its runtime parameters are the facade's: `Broker.clear_parameter`, called by
the management view first). As in RabbitMQ 3.10, the connections of a deleted user and those into a deleted vhost
are closed with 320 CONNECTION_FORCED ("user 'u' is deleted", "vhost 'v' is down": the texts a RabbitMQ 3.10
node's clients get); `close_connections` is also what a cluster node's mirror calls when another node's deletion
reaches it (node/broker/committed_definitions.py).
"""

from __future__ import annotations

from node.amqp.errors import reply_text
from node.amqp.spec import ReplyCode
from node.broker.definitions import delete_exchange, delete_queue
from node.broker.effects import CloseConnection
from node.broker.records import (
    BindingRecord,
    PermissionRecord,
    PolicyRecord,
    Record,
    UserRecord,
    VHostRecord,
)
from node.broker.state import BrokerState
from node.broker.vhost import PREDECLARED


def close_connections(broker: BrokerState, *, user: str | None = None, vhost: str | None = None) -> None:
    """Close (320 CONNECTION_FORCED) every connection of `user`, or every connection into `vhost`."""
    if user is not None:
        text, doomed = f"user '{user}' is deleted", [c for c in broker.conns.values() if c.username == user]
    elif vhost is not None:
        text, doomed = f"vhost '{vhost}' is down", [c for c in broker.conns.values() if c.vhost == vhost]
    else:
        return
    code = int(ReplyCode.CONNECTION_FORCED)
    for conn in doomed:
        broker.out.append(CloseConnection(conn.conn_id, code, reply_text(ReplyCode.CONNECTION_FORCED, text)))


def delete_user(broker: BrokerState, name: str) -> bool:
    """Delete a user with its permissions and limits, and close its connections (False: no such user)."""
    if name not in broker.users.users:
        return False
    vhosts = sorted(v for u, v in broker.users.permissions if u == name)
    broker.users.delete_user(name)
    broker.forget_permission_caches()
    broker.persist((UserRecord(name, "", (), deleted=True),
                    *(PermissionRecord(name, v, "", "", "", deleted=True) for v in vhosts)))
    close_connections(broker, user=name)
    return True


def clear_permissions(broker: BrokerState, user: str, vhost: str) -> bool:
    """Remove a user's permissions in a vhost (False: it had none there). Its open connections stay, as in
    RabbitMQ; their next checked operation is refused."""
    if (user, vhost) not in broker.users.permissions:
        return False
    broker.users.clear_permissions(user, vhost)
    broker.forget_permission_caches()
    broker.persist((PermissionRecord(user, vhost, "", "", "", deleted=True),))
    return True


def delete_vhost(broker: BrokerState, name: str) -> bool:
    """Delete a vhost and everything in it, closing the connections into it (False: no such vhost)."""
    vhost = broker.vhosts.get(name)
    if vhost is None:
        return False
    close_connections(broker, vhost=name)
    for queue in list(vhost.queues.values()):
        delete_queue(broker, queue)
    predeclared = {ex for ex, _ in PREDECLARED}
    for exchange in [x for x in vhost.exchanges.values() if x.name not in predeclared]:
        delete_exchange(broker, vhost, exchange)
    records: list[Record] = []
    for exchange in [x for x in vhost.exchanges.values() if x.name in predeclared]:
        # (the amq.* exchanges are not stored: a vhost made again has them anew; their own bindings are)
        records.extend(BindingRecord(name, b.source, b.dest.kind, b.dest.name, b.routing_key, b.arguments,
                                     deleted=True) for b in exchange.bindings.values())
    records.extend(PolicyRecord(name, policy, deleted=True) for policy in sorted(vhost.policies))
    users = sorted(u for u, v in broker.users.permissions if v == name)
    for user in users:
        broker.users.clear_permissions(user, name)
        records.append(PermissionRecord(user, name, "", "", "", deleted=True))
    broker.forget_permission_caches()
    broker.trace_vhosts.discard(name)
    del broker.vhosts[name]
    records.append(VHostRecord(name, deleted=True))
    broker.persist(records)
    return True
