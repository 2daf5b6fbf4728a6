"""Test helpers: drive a Broker with node.amqp events the way the runtime does, and pick effects apart."""

from __future__ import annotations

from typing import Any

from node.amqp import events as ev
from node.amqp import methods as m
from node.amqp.properties import BasicProperties
from node.broker.broker import Broker, BrokerConfig
from node.broker.effects import CloseChannel, CloseConnection, Effect, Persist, Send, SendContent


class Client:
    def __init__(self, broker: Broker, conn_id: int = 1, user: str = "guest", vhost: str = "/",
                 cancel_notify: bool = True) -> None:
        self.broker = broker
        self.conn_id = conn_id
        self.now_ms = 0
        broker.open_connection(conn_id, "127.0.0.1", True)
        caps = {"consumer_cancel_notify": cancel_notify}
        self.handle(ev.ConnectionOpened(vhost, user, {"capabilities": caps}))

    def handle(self, event: Any) -> list[Effect]:
        return self.broker.handle(self.conn_id, event, self.now_ms)

    def open(self, channel: int = 1) -> list[Effect]:
        return self.handle(ev.ChannelOpened(channel))

    def call(self, method: Any, channel: int = 1) -> list[Effect]:
        return self.handle(ev.MethodReceived(channel, method))

    def publish(self, exchange: str, routing_key: str, body: bytes = b"x", channel: int = 1,
                mandatory: bool = False, immediate: bool = False, **props: Any) -> list[Effect]:
        method = m.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate)
        return self.handle(ev.ContentReceived(channel, method, BasicProperties(**props), body))

    def declare(self, queue: str, channel: int = 1, **kw: Any) -> list[Effect]:
        return self.call(m.QueueDeclare(queue=queue, **kw), channel)

    def bind(self, queue: str, exchange: str, routing_key: str = "", channel: int = 1, **kw: Any) -> list[Effect]:
        return self.call(m.QueueBind(queue=queue, exchange=exchange, routing_key=routing_key, **kw), channel)

    def consume(self, queue: str, tag: str = "", channel: int = 1, **kw: Any) -> list[Effect]:
        return self.call(m.BasicConsume(queue=queue, consumer_tag=tag, **kw), channel)

    def ack(self, tag: int, multiple: bool = False, channel: int = 1) -> list[Effect]:
        return self.call(m.BasicAck(delivery_tag=tag, multiple=multiple), channel)

    def close_channel(self, channel: int = 1) -> list[Effect]:
        return self.handle(ev.ChannelClosed(channel))

    def close(self) -> list[Effect]:
        return self.handle(ev.ConnectionClosed(200, "bye"))


def new_broker(**kw: Any) -> Broker:
    kw.setdefault("durable_replies", False)  # these tests report no Persist; test_durable_replies.py covers it
    return Broker(BrokerConfig(**kw))


def connected(broker: Broker | None = None, conn_id: int = 1, **kw: Any) -> Client:
    client = Client(broker or new_broker(), conn_id, **kw)
    client.open(1)
    return client


def methods(effects: list[Effect]) -> list[Any]:
    return [e.method for e in effects if isinstance(e, (Send, SendContent))]


def of_type(effects: list[Effect], kind: type) -> list[Any]:
    return [x for x in methods(effects) if isinstance(x, kind)]


def deliveries(effects: list[Effect]) -> list[SendContent]:
    return [e for e in effects if isinstance(e, SendContent) and isinstance(e.method, m.BasicDeliver)]


def bodies(effects: list[Effect]) -> list[bytes]:
    return [e.body for e in deliveries(effects)]


def channel_close(effects: list[Effect]) -> tuple[int, str]:
    closes = [e for e in effects if isinstance(e, CloseChannel)]
    assert closes, f"no channel close in {effects}"
    return closes[0].reply_code, closes[0].reply_text


def connection_close(effects: list[Effect]) -> tuple[int, str]:
    closes = [e for e in effects if isinstance(e, CloseConnection)]
    assert closes, f"no connection close in {effects}"
    return closes[0].reply_code, closes[0].reply_text


def persists(effects: list[Effect]) -> list[Persist]:
    return [e for e in effects if isinstance(e, Persist)]
