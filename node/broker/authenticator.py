"""How one AMQP connection logs in and what it may open: the broker's side of the authenticator protocol.

`node/amqp`'s handshake asks a `ConnAuthenticator` (one per connection, from `Broker.authenticator_for`) to check
the SASL response, the vhost of connection.open and the connection/channel limits. The node's internal logins
(cluster/authlink/amqp_login.py) are checked first and never against the user table (a wrong password for their
names is refused): the cluster's forwarding login (`BrokerConfig.internal_login`) marks the connection
`ConnState.internal` and skips the vhost permission and limit checks; the links' login to their own node
(`BrokerConfig.link_login`) marks it `ConnState.link`, may open any existing vhost and counts against the vhost's
connection limit. What they may do once open is `BrokerState.check_access`'s. Every other login goes to the user
table (`BrokerState.check_login`).
"""

from __future__ import annotations

from node.broker.auth import is_internal_login
from node.broker.state import BrokerState


class ConnAuthenticator:
    """The authenticator protocol bound to one connection (knows whether the peer is loopback)."""

    def __init__(self, broker: BrokerState, conn_id: int) -> None:
        self._broker = broker
        self._conn_id = conn_id

    def authenticate(self, mechanism: str, response: bytes) -> str | None:
        """The internal logins (cluster/authlink/amqp_login.py) are checked first, and never against the user
        table: the forwarding login may publish to any vhost's exchanges, the links' login do everything in any
        vhost (`BrokerState.check_access`)."""
        conn = self._broker.conns.get(self._conn_id)
        internal = self._broker.config.internal_login
        verdict = is_internal_login(internal, mechanism, response) if internal is not None else None
        if verdict is not None and conn is not None and internal is not None:
            conn.internal = verdict
            return internal[0] if verdict else None
        link = self._broker.config.link_login
        verdict = is_internal_login(link, mechanism, response) if link is not None else None
        if verdict is not None and conn is not None and link is not None:
            conn.link = verdict
            return link[0] if verdict else None
        return self._broker.check_login(mechanism, response, conn.peer_is_loopback if conn else False)

    def _internal(self) -> bool:
        conn = self._broker.conns.get(self._conn_id)
        return conn is not None and conn.internal

    def vhost_access(self, username: str, vhost: str) -> bool:
        conn = self._broker.conns.get(self._conn_id)
        if conn is not None and (conn.internal or conn.link):
            return vhost in self._broker.vhosts
        return self._broker.vhost_access(username, vhost)

    def refusal_may_be_stale(self) -> bool:
        """In a cluster a user, vhost or permission committed through another node may not be applied here yet:
        the handshake then asks again once the runtime caught up with the metadata (node/amqp/connection_handshake.py
        `_refusal_held`), as RabbitMQ's Mnesia write is on every node when its API call returns."""
        return self._broker.definitions_shared

    def connection_limit_reached(self, vhost: str) -> int | None:
        return None if self._internal() else self._broker.connection_limit_reached(vhost)

    def user_limit_reached(self, username: str, name: str, own: int = 0) -> int | None:
        """node/broker/user_limits.py: `own` counts this connection's channels the broker has not seen yet."""
        if self._internal():
            return None
        conn = self._broker.conns.get(self._conn_id)
        known = len(conn.channels) if conn is not None and conn.opened else 0
        return self._broker.user_limit_reached(username, name, max(own - known, 0))

