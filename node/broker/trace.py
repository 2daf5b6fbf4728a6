"""Firehose tracing: copies of published and delivered messages to the vhost's `amq.rabbitmq.trace` (pure).

RabbitMQ's rabbit_trace. Tracing is switched per vhost on one node (`BrokerState.set_tracing`, from `raftmq ctl
trace_on` or PUT /api/vhosts/{vhost} {"tracing": true} on that node's management API); the set of traced vhosts
is node-local state, not replicated and not persisted, as RabbitMQ keeps it in the node's application env. The
hot paths check only `broker.trace_vhosts` (an empty set when tracing is off everywhere) before calling in here.

`tap_in` runs for every basic.publish in a traced vhost (before a transaction holds it, as rabbit_channel does):
the copy goes to the trace exchange with routing key `publish.<exchange>`. `tap_out` runs for every basic.deliver
and basic.get-ok: `deliver.<queue>`. The copy keeps the body, carries RabbitMQ's headers (exchange_name,
routing_keys, properties, node, vhost, connection, channel, user; routed_queues for publishes, redelivered for
deliveries) and no other property (so it is transient), and is published at most once: no confirm, no mandatory
return. Messages that came through the trace exchange itself are not traced again (no loop). While nothing is bound
to the trace exchange (and no policy gives it an alternate exchange) no copy is built at all: it would be dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from node.amqp import methods as m
from node.amqp.properties import BasicProperties
from node.broker.channel import ChannelState, ConnState, Message
from node.broker.state import BrokerState
from node.broker.vhost import VHost

TRACE_EXCHANGE = "amq.rabbitmq.trace"
_PROPERTY_NAMES = tuple(f.name for f in dataclasses.fields(BasicProperties))


def connection_name(conn: ConnState | None, node: str) -> str:
    """The connection as the management API names it (node/runtime/management_view.connection_name)."""
    if conn is None:
        return ""
    return f"{conn.peer_host or '?'} -> {node} #{conn.conn_id}"


def _properties_table(props: Any) -> dict[str, Any]:
    return {name: value for name in _PROPERTY_NAMES if (value := getattr(props, name)) is not None}


def _listened(broker: BrokerState, vhost_name: str) -> VHost[Any] | None:
    """The vhost, if a copy sent to its trace exchange would go anywhere (a binding, or an alternate exchange from
    a policy); else None, and the copy is not built: routed nowhere, it would be dropped unseen."""
    vhost = broker.vhosts.get(vhost_name)
    if vhost is None:
        return None
    exchange = vhost.exchanges.get(TRACE_EXCHANGE)
    if exchange is None or (not exchange.bindings and vhost.alternate_of(exchange) is None):
        return None
    return vhost


def _trace(broker: BrokerState, ch: ChannelState, vhost: VHost[Any], exchange: str, routing_key: str, props: Any,
           body: bytes, key: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    vhost_name = vhost.name
    conn = ch.conn
    headers = {
        "exchange_name": exchange,
        "routing_keys": [routing_key, *_cc(props)],
        "properties": _properties_table(props),
        "node": broker.trace_node,
        **before,
        "vhost": vhost_name,
        "connection": connection_name(conn, broker.trace_node),
        "channel": ch.number,
        "user": conn.username if conn is not None else "",
        **after,
    }
    method = m.BasicPublish(exchange=TRACE_EXCHANGE, routing_key=key)
    counts = broker.messages_routed, broker.messages_unroutable_dropped  # a copy is no client's publish
    broker.publish_route(broker, ch, vhost, method, BasicProperties(headers=headers), body, 0, None)
    broker.messages_routed, broker.messages_unroutable_dropped = counts


def _cc(props: Any) -> list[str]:
    """The CC and BCC routing keys (RabbitMQ's routing_keys annotation holds them after the routing key)."""
    headers = props.headers
    if not headers:
        return []
    keys: list[str] = []
    for name in ("CC", "BCC"):
        value = headers.get(name)
        if isinstance(value, (list, tuple)):
            keys += [v.decode() if isinstance(v, bytes) else str(v) for v in value]
    return keys


def tap_in(broker: BrokerState, ch: ChannelState, vhost_name: str, method: Any, props: Any, body: bytes) -> None:
    """A publish in a vhost with tracing on: `publish.<exchange>`, with the queues it routes to."""
    vhost = _listened(broker, vhost_name)
    if vhost is None:
        return
    routed: tuple[str, ...] | list[str] = ()
    if method.exchange == "":
        routed = [method.routing_key] if method.routing_key in vhost.queues else []
    elif method.exchange in vhost.exchanges:
        routed = vhost.route(method.exchange, method.routing_key, props.headers)
    _trace(broker, ch, vhost, method.exchange, method.routing_key, props, body,
           "publish." + method.exchange, {}, {"routed_queues": list(routed)})


def tap_out(broker: BrokerState, ch: ChannelState, vhost_name: str, queue_name: str, msg: Message,
            redelivered: bool) -> None:
    """A delivery (basic.deliver or basic.get-ok) from a queue of a vhost with tracing on: `deliver.<queue>`."""
    if msg.exchange == TRACE_EXCHANGE:  # a copy delivered from a queue bound to the trace exchange: not again
        return
    vhost = _listened(broker, vhost_name)
    if vhost is not None:
        _trace(broker, ch, vhost, msg.exchange, msg.routing_key, msg.properties, msg.body,
               "deliver." + queue_name, {"redelivered": 1 if redelivered else 0}, {})
