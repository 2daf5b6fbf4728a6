"""Cluster-wide listings for the management API: ask every peer's management API for its own rows.

What it is for: connections, channels and consumers live on the node a client reached, but in cluster mode every
node answers for the whole cluster (as every RabbitMQ node does). `peer_rows(peers, path, authorization)` GETs
`path?raftmq_local=true` from each peer's management port at once (an HTTP/1.1 client on h11 and trio), with the
caller's own Authorization, and returns the rows of those that answered 200 within `timeout_s`; a peer that is
down or slow is left out, as RabbitMQ leaves out a node it cannot reach. `raftmq_local=true` makes a node answer
with its own rows only, so peers never fan out in turn. `peer_answers` is the same for any JSON answer (the
overview's counters, each node's own /api/nodes row with its memory and disk); `peer_delete` asks every peer to
delete an object only one of them holds (DELETE /api/connections/{name}: the node holding it closes it).
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
    """The rows of every peer that answered `path` with a JSON list, in one list."""
    answers = await peer_answers(peers, path, authorization, timeout_s)
    return [row for rows in answers if isinstance(rows, list) for row in rows if isinstance(row, dict)]


async def peer_answers(peers: list[tuple[str, int]], path: str, authorization: str,
                       timeout_s: float = PEER_TIMEOUT_S) -> list[Any]:
    """The JSON answer of every peer that answered `path` with 200 in time (the others are left out)."""
    results: list[Any] = [None for _ in peers]

    async def one(index: int, host: str, port: int) -> None:
        with trio.move_on_after(timeout_s):
            try:
                results[index] = await _get(host, port, path, authorization)
            except (OSError, h11.ProtocolError, ValueError, trio.BrokenResourceError) as exc:
                log.info("management: peer %s:%d did not list %s: %s", host, port, path, exc)

    async with trio.open_nursery() as nursery:
        for index, (host, port) in enumerate(peers):
            nursery.start_soon(one, index, host, port)
    return [answer for answer in results if answer is not None]


async def peer_delete(peers: list[tuple[str, int]], path: str, authorization: str,
                      headers: tuple[tuple[str, str], ...] = (), timeout_s: float = PEER_TIMEOUT_S) -> bool:
    """DELETE `path` (with `raftmq_local=true`) on every peer at once; True when one of them answered 204 (the
    node that holds the object, such as a connection, and acted on it)."""
    done: list[bool] = []

    async def one(host: str, port: int) -> None:
        with trio.move_on_after(timeout_s):
            try:
                status, _ = await _request(host, port, "DELETE", path, authorization, headers)
            except (OSError, h11.ProtocolError, ValueError, trio.BrokenResourceError) as exc:
                log.info("management: peer %s:%d did not answer DELETE %s: %s", host, port, path, exc)
                return
            done.append(status == 204)

    async with trio.open_nursery() as nursery:
        for host, port in peers:
            nursery.start_soon(one, host, port)
    return any(done)


async def _get(host: str, port: int, path: str, authorization: str) -> Any:
    status, body = await _request(host, port, "GET", path, authorization)
    if status != 200:
        raise ValueError(f"answered {status}")
    return json.loads(body)


async def _request(host: str, port: int, method: str, path: str, authorization: str,
                   extra: tuple[tuple[str, str], ...] = ()) -> tuple[int, bytes]:
    separator = "&" if "?" in path else "?"
    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(method=method, target=f"{path}{separator}{LOCAL_QUERY}=true",
                          headers=[("Host", f"{host}:{port}"), ("Authorization", authorization),
                                   ("Connection", "close"), *extra])
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
    return status, bytes(body)
