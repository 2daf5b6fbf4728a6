"""SASL response parsing for PLAIN and AMQPLAIN (EXTERNAL: see below), and the server properties we advertise in Connection.Start.

PLAIN's response is `authzid NUL user NUL password`; AMQPLAIN's is a field table *without* its 4-byte length prefix
holding LOGIN and PASSWORD. The connection validates the response with `parse_sasl_response` (malformed ->
502 SYNTAX_ERROR) and hands the raw bytes to the broker's authenticator, which may call the same helper.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from node.amqp.fieldtable import DecodeError, decode_table_body

MECHANISMS: Final = ("PLAIN", "AMQPLAIN")
# Offered only on a TLS connection with a verified client certificate (ServerConnection.external_identity); the
# authenticator then gets the certificate's login name as the response, never the client's bytes.
EXTERNAL: Final = "EXTERNAL"
SERVER_CAPABILITIES: Final = (
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "consumer_priorities",
    "authentication_failure_close",
    "per_consumer_qos",
    "direct_reply_to",
)


class Authenticator(Protocol):
    """What the broker implements for the connection handshake."""

    def authenticate(self, mechanism: str, response: bytes) -> str | None:
        """Return the user name, or None when the login is refused."""
        ...

    def vhost_access(self, username: str, vhost: str) -> bool:
        """May this user open this virtual host?"""
        ...

    def connection_limit_reached(self, vhost: str) -> int | None:
        """The vhost's max-connections limit when its connections reach it (this one is refused), else None."""
        ...

    # Optional: `user_limit_reached(username, name, own) -> int | None`, the user's max-connections or
    # max-channels when reached (`own`: this connection's channels); connection.py asks for it with getattr.
    # Optional: `refusal_may_be_stale() -> bool`, whether a refused login or vhost may only not have reached this
    # node's copy of the definitions yet (a cluster): the handshake then waits for `recheck` once before refusing.


def parse_sasl_response(mechanism: str, response: bytes) -> tuple[str, str] | None:
    """Return (username, password) from a PLAIN or AMQPLAIN response, or None when it is malformed."""
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) != 3:
            return None
        return parts[1].decode("utf-8", "surrogateescape"), parts[2].decode("utf-8", "surrogateescape")
    if mechanism == "AMQPLAIN":
        try:
            table = decode_table_body(response)
        except DecodeError:
            return None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if not isinstance(login, (str, bytes)) or not isinstance(password, (str, bytes)):
            return None
        if isinstance(login, bytes):
            login = login.decode("utf-8", "surrogateescape")
        if isinstance(password, bytes):
            password = password.decode("utf-8", "surrogateescape")
        return login, password
    return None


def server_properties(product: str, version: str, platform: str, cluster_name: str = "") -> dict[str, Any]:
    props: dict[str, Any] = {
        "product": product,
        "version": version,
        "platform": platform,
        "capabilities": {name: True for name in SERVER_CAPABILITIES},
        "information": "raftmq: a clustered AMQP 0-9-1 broker",
        "copyright": "raftmq contributors",
    }
    if cluster_name:
        props["cluster_name"] = cluster_name
    return props
