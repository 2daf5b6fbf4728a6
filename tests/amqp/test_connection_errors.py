"""Every error path of ServerConnection: which side closes (channel or connection), reply code, text, ids.
Closing, heartbeats, timers, connection.blocked and the output bound are in test_connection_timers.py."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import body as pbody
from pamqp import commands, header

from node.amqp import methods as m
from node.amqp.connection import ConnectionState
from node.amqp.events import ChannelClosed, ChannelOpened, ConnectionClosed, MethodReceived
from node.amqp.methods import ChannelFlow
from node.amqp.spec import PROTOCOL_HEADER

from .pamqp_client import Session, Users, close_of, opened, parse_frames, start_ok


# ------------------------------------------------------------------ protocol header
@pytest.mark.parametrize("header", [b"HTTP/1.1 GET /", b"AMQP\x00\x01\x00\x00", b"AMQP\x01\x01\x00\x09"])
def test_bad_protocol_header_is_answered_with_ours_and_closed(header: bytes) -> None:
    session = Session()
    session.conn.receive_data(header, 0)
    assert session.conn.data_to_send() == b"AMQP\x00\x00\x09\x01"
    events = session.conn.next_events()
    assert len(events) == 1 and isinstance(events[0], ConnectionClosed)
    assert session.conn.state is ConnectionState.CLOSED
    session.conn.receive_data(PROTOCOL_HEADER, 0)
    assert session.conn.data_to_send() == b"" and session.conn.next_events() == []


def test_partial_protocol_header_waits() -> None:
    session = Session()
    session.conn.receive_data(b"AMQ", 0)
    assert session.conn.data_to_send() == b"" and session.conn.next_events() == []
    session.conn.receive_data(b"P\x00\x00\x09\x01", 0)
    assert session.conn.state is ConnectionState.STARTING


# ------------------------------------------------------------------ authentication
REFUSED = "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."


def test_auth_failure_with_capability_sends_403_close() -> None:
    session = Session()
    session.send(PROTOCOL_HEADER)
    out = session.send(start_ok(password="wrong"))
    assert close_of(out) == (0, 403, REFUSED, 0, 0)
    assert session.events == [ConnectionClosed(403, REFUSED)]


def test_auth_failure_without_capability_closes_silently() -> None:
    session = Session()
    session.send(PROTOCOL_HEADER)
    out = session.send(start_ok(password="wrong", capabilities={}))
    assert out == []
    assert session.events == [ConnectionClosed(403, REFUSED)]


def test_unknown_mechanism_closes_without_frame() -> None:
    session = Session()
    session.send(PROTOCOL_HEADER)
    out = session.send(start_ok(mechanism="EXTERNAL"))
    assert out == []
    assert session.events == [
        ConnectionClosed(503, "COMMAND_INVALID - unknown authentication mechanism 'EXTERNAL'")
    ]


def test_malformed_plain_response_is_syntax_error() -> None:
    session = Session()
    session.send(PROTOCOL_HEADER)
    out = session.send_frame(
        0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="x")
    )
    assert out == []
    assert session.events[-1].reply_code == 502


# ------------------------------------------------------------------ tune / open
def tuned(**tune: int) -> tuple[Session, list[tuple[int, Any]]]:
    session = Session()
    session.send(PROTOCOL_HEADER)
    session.send(start_ok())
    values = {"channel_max": 2047, "frame_max": 131072, "heartbeat": 0} | tune
    return session, session.send_frame(0, commands.Connection.TuneOk(**values))


def test_tune_ok_frame_max_below_minimum() -> None:
    _, out = tuned(frame_max=1024)
    assert close_of(out) == (
        0,
        530,
        "NOT_ALLOWED - negotiated frame_max = 1024 is lower than the minimum allowed value (4096)",
        10,
        30,
    )


def test_tune_ok_frame_max_above_server() -> None:
    _, out = tuned(frame_max=1 << 20)
    assert close_of(out)[1:3] == (
        530,
        "NOT_ALLOWED - negotiated frame_max = 1048576 is higher than the maximum allowed value (131072)",
    )


def test_tune_ok_channel_max_zero_when_server_limits_it() -> None:
    _, out = tuned(channel_max=0)
    assert close_of(out)[1] == 530


def test_tune_ok_lower_values_are_accepted() -> None:
    session, out = tuned(frame_max=4096, channel_max=10, heartbeat=5)
    assert out == []
    assert (session.conn.frame_max, session.conn.channel_max, session.conn.heartbeat_s) == (4096, 10, 5)


def test_vhost_access_refused() -> None:
    session = Session()
    session.send(PROTOCOL_HEADER)
    session.send(start_ok(user="limited", password="pw"))
    session.send_frame(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    out = session.send_frame(0, commands.Connection.Open(virtual_host="/"))
    assert close_of(out) == (0, 530, "NOT_ALLOWED - access to vhost '/' refused for user 'limited'", 10, 40)
    assert session.events == []
    out = session.send_frame(0, commands.Connection.CloseOk())
    assert out == []
    assert session.events == [
        ConnectionClosed(530, "NOT_ALLOWED - access to vhost '/' refused for user 'limited'")
    ]


def test_channel_frame_during_handshake_is_unexpected() -> None:
    session = Session()
    session.send(PROTOCOL_HEADER)
    session.send(start_ok())
    out = session.send_frame(1, commands.Channel.Open())
    assert close_of(out)[1] == 505


def test_unexpected_connection_method_while_open() -> None:
    session = opened(())
    out = session.send_frame(0, commands.Connection.TuneOk(channel_max=1, frame_max=4096, heartbeat=0))
    assert close_of(out) == (
        0,
        504,
        "CHANNEL_ERROR - unexpected method connection.tune_ok in connection state open",
        10,
        31,
    )


def test_update_secret_with_the_password_is_accepted() -> None:
    session = opened((1,))
    out = session.send_frame(0, commands.Connection.UpdateSecret(new_secret="guest", reason="refresh"))
    assert [(channel, type(f)) for channel, f in out] == [(0, commands.Connection.UpdateSecretOk)]
    assert session.conn.state is ConnectionState.OPEN
    session.open_channel(2)


def test_update_secret_with_a_wrong_secret_closes_the_connection() -> None:
    session = opened((1,))
    out = session.send_frame(0, commands.Connection.UpdateSecret(new_secret="s", reason="r"))
    assert close_of(out) == (
        0, 530, "NOT_ALLOWED - New secret was refused by one of the backends: invalid credentials", 10, 70)


def test_update_secret_rechecks_vhost_access() -> None:
    users = Users(vhosts={"guest": {"/"}})
    session = Session(users=users)
    session.handshake()
    users.vhosts["guest"] = set()  # access revoked since the connection opened
    out = session.send_frame(0, commands.Connection.UpdateSecret(new_secret="guest", reason="r"))
    assert close_of(out) == (0, 530, "NOT_ALLOWED - access to vhost '/' refused for user 'guest'", 10, 70)


# ------------------------------------------------------------------ channels
def test_method_on_unopened_channel_is_connection_error() -> None:
    session = opened(())
    out = session.send_frame(5, commands.Basic.Publish(exchange="", routing_key="q"))
    assert close_of(out) == (0, 504, "CHANNEL_ERROR - expected 'channel.open'", 60, 40)


def test_second_channel_open() -> None:
    session = opened((1,))
    out = session.send_frame(1, commands.Channel.Open())
    assert close_of(out) == (0, 504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


def test_channel_number_above_channel_max_opens() -> None:
    """channel_max limits how many channels are open, not their numbers (RabbitMQ 3.10; aiormq opens 65535)."""
    session = Session()
    session.handshake(channel_max=10)
    session.open_channel(65535)
    assert 65535 in session.conn.open_channels


def test_channel_count_above_channel_max() -> None:
    """The channel_max-th open is refused with RabbitMQ 3.10's text; a channel the server closed counts until its
    Close-Ok (RabbitMQ counts a channel until its process is gone)."""
    session = Session()
    session.handshake(channel_max=3)
    session.open_channel(65535)
    session.conn.close_channel(65535, 403, "ACCESS_REFUSED - operation not permitted on the default exchange", 40, 10)
    assert close_of(parse_frames(session.conn.data_to_send()))[:2] == (65535, 403)
    session.open_channel(1)
    session.open_channel(2)
    out = session.send_frame(3, commands.Channel.Open())
    assert close_of(out) == (
        0,
        530,
        "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)",
        0,
        0,
    )


def test_heartbeat_frame_on_channel_one_is_unexpected() -> None:
    session = opened((1,))
    out = session.send(b"\x08\x00\x01\x00\x00\x00\x00\xce")
    assert close_of(out) == (0, 505, "UNEXPECTED_FRAME - heartbeat frame on channel 1", 0, 0)


def test_body_without_publish() -> None:
    session = opened((1,))
    out = session.send_frame(1, pbody.ContentBody(b"abc"))
    assert close_of(out)[:3] == (
        0,
        505,
        "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
    )


def test_method_instead_of_content_header() -> None:
    session = opened((1,))
    session.send_frame(1, commands.Basic.Publish(exchange="", routing_key="q"))
    out = session.send_frame(1, commands.Basic.Qos())
    assert close_of(out) == (
        0,
        505,
        "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead",
        60,
        40,
    )


def test_method_instead_of_body() -> None:
    session = opened((1,))
    session.send_frame(1, commands.Basic.Publish(exchange="", routing_key="q"))
    session.send_frame(1, header.ContentHeader(0, 10, commands.Basic.Properties()))
    out = session.send_frame(1, commands.Basic.Qos())
    assert close_of(out)[1:3] == (
        505,
        "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
    )


def test_content_header_for_wrong_class() -> None:
    session = opened((1,))
    session.send_frame(1, commands.Basic.Publish(exchange="", routing_key="q"))
    out = session.send(b"\x02\x00\x01\x00\x00\x00\x0e\x00\x32\x00\x00" + b"\x00" * 7 + b"\x01\x00\x00\xce")
    assert close_of(out)[1:3] == (
        505,
        "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead",
    )


def test_body_longer_than_announced() -> None:
    session = opened((1,))
    session.send_frame(1, commands.Basic.Publish(exchange="", routing_key="q"))
    session.send_frame(1, header.ContentHeader(0, 2, commands.Basic.Properties()))
    out = session.send_frame(1, pbody.ContentBody(b"abc"))
    assert close_of(out)[1] == 501


def test_oversized_message_closes_the_channel_only() -> None:
    session = opened((1, 2), max_message_size=1000)
    session.send_frame(1, commands.Basic.Publish(exchange="", routing_key="q"))
    out = session.send_frame(1, header.ContentHeader(0, 5000, commands.Basic.Properties()))
    assert close_of(out) == (
        1,
        406,
        "PRECONDITION_FAILED - message size 5000 is larger than configured max size 1000",
        60,
        40,
    )
    assert session.events[-1] == ChannelClosed(1)
    count = len(session.events)
    # The rest of the message and any other method on the closing channel are ignored ...
    assert session.send_frame(1, pbody.ContentBody(b"x" * 4000)) == []
    assert session.send_frame(1, commands.Basic.Qos(prefetch_count=1)) == []
    assert len(session.events) == count
    # ... other channels carry on ...
    session.send_frame(2, commands.Channel.Flow(active=False))
    assert session.events[-1] == MethodReceived(2, ChannelFlow(active=False))
    # ... and once Close-Ok arrives the number can be reused.
    assert session.send_frame(1, commands.Channel.CloseOk()) == []
    session.open_channel(1)
    assert session.events[-1] == ChannelOpened(1)


def test_broker_closes_channel_and_client_closes_too() -> None:
    session = opened((1,))
    session.conn.close_channel(1, 404, "NOT_FOUND - no queue 'q' in vhost '/'", 50, 10)
    session.events += session.conn.next_events()
    session.conn.data_to_send()
    assert session.events[-1] == ChannelClosed(1)
    out = session.send_frame(
        1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
    )
    assert [type(f) for _, f in out] == [commands.Channel.CloseOk]
    assert session.events.count(ChannelClosed(1)) == 1
    # The closes crossed: the number is free once the client answered ours too (RabbitMQ keeps the channel until
    # then; forgetting it at once made this Close-Ok a 504 "expected 'channel.open'").
    assert session.send_frame(1, commands.Channel.CloseOk()) == []
    session.open_channel(1)
    assert session.events[-1] == ChannelOpened(1)


def test_reopening_a_number_before_answering_our_close_is_504() -> None:
    session = opened((1,))
    session.conn.close_channel(1, 404, "NOT_FOUND - no queue 'q' in vhost '/'", 50, 10)
    session.conn.data_to_send()
    session.send_frame(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    out = session.send_frame(1, commands.Channel.Open())
    assert close_of(out) == (0, 504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)  # as RabbitMQ 3.10


def test_client_close_is_answered_by_the_broker_after_what_came_before() -> None:
    session = opened((1, 2))
    session.publish(1, b"abc", exchange="missing")
    out = session.send_frame(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    assert out == []
    assert session.events[-1] == ChannelClosed(1, by_client=True)
    # The broker, handling the publish, closes the channel: its Close goes out before the Close-Ok.
    session.conn.close_channel(1, 404, "NOT_FOUND - no exchange 'missing' in vhost '/'", 60, 40)
    session.conn.send_method(1, m.ChannelCloseOk())
    out = parse_frames(session.conn.data_to_send())
    assert [(channel, type(f)) for channel, f in out] == [(1, commands.Channel.Close), (1, commands.Channel.CloseOk)]
    assert out[0][1].reply_code == 404
    assert session.events.count(ChannelClosed(1, by_client=True)) == 1 and ChannelClosed(1) not in session.events
    # Only once the client answered our Close is the number free.
    assert session.send_frame(1, commands.Channel.CloseOk()) == []
    session.open_channel(1)
    # Without a Close of ours, the broker's Close-Ok frees the number at once; a stray one is ignored.
    session.send_frame(2, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    session.conn.send_method(2, m.ChannelCloseOk())
    session.conn.send_method(2, m.ChannelCloseOk())
    assert [type(f) for _, f in parse_frames(session.conn.data_to_send())] == [commands.Channel.CloseOk]
    session.open_channel(2)


def test_client_connection_close_is_answered_by_the_broker_after_what_came_before() -> None:
    session = opened((1, 2))
    session.publish(1, b"abc", exchange="missing")
    out = session.send_frame(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert out == []
    assert session.events[-3:] == [ChannelClosed(1), ChannelClosed(2), ConnectionClosed(200, "bye", by_client=True)]
    assert session.conn.state is ConnectionState.CLOSE_RECEIVED
    # Whatever the client sends now is ignored; the core asks for no wake-up.
    assert session.send_frame(2, commands.Basic.Qos(prefetch_count=1)) == []
    assert session.conn.next_deadline_ms() is None
    count = len(session.events)
    # The broker, handling the publish, closes channel 1 (its Close goes out), then answers the Close.
    session.conn.close_channel(1, 404, "NOT_FOUND - no exchange 'missing' in vhost '/'", 60, 40)
    session.conn.send_method(2, m.BasicQosOk())  # (anything else for a channel is dropped)
    session.conn.send_method(0, m.ConnectionCloseOk())
    out = parse_frames(session.conn.data_to_send())
    assert [(channel, type(f)) for channel, f in out] == [(1, commands.Channel.Close), (0, commands.Connection.CloseOk)]
    assert out[0][1].reply_code == 404
    assert session.conn.state is ConnectionState.CLOSED and len(session.events) == count  # no second ConnectionClosed


def test_broker_closing_a_connection_whose_close_it_did_not_answer_yet_answers_it() -> None:
    session = opened((1,))
    session.send_frame(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    session.conn.close_connection(320, "CONNECTION_FORCED - broker shutdown")
    out = parse_frames(session.conn.data_to_send())
    assert [type(f) for _, f in out] == [commands.Connection.CloseOk]
    assert session.conn.state is ConnectionState.CLOSED


def test_frames_after_the_clients_close_are_discarded() -> None:
    session = opened((1,))
    session.send_frame(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    count = len(session.events)
    assert session.send_frame(1, commands.Basic.Qos(prefetch_count=1)) == []
    assert session.send_frame(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)) == []
    assert len(session.events) == count
    session.conn.send_method(1, m.ChannelCloseOk())
    assert [type(f) for _, f in parse_frames(session.conn.data_to_send())] == [commands.Channel.CloseOk]


def test_close_channel_writes_the_close_frame() -> None:
    session = opened((1,))
    session.conn.close_channel(1, 404, "NOT_FOUND - no queue 'q' in vhost '/'", 50, 10)
    out = parse_frames(session.conn.data_to_send())
    assert close_of(out) == (1, 404, "NOT_FOUND - no queue 'q' in vhost '/'", 50, 10)
    session.conn.send_method(1, commands_free_method())
    assert session.conn.data_to_send() == b""  # nothing is sent on a closing channel


def commands_free_method() -> Any:
    from node.amqp.methods import BasicQosOk

    return BasicQosOk()


def test_unknown_class_and_unknown_method() -> None:
    session = opened((1,))
    out = session.send(b"\x01\x00\x01\x00\x00\x00\x04\x00\x63\x00\x01\xce")
    assert close_of(out) == (0, 540, "NOT_IMPLEMENTED - unknown class 99 (method 1)", 99, 1)
    session = opened((1,))
    out = session.send(b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x03\xe7\xce")
    assert close_of(out) == (0, 503, "COMMAND_INVALID - unknown method 999 in class 60", 60, 999)


def test_malformed_method_payload() -> None:
    session = opened((1,))
    out = session.send(b"\x01\x00\x01\x00\x00\x00\x06\x00\x3c\x00\x28\x00\x00\xce")  # publish cut short
    channel, code, text, class_id, method_id = close_of(out)
    assert (channel, code, class_id, method_id) == (0, 501, 60, 40)
    assert text.startswith("FRAME_ERROR - cannot decode method frame")


def test_server_only_method_from_client() -> None:
    session = opened((1,))
    out = session.send_frame(
        1, commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="q")
    )
    assert close_of(out)[1:] == (
        503,
        "COMMAND_INVALID - method basic.deliver is not allowed from a client on channel 1",
        60,
        60,
    )


def test_connection_method_on_channel() -> None:
    session = opened((1,))
    out = session.send_frame(1, commands.Connection.Open(virtual_host="/"))
    assert close_of(out)[1] == 503


def test_content_frame_on_channel_zero() -> None:
    session = opened(())
    out = session.send_frame(0, pbody.ContentBody(b"x"))
    assert close_of(out)[1] == 505


def test_access_request_is_answered() -> None:
    from node.amqp.codec import decode_method, encode_method_frame
    from node.amqp.methods import AccessRequest, AccessRequestOk

    session = opened((1,))
    session.conn.receive_data(encode_method_frame(1, AccessRequest()), 0)
    data = session.conn.data_to_send()
    assert data[:3] == b"\x01\x00\x01" and decode_method(data[7:-1]) == AccessRequestOk()


# ------------------------------------------------------------------ framing
def test_frame_larger_than_frame_max_is_fatal() -> None:
    session = Session()
    session.handshake(frame_max=4096)
    out = session.send(
        b"\x01\x00\x00\x00\x00\x20\x00"
    )  # 8192-byte payload announced: rejected before buffering
    channel, code, text, _, _ = close_of(out)
    assert (channel, code) == (0, 501)
    assert "frame size 8192 is larger than the negotiated frame_max 4096" in text
    assert isinstance(session.events[-1], ConnectionClosed)
    assert session.conn.state is ConnectionState.CLOSED


def test_bad_frame_end() -> None:
    session = opened(())
    out = session.send(b"\x08\x00\x00\x00\x00\x00\x00\xcd")
    assert close_of(out)[1:3] == (
        501,
        "FRAME_ERROR - invalid frame end marker 0xcd (frame type 8, channel 0)",
    )
    assert session.conn.state is ConnectionState.CLOSED


def test_unknown_frame_type() -> None:
    session = opened((1,))
    out = session.send(b"\x05\x00\x01\x00\x00\x00\x00\xce")
    assert close_of(out)[1:3] == (501, "FRAME_ERROR - unknown frame type 5")


def test_reply_text_with_undecodable_name_is_valid_utf8() -> None:
    session = Session()
    session.send(PROTOCOL_HEADER)
    session.send(start_ok())
    session.send_frame(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    out = session.send(b"\x01\x00\x00\x00\x00\x00\x08\x00\x0a\x00\x28\x01\xff\x00\x00\xce")  # vhost b"\xff"
    assert close_of(out)[1:3] == (530, "NOT_ALLOWED - access to vhost '\ufffd' refused for user 'guest'")


def test_unknown_frame_type_on_channel_zero() -> None:
    session = opened(())
    out = session.send(b"\x04\x00\x00\x00\x00\x00\x00\xce")
    assert close_of(out)[1:3] == (501, "FRAME_ERROR - unknown frame type 4")
