"""Cluster-wide listings for the management API: ask every peer's management API for its own rows.

What it is for: connections, channels and consumers live on the node a client reached, but in cluster mode every
node answers for the whole cluster (as every RabbitMQ node does). `peer_rows(peers, path, authorization)` GETs
`path?raftmq_local=true` from each peer's management port at once (an HTTP/1.1 client on h11 and trio), with the
caller's own Authorization, and returns the rows of those that answered 200 within `timeout_s`; a peer that is
down or slow is left out, as RabbitMQ leaves out a node it cannot reach. `raftmq_local=true` makes a node answer
with its own rows only, so peers never fan out in turn.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import h11
import trio

log = logging.getLogger("raftmq.management")
LOCAL_QUERY = "raftmq_local"
PEER_TIMEOUT_S = 2.0
RESPONSE_BYTES_MAX = 64 * 1024 * 1024


async def peer_rows(peers: list[tuple[str, int]], path: str, authorization: str,
                    timeout_s: float = PEER_TIMEOUT_S) -> list[dict[str, Any]]:
    results: list[list[dict[str, Any]]] = [[] for _ in peers]

    async def one(index: int, host: str, port: int) -> None:
        with trio.move_on_after(timeout_s):
            try:
                results[index] = await _get(host, port, path, authorization)
            except (OSError, h11.ProtocolError, ValueError, trio.BrokenResourceError) as exc:
                log.info("management: peer %s:%d did not list %s: %s", host, port, path, exc)

    async with trio.open_nursery() as nursery:
        for index, (host, port) in enumerate(peers):
            nursery.start_soon(one, index, host, port)
    return [row for rows in results for row in rows]


async def _get(host: str, port: int, path: str, authorization: str) -> list[dict[str, Any]]:
    separator = "&" if "?" in path else "?"
    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(method="GET", target=f"{path}{separator}{LOCAL_QUERY}=true",
                          headers=[("Host", f"{host}:{port}"), ("Authorization", authorization),
                                   ("Connection", "close")])
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(conn.send(request) + conn.send(h11.EndOfMessage()))
        status = 0
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > RESPONSE_BYTES_MAX:
                    raise ValueError("answer too large")
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
    if status != 200:
        raise ValueError(f"answered {status}")
    rows = json.loads(body)
    if not isinstance(rows, list):
        raise ValueError("not a list")
    return [row for row in rows if isinstance(row, dict)]
