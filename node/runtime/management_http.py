"""The management API's HTTP/1.1 layer on h11 (sans-IO): request checks, bounds and response building (no I/O).

How it works: the server (management.py) owns one `h11.Connection` per client, created by `new_connection` with
`max_incomplete_event_size=HEAD_BYTES_MAX`, so a head that grows past it is refused by h11 with 431. Before bytes
reach h11, `check_head` answers 431 for a head over that size that arrived whole (h11 bounds only incomplete
ones) and 505 for a request line whose version is not HTTP/1.x (h11 would say 400). h11 answers 400 to an
HTTP/1.1 request without Host, as RabbitMQ's cowboy does. When h11 yields an `h11.Request`, `request_head` turns
it into a `RequestHead` (method, percent-decoded path segments, query, lower-cased headers) or raises `HttpError`: unknown method 405, more than `HEADERS_COUNT_MAX`
headers 431, chunked uploads 411 (a management client never needs them), a body over `BODY_BYTES_MAX` 413, a
relative or non-UTF-8 path 400. h11 itself refuses malformed request lines and headers, conflicting or negative
Content-Length and bad framing (`h11.RemoteProtocolError`, whose status hint the server answers with).
`response_events` builds the h11 events of a JSON answer (Content-Length always set; none for 204 and HEAD
bodies). `parse_request` runs the same checks over a byte string, so every edge case is a unit test.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, quote_plus, unquote

import h11

HEAD_BYTES_MAX = 16 * 1024  # request line + headers; browsers and curl send well under 8 KiB
HEADERS_COUNT_MAX = 100
BODY_BYTES_MAX = 1024 * 1024  # definitions-sized JSON bodies; anything bigger is not a management command
METHODS = frozenset({"GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS"})
SERVER_HEADER = b"raftmq-management"
REASONS: dict[int, str] = {
    200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
    413: "Payload Too Large", 415: "Unsupported Media Type", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable", 505: "HTTP Version Not Supported",
}


class HttpError(Exception):
    """A request the server answers with `status` and closes the connection after (the stream may be out of sync)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason


class CommandError(Exception):
    """A view or a route refuses a command or a lookup: answered with `status`, `reason` and RabbitMQ's `error`
    name (derived from the status when not given)."""

    def __init__(self, status: int, reason: Any, error: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.error = error


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    target: str
    segments: tuple[str, ...]  # path split on "/" and percent-decoded: /api/queues/%2F/q -> ("api","queues","/","q")
    query: dict[str, list[str]]
    version: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """The path again from `segments`, each percent-encoded (no query): what a peer is asked for the same
        object (node/runtime/management_peers.py)."""
        return "/" + "/".join(quote(s, safe="") for s in self.segments)

    @property
    def content_length(self) -> int:
        raw = self.headers.get("content-length", "0").strip()
        if not raw.isdigit():
            raise HttpError(400, "bad Content-Length")
        return int(raw)

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


def new_connection() -> h11.Connection:
    return h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_BYTES_MAX)


def check_head(pending: bytes | bytearray) -> None:
    """Checks on the raw bytes of a head before h11 parses them: 431 when the head (complete or not) is over
    HEAD_BYTES_MAX (h11 bounds only an incomplete one), 505 when the complete first line names a version other
    than HTTP/1.0 or HTTP/1.1 (h11 would answer 400)."""
    end = pending.find(b"\r\n\r\n")
    if (end < 0 and len(pending) > HEAD_BYTES_MAX) or end + 4 > HEAD_BYTES_MAX:
        raise HttpError(431, "request head too large")
    end = pending.find(b"\r\n")
    if end < 0:
        return
    parts = bytes(pending[:end]).split(b" ")
    if len(parts) == 3 and parts[2].startswith(b"HTTP/") and parts[2] not in (b"HTTP/1.0", b"HTTP/1.1"):
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1")


def split_path(path: str) -> tuple[str, ...]:
    """Split a raw path on '/' and percent-decode each segment (so %2F inside a segment is a vhost named '/')."""
    return tuple(unquote(part, errors="strict") for part in path.split("/") if part != "")


def request_head(event: h11.Request) -> RequestHead:
    """The checked head of a request h11 parsed; HttpError with the status to answer otherwise."""
    method = event.method.decode("ascii", "replace")
    version = "HTTP/" + event.http_version.decode("ascii", "replace")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1")
    if method not in METHODS:
        raise HttpError(405, f"method {method} not allowed")
    if len(event.headers) > HEADERS_COUNT_MAX:
        raise HttpError(431, "too many headers")
    headers: dict[str, str] = {}
    for name, value in event.headers:
        headers[name.decode("latin-1")] = value.decode("latin-1")  # h11 lower-cases names and strips values
    if "transfer-encoding" in headers:
        raise HttpError(411, "chunked bodies are not accepted; send Content-Length")
    target = event.target.decode("latin-1")
    path, _, query = target.partition("?")
    if not path.startswith("/"):
        raise HttpError(400, "the target must be an absolute path")
    try:
        segments = split_path(path)
    except UnicodeDecodeError:
        raise HttpError(400, "path is not UTF-8") from None
    request = RequestHead(method, target, segments, parse_qs(query), version, headers)
    if request.content_length > BODY_BYTES_MAX:
        raise HttpError(413, f"body over {BODY_BYTES_MAX} bytes")
    return request


def parse_request(data: bytes) -> RequestHead:
    """The head of the request in `data`, checked as the server checks it (HttpError otherwise); for tests."""
    check_head(data)
    conn = new_connection()
    conn.receive_data(data)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise HttpError(exc.error_status_hint, str(exc)) from None
    if event is h11.NEED_DATA:
        if len(data) > HEAD_BYTES_MAX:  # pragma: no cover - h11 raises first
            raise HttpError(431, "request head too large")
        raise HttpError(400, "incomplete request")
    if not isinstance(event, h11.Request):
        raise HttpError(400, "not a request")
    return request_head(event)


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """RabbitMQ's binding id within (source, destination): the quoted key, "~" and a hash of the arguments."""
    quoted = quote_plus(routing_key).replace("~", "%7E") if routing_key else ""
    if not arguments:
        return quoted or "~"
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True, default=str).encode()).digest()[:4]
    return f"{quoted}~{base64.urlsafe_b64encode(digest).decode().rstrip('=')}"


def parse_json_body(body: bytes) -> Any:
    """The JSON body of a request ({} when empty); HttpError 400 when it is not JSON."""
    if not body.strip():
        return {}
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"body is not JSON: {exc}") from None


def encode_body(status: int, payload: Any) -> tuple[bytes, bytes]:
    """(body, content type) of an answer: JSON, text as it is (Prometheus), nothing for 204 or no payload."""
    if payload is None or status == 204:
        return b"", b""
    if isinstance(payload, Text):
        return payload.text.encode("utf-8"), payload.content_type.encode("latin-1")
    return json.dumps(payload, separators=(",", ":")).encode("utf-8"), b"application/json"  # (compact: RabbitMQ's)


@dataclass(frozen=True, slots=True)
class Text:
    """A non-JSON answer body (the Prometheus exposition format)."""

    text: str
    content_type: str = "text/plain; charset=utf-8"


def response_events(status: int, payload: Any = None, *, keep_alive: bool = True,
                    extra_headers: tuple[tuple[str, str], ...] = (), head_only: bool = False) -> list[Any]:
    """The h11 events of a complete answer (Response, Data unless HEAD or empty, EndOfMessage)."""
    body, content_type = encode_body(status, payload)
    headers: list[tuple[bytes, bytes]] = [(b"server", SERVER_HEADER), (b"cache-control", b"no-cache")]
    if status != 204:
        headers.append((b"content-length", str(len(body)).encode("ascii")))
    if content_type:
        headers.append((b"content-type", content_type))
    if not keep_alive:
        headers.append((b"connection", b"close"))
    headers.extend((name.encode("latin-1"), value.encode("latin-1")) for name, value in extra_headers)
    events: list[Any] = [h11.Response(status_code=status, headers=headers, reason=REASONS.get(status, "").encode("ascii"))]
    if body and not head_only:
        events.append(h11.Data(data=body))
    events.append(h11.EndOfMessage())
    return events
