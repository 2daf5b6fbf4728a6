"""Test helpers: an in-process management server over a real Broker, and a raw HTTP client on trio sockets."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from node.broker.broker import Broker, BrokerConfig
from node.runtime.management import ManagementLimits, serve_management
from node.runtime.management_view import BrokerView

REPO_ROOT = Path(__file__).resolve().parents[2]


def management_wired() -> bool:
    """True once node/runtime starts `serve_management` in the node (tests on real processes need it)."""
    sources = [REPO_ROOT / "node/runtime" / name for name in ("main.py", "server.py", "cluster.py")]
    return any("serve_management" in p.read_text() for p in sources if p.exists())


@dataclass
class Served:
    broker: Broker
    view: BrokerView
    port: int
    emitted: list[Any] = field(default_factory=list)


@asynccontextmanager
async def served_broker(limits: ManagementLimits | None = None, view: Any = None) -> AsyncIterator[Served]:
    broker = Broker(BrokerConfig(durable_replies=False))  # nothing here reports Persist (no store): replies must not wait
    emitted: list[Any] = []
    the_view = view or BrokerView(broker, emitted.extend, node_name="rabbit@test", amqp_port=5672)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_management(the_view, "127.0.0.1", 0, limits=limits,
                                                                        task_status=task_status))
        yield Served(broker, the_view, port, emitted)
        nursery.cancel_scope.cancel()


def auth_header(user: str = "guest", password: str = "guest") -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Send `data`, read until the server closes, return everything it sent."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        out = b""
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return out
            out += chunk


def split_response(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, json.loads(body) if body else None


async def request(port: int, method: str, path: str, body: Any = None, user: str | None = "guest",
                  password: str = "guest") -> tuple[int, dict[str, str], Any]:
    payload = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost", "Connection: close", f"Content-Length: {len(payload)}"]
    if user is not None:
        lines.append(f"Authorization: {auth_header(user, password)}")
    raw = await raw_exchange(port, ("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
    return split_response(raw)
