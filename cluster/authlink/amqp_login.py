"""The cluster's internal AMQP login: how one node logs in to another node's AMQP port without a user (pure).

What it is for: forwarding publishes to a node-local exclusive queue of another node (node/runtime/cluster/
forward.py) opens an AMQP connection to that node. It must not depend on the user table (a deleted default user,
or guest refused from another host, would nack every forwarded publish), so it logs in with a name and password
that every node derives from the cluster secret it already holds for the Raft transport.

How it works: the password is HMAC-SHA256(secret, label), hex; the secret itself never goes on the wire. The
broker accepts the pair only in cluster mode (`BrokerConfig.internal_login`), checks it before the user table,
and grants such a connection publishing only (node/broker/broker.py `ConnAuthenticator`): no configure, no read,
no user limits, no vhost connection limit, no loopback restriction.
"""

from __future__ import annotations

import hashlib
import hmac

INTERNAL_USER = "raftmq-internal-forward"
_LABEL = b"raftmq amqp internal login v1"


def internal_login(secret: str) -> tuple[str, str]:
    """(user, password) of the internal login for a cluster with this secret."""
    return INTERNAL_USER, hmac.new(secret.encode(), _LABEL, hashlib.sha256).hexdigest()
