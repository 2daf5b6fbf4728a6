"""The node's internal AMQP logins: how a node, or a link inside it, logs in to an AMQP port without a user (pure).

What it is for: two kinds of connection open AMQP connections that must not depend on the user table (a deleted
default user, a changed password, or guest refused from another host would break them), so each logs in with a
name of its own and a password derived from a secret, checked by the broker before the user table (a wrong
password for these names is refused, never tried against the user table):

- Forwarding (`internal_login`): publishes to a node-local exclusive queue of another node (node/runtime/cluster/
  forward.py). The key is the cluster secret every node holds for the Raft transport. The broker accepts it only in
  cluster mode (`BrokerConfig.internal_login`) and grants such a connection publishing only, of forwarded messages
  (node/broker/authenticator.py; `BrokerState.check_access`): no configure, no read, no limits, no loopback rule.
- Links (`link_login`): shovels and federation links whose URI is `amqp://` with no host, which means the node
  itself (cluster/link/uri.py). RabbitMQ opens a direct (in-VM) connection there as its internal user "none",
  which needs no password and may configure, write and read everything in every vhost (rabbit_direct,
  rabbit_auth_backend_dummy). Ours is an AMQP connection to the node's own listener as `LINK_USER` with the same
  rights in whichever vhost it opens, both modes (`BrokerConfig.link_login`); the vhost must exist, and the
  vhost's connection limit counts it as RabbitMQ's does. The key is random per process (node/runtime/main.py): a
  link only ever connects to its own node, so the password never needs to be known anywhere else, and a client
  cannot log in as the link identity without reading the node's memory.

How it works: the password is HMAC-SHA256(key, label), hex, one label per login; the key itself never goes on the
wire. Every name starting with `RESERVED_USER_PREFIX` is kept for such logins: the management API refuses to
create a user of that name (`is_reserved_user`), since the broker would never check its password.
"""

from __future__ import annotations

import hashlib
import hmac

RESERVED_USER_PREFIX = "raftmq-internal-"
INTERNAL_USER = RESERVED_USER_PREFIX + "forward"
LINK_USER = RESERVED_USER_PREFIX + "link"
_LABEL = b"raftmq amqp internal login v1"
_LINK_LABEL = b"raftmq amqp link login v1"


def internal_login(secret: str) -> tuple[str, str]:
    """(user, password) of the internal login for a cluster with this secret."""
    return INTERNAL_USER, hmac.new(secret.encode(), _LABEL, hashlib.sha256).hexdigest()


def link_login(key: bytes) -> tuple[str, str]:
    """(user, password) of the links' login to their own node, for this process's random key."""
    return LINK_USER, hmac.new(key, _LINK_LABEL, hashlib.sha256).hexdigest()


def is_reserved_user(name: str) -> bool:
    """A name kept for the nodes' internal logins: no user of the user table may have it."""
    return name.startswith(RESERVED_USER_PREFIX)
