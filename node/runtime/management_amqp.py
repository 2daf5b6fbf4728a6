"""The management API's object changes and message operations, made over AMQP as the requesting user.

What it is for: declaring and deleting queues, exchanges and bindings, purging, publishing and getting messages
from the HTTP API go through the broker's AMQP entry points, exactly as a client's would (RabbitMQ's management
plugin does the same over its direct connection). So they need no broker code of their own, they work alike on a
single node and in a cluster (the node's AMQP side routes a declare to the metadata group, a publish to the
queue's leader), and the user's vhost access and configure/write/read permissions apply as they do for AMQP.

How it works: `amqp_session(target, user, password, vhost)` opens a loopback AMQP connection (cluster/link's trio
client) to the node's own listener with the HTTP request's credentials and yields it with one open channel; every
operation is one or a few synchronous methods on it. A channel or connection close from the broker becomes a
`CommandError` with RabbitMQ's HTTP mapping (rabbit_mgmt_util:with_channel): 404 NOT_FOUND -> 404 "not_found",
403 ACCESS_REFUSED -> 401 "not_authorised", any other code -> 400 "bad_request" with "<code> <text>".
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from cluster.link.client import LinkClosed, LinkConnection, open_link
from cluster.link.uri import AmqpUri
from node.amqp import methods as m
from node.amqp.client import ChannelClosed, Closed, ContentIn, MethodIn
from node.amqp.properties import BasicProperties
from node.runtime.management_http import CommandError

CONNECT_TIMEOUT_MS = 10_000
ACKMODES = frozenset({"ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false"})
PROPERTY_FIELDS = frozenset(BasicProperties.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class AmqpTarget:
    """Where the node's own AMQP listener is (loopback)."""

    host: str = "127.0.0.1"
    port: int = 5672


@dataclass(slots=True)
class Session:
    link: LinkConnection
    channel: int


def amqp_error(exc: LinkClosed, *, with_code: bool = False) -> CommandError:
    """RabbitMQ's answer to a broker close: a declare's 406 says only the explanation; a publish's any close
    `"<code> <text>"` (as RabbitMQ 3.10 answers them)."""
    if with_code:
        return CommandError(400, f"{exc.code} {exc.text}", error="bad_request")
    if exc.code == 404:
        return CommandError(404, exc.text, error="not_found")
    if exc.code in (403, 530):  # ACCESS_REFUSED; NOT_ALLOWED is a vhost the user may not open
        return CommandError(401, exc.text, error="not_authorised")
    _, sep, explanation = exc.text.partition(" - ")
    return CommandError(400, explanation if sep else exc.text, error="bad_request")


def keys_missing(body: dict[str, Any], names: tuple[str, ...]) -> None:
    """400 naming every missing key, in RabbitMQ's (Erlang-printed) words."""
    missing = [name for name in names if name not in body]
    if missing:
        raise CommandError(400, "[" + ",\n ".join(f"{{key_missing,{name}}}" for name in missing) + "]",
                           error="bad_request")


@asynccontextmanager
async def amqp_session(target: AmqpTarget, user: str, password: str, vhost: str) -> AsyncIterator[Session]:
    uri = AmqpUri(host=target.host, port=target.port, username=user, password=password, vhost=vhost,
                  heartbeat_s=0, connection_timeout_ms=CONNECT_TIMEOUT_MS)
    try:
        async with open_link(uri, connection_name="management API") as link:
            yield Session(link, await link.channel())
    except LinkClosed as exc:
        raise amqp_error(exc) from None
    except (OSError, trio.TooSlowError) as exc:
        raise CommandError(503, f"the node's AMQP listener did not answer: {exc}", error="unavailable") from None


async def call(session: Session, method: m.Method, *expect: type[m.Method]) -> m.Method:
    try:
        return await session.link.call(session.channel, method, *expect)
    except LinkClosed as exc:
        raise amqp_error(exc) from None


def flag(body: dict[str, Any], name: str, default: bool = False) -> bool:
    """A boolean body field; RabbitMQ (and rabbitmqadmin) also send "true"/"false" strings."""
    value = body.get(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise CommandError(400, ["not_boolean", value], error="bad_request")


def arguments_of(body: dict[str, Any]) -> dict[str, Any]:
    args = body.get("arguments") or {}
    if not isinstance(args, dict):
        raise CommandError(400, "arguments must be an object", error="bad_request")
    return args


async def declare_queue(session: Session, name: str, body: dict[str, Any]) -> None:
    await call(session, m.QueueDeclare(queue=name, durable=flag(body, "durable", True),
                                       auto_delete=flag(body, "auto_delete"), arguments=arguments_of(body)),
               m.QueueDeclareOk)


async def declare_exchange(session: Session, name: str, body: dict[str, Any]) -> None:
    kind = body.get("type", "direct")  # RabbitMQ's default when the body names none
    if not isinstance(kind, str) or not kind:
        raise CommandError(400, "type must be a string", error="bad_request")
    await call(session, m.ExchangeDeclare(exchange=name, type=kind, durable=flag(body, "durable", True),
                                          auto_delete=flag(body, "auto_delete"), internal=flag(body, "internal"),
                                          arguments=arguments_of(body)), m.ExchangeDeclareOk)


async def bind(session: Session, source: str, dest_kind: str, dest: str, key: str, args: dict[str, Any],
               *, unbind: bool = False) -> None:
    if dest_kind == "q":
        method: m.Method = (m.QueueUnbind(queue=dest, exchange=source, routing_key=key, arguments=args) if unbind
                            else m.QueueBind(queue=dest, exchange=source, routing_key=key, arguments=args))
        await call(session, method, m.QueueUnbindOk if unbind else m.QueueBindOk)
    else:
        method = (m.ExchangeUnbind(destination=dest, source=source, routing_key=key, arguments=args) if unbind
                  else m.ExchangeBind(destination=dest, source=source, routing_key=key, arguments=args))
        await call(session, method, m.ExchangeUnbindOk if unbind else m.ExchangeBindOk)


def properties_of(raw: Any) -> BasicProperties:
    if not isinstance(raw, dict):
        raise CommandError(400, "properties must be an object", error="bad_request")
    unknown = sorted(set(raw) - PROPERTY_FIELDS)
    if unknown:
        raise CommandError(400, f"invalid properties: {', '.join(unknown)}", error="bad_request")
    fields = dict(raw)
    for name in ("delivery_mode", "priority", "timestamp"):
        if name in fields and isinstance(fields[name], str) and fields[name].isdigit():
            fields[name] = int(fields[name])
    return BasicProperties(**fields)


def properties_json(props: BasicProperties) -> dict[str, Any] | list[Any]:
    """The set properties; [] when none is (RabbitMQ prints an empty property list so)."""
    found = {name: getattr(props, name) for name in BasicProperties.__dataclass_fields__
             if getattr(props, name) is not None}
    return found or []


def decode_payload(body: dict[str, Any]) -> bytes:
    keys_missing(body, ("routing_key", "properties", "payload", "payload_encoding"))
    payload, encoding = body["payload"], body["payload_encoding"]
    if not isinstance(payload, str):
        raise CommandError(400, "payload must be a string", error="bad_request")
    if encoding == "string":
        return payload.encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except ValueError:
            raise CommandError(400, "payload is not base64", error="bad_request") from None
    raise CommandError(400, "payload_encoding must be string or base64", error="bad_request")


async def publish(session: Session, exchange: str, body: dict[str, Any]) -> bool:
    """Publish mandatory with a confirm, as RabbitMQ's management plugin does; True when routed."""
    payload = decode_payload(body)
    key = body["routing_key"]
    if not isinstance(key, str):
        raise CommandError(400, "routing_key must be a string", error="bad_request")
    props = properties_of(body["properties"])
    await call(session, m.ConfirmSelect(), m.ConfirmSelectOk)
    link = session.link
    try:
        link.publish(session.channel, exchange, key, props, payload, mandatory=True)
        await link.flush()
    except LinkClosed as exc:
        raise amqp_error(exc, with_code=True) from None
    routed = True
    while True:
        event = await _next_event(session, with_code=True)
        if isinstance(event, ContentIn) and isinstance(event.method, m.BasicReturn):
            routed = False
        elif isinstance(event, MethodIn) and isinstance(event.method, m.BasicAck):
            return routed
        elif isinstance(event, MethodIn) and isinstance(event.method, m.BasicNack):
            raise CommandError(500, "publish_failed", error="internal_error")


async def get(session: Session, queue: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Basic.Get up to `count` messages, then ack or reject them all as `ackmode` says (RabbitMQ's order)."""
    keys_missing(body, ("count", "ackmode", "encoding"))
    count, ackmode = body.get("count"), body.get("ackmode")
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise CommandError(400, "count must be a number", error="bad_request")
    if ackmode not in ACKMODES:
        raise CommandError(400, f"Invalid ackmode: {ackmode}", error="bad_request")
    encoding = body.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise CommandError(400, "Unsupported encoding. Please use auto or base64.", error="bad_request")
    truncate = body.get("truncate")
    truncate = int(truncate) if isinstance(truncate, (int, str)) and str(truncate).isdigit() else None
    rows: list[dict[str, Any]] = []
    tags: list[int] = []
    link = session.link
    for _ in range(count):
        try:
            link.conn.send_method(session.channel, m.BasicGet(queue=queue), 0)
            await link.flush()
        except LinkClosed as exc:
            raise amqp_error(exc) from None
        event = await _next_event(session)
        while not (isinstance(event, ContentIn) or (isinstance(event, MethodIn)
                                                   and isinstance(event.method, m.BasicGetEmpty))):
            event = await _next_event(session)
        if not isinstance(event, ContentIn) or not isinstance(event.method, m.BasicGetOk):
            break
        tags.append(event.method.delivery_tag)
        rows.append(_message_row(event, encoding, truncate))
    for tag in tags:
        if ackmode == "ack_requeue_false":
            link.ack(session.channel, tag)
        else:
            link.conn.send_method(session.channel, m.BasicReject(tag, ackmode.endswith("true")), 0)
    await link.flush()
    return rows


def _message_row(event: ContentIn, encoding: str, truncate: int | None) -> dict[str, Any]:
    method = event.method
    assert isinstance(method, m.BasicGetOk)
    data = event.body if truncate is None else event.body[:truncate]
    text: str | None = None
    if encoding == "auto":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    return {"payload_bytes": len(event.body), "redelivered": method.redelivered, "exchange": method.exchange,
            "routing_key": method.routing_key, "message_count": method.message_count,
            "properties": properties_json(event.properties),
            "payload": text if text is not None else base64.b64encode(data).decode("ascii"),
            "payload_encoding": "string" if text is not None else "base64"}


async def _next_event(session: Session, *, with_code: bool = False) -> Any:
    try:
        event = await session.link.events.receive()
    except (trio.EndOfChannel, trio.ClosedResourceError):
        raise CommandError(503, "the connection ended", error="unavailable") from None
    if isinstance(event, (ChannelClosed, Closed)):
        raise amqp_error(LinkClosed(event.reply_code, event.reply_text), with_code=with_code)
    return event
