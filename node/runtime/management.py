"""The management HTTP server: JSON over HTTP/1.1 on trio, RabbitMQ-compatible paths (see management_api.py).

How it works: `serve_management(view, host, port)` listens and runs one task per client connection. Each task
reads a request head (bounded by management_http.HEAD_BYTES_MAX) and its Content-Length body (BODY_BYTES_MAX)
under `request_timeout_s`, so a slow or silent client is dropped (408); it hands the request to
`management_api.handle_request`, which authenticates and calls the `ManagementView`, and writes the whole response
at once. Connections are keep-alive for up to `requests_per_connection_max` requests; at most
`connections_max` are served at once (the rest get 503 and are closed). A command that does not finish within
`command_timeout_s` is answered 503 with "outcome unknown" (the change may still happen). Everything runs on the
trio thread of the node, so views read the broker without locks.

Usage by the runtime: `await nursery.start(serve_management, view, host, port)` returns the bound port. The view is
`management_view.BrokerView(broker, node.dispatch, node_name=...)` on a single node, a subclass in cluster mode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import trio

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
from node.runtime.management_http import (
    HttpError,
    RequestHead,
    find_head_end,
    parse_head,
    render_response,
)
from node.runtime.management_view import BrokerView

__all__ = ["CLUSTER_COMMANDS", "NOT_IN_CLUSTER", "BrokerView", "CommandError", "ManagementLimits", "ManagementView",
           "jsonable", "serve_management"]

log = logging.getLogger("raftmq.management")
RECEIVE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ManagementLimits:
    connections_max: int = 64
    requests_per_connection_max: int = 1000
    request_timeout_s: float = 10.0  # a whole request (head and body) must arrive within this; also the idle limit
    command_timeout_s: float = 60.0
    send_timeout_s: float = 10.0


class _Server:
    def __init__(self, view: ManagementView, limits: ManagementLimits) -> None:
        self.view = view
        self.limits = limits
        self.active = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        if self.active >= self.limits.connections_max:
            await self._send(stream, render_response(503, {"error": "unavailable", "reason": "too many connections"},
                                                     keep_alive=False))
            await trio.aclose_forcefully(stream)
            return
        self.active += 1
        try:
            await self._serve(stream, _peer_is_loopback(stream))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.active -= 1
            await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.SocketStream, loopback: bool) -> None:
        buffer = bytearray()
        for served in range(1, self.limits.requests_per_connection_max + 1):
            try:
                with trio.fail_after(self.limits.request_timeout_s):
                    request = await _read_request(stream, buffer)
            except trio.TooSlowError:
                if buffer:
                    await self._send(stream, render_response(408, {"error": "timeout", "reason": "request too slow"},
                                                             keep_alive=False))
                return
            except HttpError as err:
                await self._send(stream, render_response(err.status, {"error": "bad_request", "reason": err.reason},
                                                         keep_alive=False))
                return
            if request is None:
                return
            head, body = request
            reply = await self._reply(head, body, loopback)
            keep_alive = head.keep_alive and served < self.limits.requests_per_connection_max
            data = render_response(reply.status, reply.payload, keep_alive=keep_alive, extra_headers=reply.headers,
                                   head_only=head.method == "HEAD")
            if not await self._send(stream, data) or not keep_alive:
                return

    async def _reply(self, head: RequestHead, body: bytes, loopback: bool) -> Reply:
        try:
            with trio.fail_after(self.limits.command_timeout_s):
                return await handle_request(self.view, head, body, loopback)
        except trio.TooSlowError:
            return error_reply(503, "timeout", "the command timed out; outcome unknown")
        except Exception:
            log.exception("management: %s %s failed", head.method, head.target)
            return error_reply(500, "internal_error", "internal error (see the node log)")

    async def _send(self, stream: trio.SocketStream, data: bytes) -> bool:
        with trio.move_on_after(self.limits.send_timeout_s) as scope:
            await stream.send_all(data)
        return not scope.cancelled_caught


async def _read_request(stream: trio.SocketStream, buffer: bytearray) -> tuple[RequestHead, bytes] | None:
    """One request from `stream` (bytes past it stay in `buffer`); None at a clean end of stream."""
    end = find_head_end(buffer)
    while end < 0:
        chunk = await stream.receive_some(RECEIVE_BYTES)
        if not chunk:
            if buffer:
                raise HttpError(400, "connection closed mid-request")
            return None
        buffer += chunk
        end = find_head_end(buffer)
    head = parse_head(bytes(buffer[:end]))
    del buffer[:end]
    length = head.content_length
    while len(buffer) < length:
        chunk = await stream.receive_some(RECEIVE_BYTES)
        if not chunk:
            raise HttpError(400, "connection closed mid-body")
        buffer += chunk
    body = bytes(buffer[:length])
    del buffer[:length]
    return head, body


def _peer_is_loopback(stream: trio.SocketStream) -> bool:
    try:
        host = str(stream.socket.getpeername()[0])
    except (OSError, IndexError):
        return False
    return host.startswith("127.") or host == "::1" or host.startswith("::ffff:127.")


async def serve_management(view: ManagementView, host: str, port: int, *,
                           limits: ManagementLimits | None = None,
                           task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the management API on host:port until cancelled; `task_status.started(bound_port)`.

    host "" listens on every interface (IPv4 and IPv6, as the AMQP listener does); port 0 picks a free port, in
    which case an empty host binds IPv4 only, so there is one port to report."""
    server = _Server(view, limits or ManagementLimits())
    bind_host: str | None = host or None
    if port == 0 and bind_host is None:
        bind_host = "0.0.0.0"
    listeners = await trio.open_tcp_listeners(port, host=bind_host)
    bound_port = int(listeners[0].socket.getsockname()[1])
    log.info("management API listening on %s:%d", host or "*", bound_port)
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, server.handle, listeners)
        task_status.started(bound_port)
