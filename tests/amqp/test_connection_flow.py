"""Full exchanges driven by pamqp-built client frames: handshake, publish, consume, close."""

from __future__ import annotations

from pamqp import commands

from node.amqp.connection import ConnectionState
from node.amqp.events import (
    ChannelClosed,
    ChannelOpened,
    ConnectionClosed,
    ConnectionOpened,
    ContentReceived,
    MethodReceived,
)
from node.amqp.methods import (
    BasicConsume,
    BasicConsumeOk,
    ChannelCloseOk,
    ConnectionCloseOk,
    QueueDeclare,
    QueueDeclareOk,
)
from node.amqp.properties import BasicProperties
from node.amqp.spec import PROTOCOL_HEADER

from .pamqp_client import Session, parse_frames


def test_connection_start_advertises_rabbitmq_capabilities() -> None:
    session = Session()
    out = session.send(PROTOCOL_HEADER)
    assert len(out) == 1
    channel, start = out[0]
    assert channel == 0 and isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == "PLAIN AMQPLAIN" and start.locales == "en_US"
    props = start.server_properties
    assert props["product"] == "raftmq"
    assert set(props["capabilities"]) == {
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    }
    assert all(value is True for value in props["capabilities"].values())


def test_handshake_publish_consume_close() -> None:
    session = Session()
    out = session.handshake(heartbeat=30, frame_max=8192)
    assert [type(f) for _, f in out] == [commands.Connection.OpenOk]
    opened = session.events[0]
    assert opened == ConnectionOpened("/", "guest", opened.client_properties, 2047, 8192, 30)
    assert opened.client_properties["product"] == "test"
    session.open_channel(1)
    assert session.events[-1] == ChannelOpened(1)

    session.send_frame(
        1, commands.Queue.Declare(queue="q", durable=True, arguments={"x-queue-type": "quorum"})
    )
    assert session.events[-1] == MethodReceived(
        1, QueueDeclare(queue="q", durable=True, arguments={"x-queue-type": "quorum"})
    )
    session.conn.send_method(1, QueueDeclareOk(queue="q", message_count=0, consumer_count=0))
    out = parse_frames(session.conn.data_to_send())
    assert isinstance(out[0][1], commands.Queue.DeclareOk) and out[0][1].queue == "q"

    body = bytes(range(256)) * 100  # 25600 bytes: four body frames at frame_max 8192
    props = commands.Basic.Properties(
        content_type="text/plain",
        delivery_mode=2,
        headers={"k": "v", "n": 7},
        message_id="m1",
        timestamp=None,
    )
    session.publish(1, body, routing_key="q", properties=props, frame_max=8192)
    received = session.events[-1]
    assert isinstance(received, ContentReceived)
    assert received.channel == 1 and received.body == body
    assert received.method.routing_key == "q"
    assert received.properties == BasicProperties(
        content_type="text/plain", delivery_mode=2, headers={"k": "v", "n": 7}, message_id="m1"
    )

    session.send_frame(1, commands.Basic.Consume(queue="q", consumer_tag="ctag"))
    assert session.events[-1] == MethodReceived(1, BasicConsume(queue="q", consumer_tag="ctag"))
    session.conn.send_method(1, BasicConsumeOk("ctag"))
    session.conn.send_deliver(1, "ctag", 1, False, "", "q", received.properties, received.body)
    out = parse_frames(session.conn.data_to_send())
    kinds = [type(f).__name__ for _, f in out]
    assert kinds == [
        "ConsumeOk",
        "Deliver",
        "ContentHeader",
        "ContentBody",
        "ContentBody",
        "ContentBody",
        "ContentBody",
    ]
    assert b"".join(f.value for _, f in out[3:]) == body
    assert all(len(f.value) <= 8192 - 8 for _, f in out[3:])
    assert out[1][1].delivery_tag == 1 and out[1][1].consumer_tag == "ctag"
    assert out[2][1].body_size == len(body) and out[2][1].properties.delivery_mode == 2

    session.send_frame(1, commands.Basic.Ack(delivery_tag=1))
    assert isinstance(session.events[-1], MethodReceived)

    out = session.send_frame(
        1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    )
    assert out == []  # the broker answers it, after whatever it still had to say on the channel
    assert session.events[-1] == ChannelClosed(1, by_client=True)
    session.conn.send_method(1, ChannelCloseOk())
    assert [type(f) for _, f in parse_frames(session.conn.data_to_send())] == [commands.Channel.CloseOk]

    out = session.send_frame(
        0, commands.Connection.Close(reply_code=200, reply_text="Goodbye", class_id=0, method_id=0)
    )
    assert out == []  # the broker answers it too, after what came before
    assert session.events[-1] == ConnectionClosed(200, "Goodbye", by_client=True)
    assert session.conn.state is ConnectionState.CLOSE_RECEIVED
    session.conn.send_method(0, ConnectionCloseOk())
    assert [type(f) for _, f in parse_frames(session.conn.data_to_send())] == [commands.Connection.CloseOk]
    assert session.conn.state is ConnectionState.CLOSED


def test_empty_body_publish_completes_at_header() -> None:
    session = Session()
    session.handshake()
    session.open_channel(1)
    session.publish(1, b"")
    assert isinstance(session.events[-1], ContentReceived) and session.events[-1].body == b""


def test_amqplain_login() -> None:
    from node.amqp.fieldtable import encode_table

    session = Session()
    session.send(PROTOCOL_HEADER)
    response = encode_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:]
    out = session.send_frame(
        0, commands.Connection.StartOk(client_properties={}, mechanism="AMQPLAIN", response=response.decode())
    )
    assert isinstance(out[0][1], commands.Connection.Tune)


def test_one_read_with_everything_pipelined() -> None:
    from .pamqp_client import marshal, start_ok

    session = Session()
    data = PROTOCOL_HEADER + start_ok() + marshal(0, commands.Connection.TuneOk(2047, 131072, 0))
    data += marshal(0, commands.Connection.Open(virtual_host="/")) + marshal(3, commands.Channel.Open())
    out = session.send(data)
    kinds = [type(f).__name__ for _, f in out]
    assert kinds == ["Start", "Tune", "OpenOk", "OpenOk"]
    assert session.events[-1] == ChannelOpened(3)


def test_byte_at_a_time_delivery() -> None:
    from .pamqp_client import marshal, start_ok

    session = Session()
    data = PROTOCOL_HEADER + start_ok() + marshal(0, commands.Connection.TuneOk(2047, 131072, 0))
    data += marshal(0, commands.Connection.Open(virtual_host="/")) + marshal(1, commands.Channel.Open())
    for i in range(len(data)):
        session.conn.receive_data(data[i : i + 1], 0)
    assert session.conn.next_events()[-1] == ChannelOpened(1)
