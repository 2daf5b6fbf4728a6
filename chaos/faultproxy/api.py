"""Toxiproxy 2.x's HTTP API over trio: the routes, bodies and status codes toxiproxy clients expect.

How it works: a tiny HTTP/1.1 server (one request per connection, `Connection: close`; request head at most
64 KiB, body at most 1 MiB) parses the request, routes it to `FaultProxyServer`, and answers JSON. Routes, as
Toxiproxy 2.x: GET /version; POST /reset (re-enable every proxy, remove every toxic; 204); GET /proxies (object by
name); POST /proxies (201; 409 if the name exists); POST /populate (array of proxies, created or replaced; 201
{"proxies": [...]}); GET/POST/DELETE /proxies/{name} (POST updates upstream/listen/enabled; DELETE 204);
GET/POST /proxies/{name}/toxics (POST 200 with the toxic; 409 if it exists; 400 if invalid);
GET/POST/DELETE /proxies/{name}/toxics/{toxic}. Errors are {"error": text, "status": code}.
"""

from __future__ import annotations

import json
import random
from typing import Any

import trio

from chaos.faultproxy.proxy import Proxy, split_host_port
from chaos.faultproxy.toxics import ToxicError, parse_toxic, updated

VERSION = "2.9.0"
HEAD_BYTES_MAX = 64 * 1024
BODY_BYTES_MAX = 1024 * 1024
REQUEST_TIMEOUT_S = 10.0
REASONS = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 404: "Not Found",
           405: "Method Not Allowed", 409: "Conflict", 500: "Internal Server Error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


Response = tuple[int, Any]


class FaultProxyServer:
    """The proxies and their toxics; `handle(method, path, body)` is the whole API."""

    def __init__(self, nursery: trio.Nursery, seed: int = 0) -> None:
        self.nursery = nursery
        self.rng = random.Random(seed)
        self.proxies: dict[str, Proxy] = {}

    async def handle(self, method: str, path: str, body: Any) -> Response:
        parts = [part for part in path.split("?", 1)[0].split("/") if part]
        try:
            return await self._route(method, parts, body)
        except ToxicError as error:
            raise ApiError(error.status, str(error))

    async def _route(self, method: str, parts: list[str], body: Any) -> Response:
        if parts == ["version"] and method == "GET":
            return 200, VERSION
        if parts == ["reset"] and method == "POST":
            return await self.reset()
        if parts == ["populate"] and method == "POST":
            return await self.populate(body)
        if parts == ["proxies"]:
            if method == "GET":
                return 200, {name: proxy.to_json() for name, proxy in self.proxies.items()}
            if method == "POST":
                return 201, (await self.create(body)).to_json()
        if len(parts) >= 2 and parts[0] == "proxies":
            proxy = self._proxy(parts[1])
            if len(parts) == 2:
                return await self._proxy_route(method, proxy, body)
            if parts[2] == "toxics" and len(parts) in (3, 4):
                return await self._toxic_route(method, proxy, parts[3] if len(parts) == 4 else None, body)
        raise ApiError(404 if method in ("GET", "POST", "DELETE") else 405, "not found")

    def _proxy(self, name: str) -> Proxy:
        if name not in self.proxies:
            raise ApiError(404, "proxy not found")
        return self.proxies[name]

    async def _proxy_route(self, method: str, proxy: Proxy, body: Any) -> Response:
        if method == "GET":
            return 200, proxy.to_json()
        if method == "POST":
            await self.update(proxy, body)
            return 200, proxy.to_json()
        if method == "DELETE":
            await proxy.disable()
            del self.proxies[proxy.name]
            return 204, None
        raise ApiError(405, "method not allowed")

    async def _toxic_route(self, method: str, proxy: Proxy, toxic: str | None, body: Any) -> Response:
        if toxic is None:
            if method == "GET":
                return 200, [t.spec.to_json() for t in proxy.toxics.values()]
            if method == "POST":
                spec = parse_toxic(body)
                if spec.name in proxy.toxics:
                    raise ApiError(409, "toxic already exists")
                proxy.add_toxic(spec)
                return 200, spec.to_json()
            raise ApiError(405, "method not allowed")
        if toxic not in proxy.toxics:
            raise ApiError(404, "toxic not found")
        if method == "GET":
            return 200, proxy.toxics[toxic].spec.to_json()
        if method == "POST":
            spec = updated(proxy.toxics[toxic].spec, body)
            proxy.update_toxic(spec)
            return 200, spec.to_json()
        if method == "DELETE":
            proxy.remove_toxic(toxic)
            return 204, None
        raise ApiError(405, "method not allowed")

    async def create(self, body: Any) -> Proxy:
        if not isinstance(body, dict) or not body.get("name") or not body.get("upstream"):
            raise ApiError(400, "missing required field: name and upstream")
        if body["name"] in self.proxies:
            raise ApiError(409, "proxy already exists")
        try:
            proxy = Proxy(str(body["name"]), str(body.get("listen") or "127.0.0.1:0"), str(body["upstream"]),
                          self.rng)
        except ValueError as error:
            raise ApiError(400, str(error))
        if body.get("enabled", True):
            await self._enable(proxy)
        self.proxies[proxy.name] = proxy
        return proxy

    async def update(self, proxy: Proxy, body: Any) -> None:
        if not isinstance(body, dict):
            raise ApiError(400, "bad request body")
        for field in ("listen", "upstream"):
            if field in body:
                try:
                    split_host_port(str(body[field]))
                except ValueError as error:
                    raise ApiError(400, str(error))
        moved = any(field in body and body[field] != getattr(proxy, field) for field in ("listen", "upstream"))
        enabled = bool(body.get("enabled", proxy.enabled))
        if moved or not enabled:
            await proxy.disable()
        proxy.listen = str(body.get("listen", proxy.listen))
        proxy.upstream = str(body.get("upstream", proxy.upstream))
        if enabled:
            await self._enable(proxy)

    async def _enable(self, proxy: Proxy) -> None:
        try:
            await proxy.enable(self.nursery)
        except OSError as error:
            raise ApiError(500, f"listen {proxy.listen}: {error.strerror or error}")

    async def populate(self, body: Any) -> Response:
        if not isinstance(body, list):
            raise ApiError(400, "populate expects an array of proxies")
        created = []
        for entry in body:
            if isinstance(entry, dict) and entry.get("name") in self.proxies:
                old = self.proxies.pop(str(entry["name"]))
                await old.disable()
            created.append((await self.create(entry)).to_json())
        return 201, {"proxies": created}

    async def reset(self) -> Response:
        for proxy in self.proxies.values():
            proxy.clear_toxics()
            await self._enable(proxy)
        return 204, None

    async def close(self) -> None:
        for proxy in list(self.proxies.values()):
            await proxy.disable()


async def serve_api(server: FaultProxyServer, host: str, port: int,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the HTTP API; reports the bound port through task_status."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[1])

    async def handler(stream: trio.SocketStream) -> None:
        await _serve_one(server, stream)

    await trio.serve_listeners(handler, listeners)


async def _serve_one(server: FaultProxyServer, stream: trio.abc.Stream) -> None:
    async with stream:
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                method, path, body = await _read_request(stream)
                try:
                    status, payload = await server.handle(method, path, body)
                except ApiError as error:
                    status, payload = error.status, {"error": str(error), "status": error.status}
                await stream.send_all(_response(status, payload))
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError):
            return


async def _read_request(stream: trio.abc.Stream) -> tuple[str, str, Any]:
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > HEAD_BYTES_MAX:
            raise ValueError("request head too large")
        data = await stream.receive_some(16384)
        if not data:
            raise ValueError("connection closed mid-request")
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path = lines[0].split(" ")[:2]
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    if length > BODY_BYTES_MAX:
        raise ValueError("request body too large")
    body = bytearray(rest)
    while len(body) < length:
        data = await stream.receive_some(length - len(body))
        if not data:
            raise ValueError("connection closed mid-body")
        body += data
    try:
        parsed = json.loads(body) if body.strip() else None
    except ValueError:
        parsed = ...  # not JSON: every route that needs a body answers 400
    return method, path, parsed


def _response(status: int, payload: Any) -> bytes:
    if status == 204:
        body, content_type = b"", "text/plain"
    elif isinstance(payload, str):
        body, content_type = payload.encode(), "text/plain"
    else:
        body, content_type = json.dumps(payload).encode(), "application/json"
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


async def run_fault_proxy(host: str, port: int, seed: int = 0,
                          task_status: trio.TaskStatus[tuple[FaultProxyServer, int]] = trio.TASK_STATUS_IGNORED,
                          ) -> None:
    """The whole fault proxy: API server and proxies; reports (server, API port) once listening."""
    async with trio.open_nursery() as nursery:
        server = FaultProxyServer(nursery, seed)
        api_port = await nursery.start(serve_api, server, host, port)
        task_status.started((server, api_port))
