"""A small, bounded HTTP/1.1 request parser and response writer for the management API (no I/O).

How it works: the server reads bytes into a buffer and calls `find_head_end` until the blank line that ends the
head arrives (refusing heads over `HEAD_BYTES_MAX`); `parse_head` turns the head into a `RequestHead` (method,
percent-decoded path segments, query, lower-cased headers) or raises `HttpError` with the status to answer.
The body is read by Content-Length only (chunked uploads are refused with 411/501; a management client never needs
them) and is limited to `BODY_BYTES_MAX`. `render_response` writes a complete response with Content-Length, so a
keep-alive client always knows where a response ends. Nothing here touches sockets or clocks, so every edge case
is a unit test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

HEAD_BYTES_MAX = 16 * 1024  # request line + headers; browsers and curl send well under 8 KiB
HEADERS_COUNT_MAX = 100
BODY_BYTES_MAX = 1024 * 1024  # definitions-sized JSON bodies; anything bigger is not a management command
METHODS = frozenset({"GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS"})

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


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    target: str
    segments: tuple[str, ...]  # path split on "/" and percent-decoded: /api/queues/%2F/q -> ("api","queues","/","q")
    query: dict[str, list[str]]
    version: str
    headers: dict[str, str] = field(default_factory=dict)

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


def find_head_end(buffer: bytes | bytearray) -> int:
    """The index just past the blank line ending the head, or -1 while it has not arrived (HttpError if too big)."""
    end = buffer.find(b"\r\n\r\n")
    if end >= 0:
        if end + 4 > HEAD_BYTES_MAX:
            raise HttpError(431, "request head too large")
        return end + 4
    if len(buffer) > HEAD_BYTES_MAX:
        raise HttpError(431, "request head too large")
    return -1


def split_path(path: str) -> tuple[str, ...]:
    """Split a raw path on '/' and percent-decode each segment (so %2F inside a segment is a vhost named '/')."""
    return tuple(unquote(part, errors="strict") for part in path.split("/") if part != "")


def parse_head(head: bytes) -> RequestHead:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise HttpError(400, "undecodable head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise HttpError(400, "bad request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1")
    if method not in METHODS:
        raise HttpError(405, f"method {method} not allowed")
    headers = _parse_headers(lines[1:])
    if "transfer-encoding" in headers:
        raise HttpError(411, "chunked bodies are not accepted; send Content-Length")
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


def _parse_headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        if not line:
            continue
        if len(headers) >= HEADERS_COUNT_MAX:
            raise HttpError(431, "too many headers")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "bad header line")
        key = name.lower()
        if key == "content-length" and key in headers and headers[key] != value.strip():
            raise HttpError(400, "conflicting Content-Length")
        headers[key] = value.strip()
    return headers


def parse_json_body(body: bytes) -> Any:
    """The JSON body of a request ({} when empty); HttpError 400 when it is not JSON."""
    if not body.strip():
        return {}
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"body is not JSON: {exc}") from None


def render_response(status: int, payload: Any = None, *, keep_alive: bool = True,
                    extra_headers: tuple[tuple[str, str], ...] = (), head_only: bool = False) -> bytes:
    """A complete response: JSON payload (or none for 204), Content-Length always set."""
    body = b"" if payload is None or status == 204 else json.dumps(payload).encode("utf-8")
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", "Server: raftmq-management",
             f"Content-Length: {len(body)}", "Cache-Control: no-cache",
             f"Connection: {'keep-alive' if keep_alive else 'close'}"]
    if body:
        lines.append("Content-Type: application/json")
    lines.extend(f"{name}: {value}" for name, value in extra_headers)
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body
