"""Interop without sockets: pika's own frame encoder drives ServerConnection, pika's decoder reads our output."""

from __future__ import annotations

from typing import Any

from pika import frame as pframe
from pika import spec

from node.amqp.connection import ConnectionLimits, ServerConnection
from node.amqp.events import ChannelOpened, ConnectionOpened, ContentReceived, MethodReceived
from node.amqp.methods import BasicQos, BasicQosOk
from node.amqp.properties import BasicProperties

from .pamqp_client import Users


def pika_frames(data: bytes) -> list[Any]:
    out = []
    while data:
        consumed, decoded = pframe.decode_frame(data)
        assert decoded is not None and consumed > 0
        out.append(decoded)
        data = data[consumed:]
    return out


def method(channel: int, m: Any) -> bytes:
    return pframe.Method(channel, m).marshal()


def test_pika_client_session() -> None:
    conn = ServerConnection(Users(), ConnectionLimits())
    conn.receive_data(pframe.ProtocolHeader().marshal(), 0)
    start = pika_frames(conn.data_to_send())[0].method
    assert isinstance(start, spec.Connection.Start)
    assert start.server_properties["capabilities"]["publisher_confirms"] is True
    capabilities = {"authentication_failure_close": True, "basic.nack": True, "connection.blocked": True}
    conn.receive_data(
        method(0, spec.Connection.StartOk({"capabilities": capabilities}, "PLAIN", b"\0guest\0guest")), 0
    )
    tune = pika_frames(conn.data_to_send())[0].method
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    conn.receive_data(method(0, spec.Connection.TuneOk(2047, 131072, 60)), 0)
    conn.receive_data(method(0, spec.Connection.Open("/")), 0)
    conn.receive_data(method(1, spec.Channel.Open()), 0)
    replies = pika_frames(conn.data_to_send())
    assert [type(f.method) for f in replies] == [spec.Connection.OpenOk, spec.Channel.OpenOk]
    events = conn.next_events()
    assert isinstance(events[0], ConnectionOpened) and events[0].heartbeat_s == 60
    assert events[1] == ChannelOpened(1)

    conn.receive_data(method(1, spec.Basic.Qos(prefetch_count=10)), 0)
    assert conn.next_events() == [MethodReceived(1, BasicQos(prefetch_count=10))]
    conn.send_method(1, BasicQosOk())
    assert isinstance(pika_frames(conn.data_to_send())[0].method, spec.Basic.QosOk)

    props = spec.BasicProperties(
        content_type="application/json",
        delivery_mode=2,
        headers={"x": [1, "a"]},
        timestamp=1700000000,
        priority=5,
    )
    body = b'{"n": 1}' * 30000
    data = method(1, spec.Basic.Publish(exchange="amq.topic", routing_key="a.b", mandatory=True))
    data += pframe.Header(1, len(body), props).marshal()
    for start_at in range(0, len(body), 131064):
        data += pframe.Body(1, body[start_at : start_at + 131064]).marshal()
    conn.receive_data(data, 0)
    (received,) = conn.next_events()
    assert isinstance(received, ContentReceived) and received.body == body
    assert received.method.mandatory and received.method.exchange == "amq.topic"
    assert received.properties == BasicProperties(
        content_type="application/json",
        delivery_mode=2,
        headers={"x": [1, "a"]},
        timestamp=1700000000,
        priority=5,
    )

    conn.send_deliver(1, "ctag", 7, True, "amq.topic", "a.b", received.properties, body)
    deliver, header, *bodies = pika_frames(conn.data_to_send())
    assert isinstance(deliver.method, spec.Basic.Deliver) and deliver.method.redelivered is True
    assert header.body_size == len(body) and header.properties.headers == {"x": [1, "a"]}
    assert header.properties.timestamp == 1700000000
    assert b"".join(f.fragment for f in bodies) == body
    conn.send_ack(1, 1)
    (ack,) = pika_frames(conn.data_to_send())
    assert isinstance(ack.method, spec.Basic.Ack) and ack.method.delivery_tag == 1
