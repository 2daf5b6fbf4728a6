"""The management HTTP server: JSON over HTTP/1.1 on trio, RabbitMQ-compatible paths (see management_api.py).

How it works: `serve_management(view, host, port)` listens and runs one task per client connection. Each task
drives an `h11.Connection` (management_http.py: h11 refuses heads over HEAD_BYTES_MAX with 431 and malformed
requests with 400; our checks add 405/411/413/431/505) and reads one request, head and Content-Length body
(BODY_BYTES_MAX), under `request_timeout_s`, so a slow or silent client is dropped (408); it hands the request to
`management_api.handle_request`, which authenticates and calls the `ManagementView`, and writes the whole response
at once. Connections are keep-alive (as h11 decides from the request) for up to `requests_per_connection_max`
requests; at most `connections_max` are served at once (the rest get 503 and are closed). A command that does not
finish within `command_timeout_s` is answered 503 with "outcome unknown" (the change may still happen). Everything
runs on the trio thread of the node, so views read the broker without locks. With an `ssl_context` (the
`management_ssl_*` settings, node/runtime/tls.py) the listener speaks HTTPS: each connection first completes a TLS
handshake within `request_timeout_s`; everything after it is the same. `GET /metrics[/per-object]`
(metrics.py) needs no login, as RabbitMQ's Prometheus endpoint; the Prometheus listener (`metrics_only`) serves
only those paths. `GET /` and `/console/...` serve the web console's files (management_console.py), also without
login: the page logs in itself.

Usage by the runtime: `await nursery.start(serve_management, view, host, port)` returns the bound port. The view is
`management_view.BrokerView(broker, node.dispatch, node_name=...)` on a single node, a subclass in cluster mode.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from typing import Any

import h11
import trio

from node.runtime import metrics
from node.runtime.management_api import (
    CLUSTER_COMMANDS,
    NOT_IN_CLUSTER,
    CommandError,
    ManagementView,
    Reply,
    error_reply,
    handle_request,
    jsonable,
)
from node.runtime.management_console import console_reply
from node.runtime.management_definitions import handle_definitions_request
from node.runtime.management_http import (
    BODY_BYTES_MAX,
    HttpError,
    RequestHead,
    Text,
    check_head,
    new_connection,
    request_head,
    response_events,
)
from node.runtime.management_objects import handle_object_request
from node.runtime.management_queue_rows import handle_queue_rows
from node.runtime.management_shovels import handle_shovel_request
from node.runtime.management_view import BrokerView
from node.runtime.tls import tls_handshake

__all__ = ["CLUSTER_COMMANDS", "NOT_IN_CLUSTER", "BrokerView", "CommandError", "ManagementLimits", "ManagementView",
           "jsonable", "serve_management"]

log = logging.getLogger("raftmq.management")
RECEIVE_BYTES = 64 * 1024
# tried before management_api's own routes
ROUTES = (handle_queue_rows, handle_object_request, handle_definitions_request, handle_shovel_request)


@dataclass(frozen=True, slots=True)
class ManagementLimits:
    connections_max: int = 64
    requests_per_connection_max: int = 1000
    request_timeout_s: float = 10.0  # a whole request (head and body) must arrive within this; also the idle limit
    command_timeout_s: float = 60.0
    send_timeout_s: float = 10.0


class _Server:
    def __init__(self, view: ManagementView, limits: ManagementLimits, metrics_only: bool = False,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.view = view
        self.limits = limits
        self.metrics_only = metrics_only  # the Prometheus listener: /metrics paths only
        self.ssl_context = ssl_context  # HTTPS: each connection starts with a TLS handshake
        self.active = 0

    async def handle(self, socket_stream: trio.SocketStream) -> None:
        if self.active >= self.limits.connections_max:
            if self.ssl_context is None:  # (over TLS there is nobody to answer before a handshake)
                await self._send_error(_Client(socket_stream), 503, "unavailable", "too many connections")
            await trio.aclose_forcefully(socket_stream)
            return
        self.active += 1
        try:
            loopback = _peer_is_loopback(socket_stream)
            stream: trio.abc.Stream = socket_stream
            if self.ssl_context is not None:  # the handshake counts against the request time limit
                timeout_ms = int(self.limits.request_timeout_s * 1000)
                tls, why = await tls_handshake(socket_stream, self.ssl_context, timeout_ms, https_compatible=True)
                if tls is None:
                    log.debug("management: %s", why)
                    return
                stream = tls
            await self._serve(_Client(stream), loopback)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.active -= 1
            await trio.aclose_forcefully(socket_stream)

    async def _serve(self, client: _Client, loopback: bool) -> None:
        for served in range(1, self.limits.requests_per_connection_max + 1):
            try:
                with trio.fail_after(self.limits.request_timeout_s):
                    request = await client.read_request()
            except trio.TooSlowError:
                if client.partial:
                    await self._send_error(client, 408, "timeout", "request too slow")
                return
            except HttpError as err:
                await self._send_error(client, err.status, "bad_request", err.reason)
                return
            if request is None:
                return
            head, body = request
            reply = await self._reply(head, body, loopback)
            keep_alive = head.keep_alive and served < self.limits.requests_per_connection_max
            events = response_events(reply.status, reply.payload, keep_alive=keep_alive,
                                     extra_headers=reply.headers, head_only=head.method == "HEAD")
            if not await self._send(client, events) or client.conn.our_state is not h11.DONE:
                return
            if client.conn.their_state is not h11.DONE:
                return  # h11 decided the connection ends (HTTP/1.0, Connection: close)
            client.conn.start_next_cycle()

    async def _reply(self, head: RequestHead, body: bytes, loopback: bool) -> Reply:
        if head.segments[:1] == ("metrics",) and head.method in ("GET", "HEAD") and \
                head.segments[1:] in ((), ("per-object",)):  # no login, as RabbitMQ's Prometheus endpoint
            view: Any = self.view
            return Reply(200, Text(metrics.render(view, view.counters, view.probe, len(head.segments) == 2),
                                   metrics.CONTENT_TYPE))
        if self.metrics_only:
            return error_reply(404, "Object Not Found", "Not Found")
        page = console_reply(head)  # the web console's static files, no login (management_console.py)
        if page is not None:
            return page
        try:
            with trio.fail_after(self.limits.command_timeout_s):
                return await handle_request(self.view, head, body, loopback, ROUTES)
        except trio.TooSlowError:
            return error_reply(503, "timeout", "the command timed out; outcome unknown")
        except Exception:
            log.exception("management: %s %s failed", head.method, head.target)
            return error_reply(500, "internal_error", "internal error (see the node log)")

    async def _send_error(self, client: _Client, status: int, error: str, reason: str) -> None:
        if client.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await self._send(client, response_events(status, {"error": error, "reason": reason}, keep_alive=False))

    async def _send(self, client: _Client, events: list[Any]) -> bool:
        try:
            data = b"".join(client.conn.send(event) or b"" for event in events)
        except h11.LocalProtocolError:
            return False
        with trio.move_on_after(self.limits.send_timeout_s) as scope:
            await client.stream.send_all(data)
        return not scope.cancelled_caught


class _Client:
    """One client connection: its stream and its h11 state; `partial` while a request has begun arriving."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.conn = new_connection()
        self.partial = False

    async def read_request(self) -> tuple[RequestHead, bytes] | None:
        """One request (head and body); None at a clean end of stream; HttpError for a bad one."""
        head: RequestHead | None = None
        body = bytearray()
        self.partial = bool(self.conn.trailing_data[0])
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise HttpError(exc.error_status_hint, str(exc)) from None
            if event is h11.NEED_DATA:
                chunk = bytes(await self.stream.receive_some(RECEIVE_BYTES))
                if head is None:
                    check_head(bytes(self.conn.trailing_data[0]) + chunk)
                if chunk:
                    self.partial = True
                elif not self.partial:
                    return None
                self.conn.receive_data(chunk)
            elif isinstance(event, h11.Request):
                head = request_head(event)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > BODY_BYTES_MAX:  # pragma: no cover - Content-Length is checked first
                    raise HttpError(413, f"body over {BODY_BYTES_MAX} bytes")
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                return head, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                if self.partial:
                    raise HttpError(400, "connection closed mid-request")
                return None
            else:  # pragma: no cover - h11 yields nothing else to a server
                raise HttpError(400, "unexpected input")


def _peer_is_loopback(stream: trio.SocketStream) -> bool:
    try:
        host = str(stream.socket.getpeername()[0])
    except (OSError, IndexError):
        return False
    return host.startswith("127.") or host == "::1" or host.startswith("::ffff:127.")


async def serve_management(view: ManagementView, host: str, port: int, *,
                           limits: ManagementLimits | None = None, metrics_only: bool = False,
                           ssl_context: ssl.SSLContext | None = None,
                           task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the management API on host:port until cancelled; `task_status.started(bound_port)`. With
    `metrics_only`, only the Prometheus paths (/metrics, /metrics/per-object) are served: the Prometheus listener.
    With `ssl_context`, over HTTPS (each connection's TLS handshake must finish within the request timeout).

    host "" listens on every interface (IPv4 and IPv6, as the AMQP listener does); port 0 picks a free port, in
    which case an empty host binds IPv4 only, so there is one port to report."""
    server = _Server(view, limits or ManagementLimits(), metrics_only, ssl_context)
    bind_host: str | None = host or None
    if port == 0 and bind_host is None:
        bind_host = "0.0.0.0"
    listeners = await trio.open_tcp_listeners(port, host=bind_host)
    bound_port = int(listeners[0].socket.getsockname()[1])
    log.info("%s listening on %s:%d", ("Prometheus" if metrics_only else "management API")
             + (" (HTTPS)" if ssl_context else ""), host or "*", bound_port)
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, server.handle, listeners)
        task_status.started(bound_port)
