"""ConnectionHandshake: Start, Start-Ok, Tune, Tune-Ok, Open and Update-Secret on channel 0.

After the protocol header we send Connection.Start with our mechanisms (EXTERNAL too when the runtime verified a
client certificate); Start-Ok is authenticated by the `Authenticator` (a refused login closes the socket, with a
Close frame only for a client with the authentication_failure_close capability), then Tune, Tune-Ok (the client's
heartbeat is used as is: RabbitMQ does this; clients pick the lower non-zero of theirs and ours) and Open, which
checks vhost access and the vhost's and user's connection limits. In a cluster a refused login or vhost may only
not have reached this node yet: the refusal then waits, once, until the runtime caught up (`_refusal_held`; the
runtime reads nothing meanwhile, so what is held is at most one read). Connection.Update-Secret checks the user
again with the new secret as its password. `CONNECTION_HANDLERS` maps (state, method class) to the handler.
"""

from __future__ import annotations

from typing import Any, Final

from node.amqp import methods as m
from node.amqp.auth import EXTERNAL, MECHANISMS, parse_sasl_response, server_properties
from node.amqp.codec import encode_method_frame
from node.amqp.connection_base import ConnectionState
from node.amqp.connection_closing import ConnectionClosing
from node.amqp.errors import ProtocolError, check_negotiated, reply_text
from node.amqp.events import ConnectionOpened
from node.amqp.spec import FRAME_MIN_SIZE, ReplyCode


class ConnectionHandshake(ConnectionClosing):
    """The connection handshake and Update-Secret."""

    def _send_start(self) -> None:
        limits = self.limits
        start = m.ConnectionStart(
            0,
            9,
            server_properties(limits.product, limits.version, limits.platform, limits.cluster_name),
            " ".join(self._mechanisms()),
            "en_US",
        )
        self._write(encode_method_frame(0, start))
        self.state = ConnectionState.STARTING

    def _mechanisms(self) -> tuple[str, ...]:
        return MECHANISMS if self.external_identity is None else (*MECHANISMS, EXTERNAL)

    def _on_start_ok(self, method: m.Method, now_ms: int) -> None:
        assert isinstance(method, m.ConnectionStartOk)
        self.client_properties = method.client_properties
        if method.mechanism not in self._mechanisms():
            raise ProtocolError(
                ReplyCode.COMMAND_INVALID, f"unknown authentication mechanism '{method.mechanism}'", 10, 11
            )
        if method.mechanism == EXTERNAL and self.external_identity is not None:
            username = self.authenticator.authenticate(EXTERNAL, self.external_identity.encode("utf-8", "surrogateescape"))
        elif parse_sasl_response(method.mechanism, method.response) is None:
            raise ProtocolError(
                ReplyCode.SYNTAX_ERROR, f"malformed {method.mechanism} response from the client", 10, 11
            )
        else:
            username = self.authenticator.authenticate(method.mechanism, method.response)
        if username is None:
            if self._refusal_held():
                return
            text = reply_text(
                ReplyCode.ACCESS_REFUSED,
                f"Login was refused using authentication mechanism {method.mechanism}. "
                "For details see the broker logfile.",
            )
            if self.client_capability("authentication_failure_close"):
                self._write(encode_method_frame(0, m.ConnectionClose(ReplyCode.ACCESS_REFUSED, text, 0, 0)))
            self._finish(ReplyCode.ACCESS_REFUSED, text)
            return
        self.username = username
        self.state = ConnectionState.TUNING
        tune = m.ConnectionTune(self.limits.channel_max, self.limits.frame_max, self.limits.heartbeat_s)
        self._write(encode_method_frame(0, tune))

    def _refusal_held(self) -> bool:
        """Whether a login or vhost refusal waits for the runtime to catch up with the cluster's definitions
        first (`awaiting_recheck`; `recheck` handles the method again, and a refusal then is final): once per
        connection, and only when the authenticator's optional `refusal_may_be_stale()` says so."""
        may_be_stale = getattr(self.authenticator, "refusal_may_be_stale", None)
        if self._rechecked or may_be_stale is None or not may_be_stale():
            return False
        self.awaiting_recheck = True
        return True

    def _on_tune_ok(self, method: m.Method, now_ms: int) -> None:
        assert isinstance(method, m.ConnectionTuneOk)
        check_negotiated("frame_max", FRAME_MIN_SIZE, self.limits.frame_max, method.frame_max)
        check_negotiated("channel_max", 1, self.limits.channel_max, method.channel_max)
        self.frame_max = method.frame_max or self.limits.frame_max
        self.channel_max = method.channel_max or 65535
        self.heartbeat_s = method.heartbeat
        self._framer.frame_max_bytes = self.frame_max
        self._last_send_ms = now_ms
        self.state = ConnectionState.OPENING

    def _on_open(self, method: m.Method, now_ms: int) -> None:
        assert isinstance(method, m.ConnectionOpen)
        vhost = method.virtual_host
        if not self.authenticator.vhost_access(self.username, vhost):
            if self._refusal_held():
                return
            raise ProtocolError(
                ReplyCode.NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{self.username}'", 10, 40
            )
        limit = self.authenticator.connection_limit_reached(vhost)
        if limit is not None:  # RabbitMQ's text (rabbit_reader); checked after the access check, as there
            raise ProtocolError(ReplyCode.NOT_ALLOWED, f"access to vhost '{vhost}' refused for user "
                                f"'{self.username}': connection limit ({limit}) is reached", 10, 40)
        limit = self._user_limit("max-connections")
        if limit is not None:  # RabbitMQ's text (rabbit_reader:is_over_user_connection_limit)
            raise ProtocolError(ReplyCode.NOT_ALLOWED, f"Connection refused for user '{self.username}': user "
                                f"connection limit ({limit}) is reached", 10, 40)
        self.vhost = vhost
        self.state = ConnectionState.OPEN
        self._write(encode_method_frame(0, m.ConnectionOpenOk()))
        self._events.append(
            ConnectionOpened(
                vhost,
                self.username,
                self.client_properties,
                self.channel_max,
                self.frame_max,
                self.heartbeat_s,
            )
        )
        if self.blocked and self.client_capability("connection.blocked"):
            self._write(encode_method_frame(0, m.ConnectionBlocked(self._blocked_reason)))

    def _on_update_secret(self, method: m.Method, now_ms: int) -> None:
        """Connection.Update-Secret (RabbitMQ's extension): the new secret is the user's password now; the user
        is checked again with it, and its vhost access too. Refused: 530, which closes the connection."""
        assert isinstance(method, m.ConnectionUpdateSecret)
        response = b"\0" + self.username.encode("utf-8", "surrogateescape") + b"\0" + method.new_secret
        if self.authenticator.authenticate("PLAIN", response) != self.username:
            raise ProtocolError(
                ReplyCode.NOT_ALLOWED, "New secret was refused by one of the backends: invalid credentials", 10, 70
            )
        if not self.authenticator.vhost_access(self.username, self.vhost):
            raise ProtocolError(
                ReplyCode.NOT_ALLOWED, f"access to vhost '{self.vhost}' refused for user '{self.username}'", 10, 70
            )
        self._write(encode_method_frame(0, m.ConnectionUpdateSecretOk()))


CONNECTION_HANDLERS: Final[dict[tuple[ConnectionState, type[m.Method]], Any]] = {
    (ConnectionState.STARTING, m.ConnectionStartOk): ConnectionHandshake._on_start_ok,
    (ConnectionState.TUNING, m.ConnectionTuneOk): ConnectionHandshake._on_tune_ok,
    (ConnectionState.OPENING, m.ConnectionOpen): ConnectionHandshake._on_open,
    (ConnectionState.OPEN, m.ConnectionUpdateSecret): ConnectionHandshake._on_update_secret,
}
