"""ServerConnection over time and under pressure: closing (ours, theirs, both), heartbeats and the handshake
timeout, connection.blocked, and the output buffer bound. The error paths are in test_connection_errors.py."""

from __future__ import annotations

from pamqp import commands

from node.amqp.connection import ConnectionState
from node.amqp.events import ChannelClosed, ConnectionClosed
from node.amqp.properties import BasicProperties
from node.amqp.spec import PROTOCOL_HEADER

from .pamqp_client import HEARTBEAT, Session, close_of, opened, parse_frames, start_ok


# ------------------------------------------------------------------ closing
def test_broker_initiated_connection_close() -> None:
    session = opened((1, 2))
    session.conn.close_connection(320, "CONNECTION_FORCED - broker shutdown")
    out = parse_frames(session.conn.data_to_send())
    assert close_of(out) == (0, 320, "CONNECTION_FORCED - broker shutdown", 0, 0)
    assert session.conn.next_events() == [ChannelClosed(1), ChannelClosed(2)]
    # Everything but Close-Ok is ignored while closing.
    assert session.send_frame(1, commands.Basic.Qos()) == []
    assert session.send_frame(0, commands.Connection.CloseOk()) == []
    assert session.events[-1] == ConnectionClosed(320, "CONNECTION_FORCED - broker shutdown")


def test_close_ok_timeout() -> None:
    session = opened(())
    session.conn.close_connection(320, "CONNECTION_FORCED - broker shutdown")
    deadline = session.conn.next_deadline_ms()
    assert deadline is not None
    session.conn.tick(deadline - 1)
    assert session.conn.state is ConnectionState.CLOSING
    session.conn.tick(deadline)
    assert session.conn.state is ConnectionState.CLOSED
    assert session.conn.next_events()[-1] == ConnectionClosed(320, "CONNECTION_FORCED - broker shutdown")


def test_simultaneous_close() -> None:
    session = opened(())
    session.conn.close_connection(320, "CONNECTION_FORCED - x")
    session.conn.data_to_send()
    out = session.send_frame(
        0, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
    )
    assert [type(f) for _, f in out] == [commands.Connection.CloseOk]
    assert session.conn.state is ConnectionState.CLOSED


# ------------------------------------------------------------------ heartbeats and timers
def test_heartbeat_sent_when_idle_and_missed_heartbeats_close() -> None:
    session = Session()
    session.handshake(heartbeat=10)
    conn = session.conn
    assert conn.next_deadline_ms() == 5000
    conn.tick(4999)
    assert conn.data_to_send() == b""
    conn.tick(5000)
    assert conn.data_to_send() == HEARTBEAT
    conn.receive_data(HEARTBEAT, 15000)
    conn.tick(20000)
    assert conn.data_to_send() == HEARTBEAT
    assert conn.next_deadline_ms() == 25000
    conn.tick(34999)
    assert conn.state is ConnectionState.OPEN
    conn.data_to_send()
    conn.tick(35000)
    assert conn.data_to_send() == b""  # RabbitMQ closes the socket without Connection.Close
    assert conn.next_events()[-1] == ConnectionClosed(501, "missed heartbeats from client, timeout: 10s")
    assert conn.next_deadline_ms() is None


def test_peer_silence_is_not_counted_while_blocked() -> None:
    """The runtime does not read a blocked connection, so the peer's heartbeats wait unread in the socket."""
    session = Session()
    session.handshake(heartbeat=10)
    conn = session.conn
    conn.block("low on memory")
    conn.data_to_send()
    conn.tick(60000)
    assert conn.state is ConnectionState.OPEN
    assert conn.data_to_send() == HEARTBEAT  # our heartbeats keep flowing
    conn.unblock()
    conn.data_to_send()
    conn.tick(79999)
    assert conn.state is ConnectionState.OPEN
    conn.tick(80000)  # silence counts again from the unblock, at 60 s
    assert conn.next_events()[-1] == ConnectionClosed(501, "missed heartbeats from client, timeout: 10s")


def test_peer_silence_is_not_counted_while_reading_is_held() -> None:
    """Credit flow (cluster mode): the runtime holds a publisher's reads without telling it (no connection.blocked)."""
    session = Session()
    session.handshake(heartbeat=10)
    conn = session.conn
    conn.hold_reading(True)
    conn.data_to_send()
    conn.tick(60000)
    assert conn.state is ConnectionState.OPEN
    assert conn.data_to_send() == HEARTBEAT  # our heartbeats keep flowing, and nothing else is sent
    assert conn.next_deadline_ms() == 65000  # only our next heartbeat
    conn.hold_reading(False)
    conn.tick(79999)
    assert conn.state is ConnectionState.OPEN
    conn.tick(80000)  # silence counts again from the moment reading started again, at 60 s
    assert conn.next_events()[-1] == ConnectionClosed(501, "missed heartbeats from client, timeout: 10s")


def test_no_heartbeat_while_traffic_flows() -> None:
    session = Session()
    session.handshake(heartbeat=10)
    session.open_channel(1)
    conn = session.conn
    conn.receive_data(HEARTBEAT, 4000)
    conn.send_ack(1, 1)
    conn.data_to_send()
    conn.tick(5000)
    assert conn.data_to_send() == b""
    conn.tick(9000)
    assert conn.data_to_send() == HEARTBEAT


def test_heartbeat_zero_disables_timers_after_open() -> None:
    session = opened(())
    assert session.conn.next_deadline_ms() is None
    session.conn.tick(10**9)
    assert session.conn.state is ConnectionState.OPEN


def test_handshake_timeout() -> None:
    session = Session()
    session.send(PROTOCOL_HEADER)
    assert session.conn.next_deadline_ms() == 10_000
    session.conn.tick(10_000)
    assert session.conn.state is ConnectionState.CLOSED


# ------------------------------------------------------------------ blocked, output bound
def test_block_and_unblock() -> None:
    session = opened(())
    session.conn.block("low on memory")
    session.conn.block("again")
    session.conn.unblock()
    out = parse_frames(session.conn.data_to_send())
    assert [type(f) for _, f in out] == [commands.Connection.Blocked, commands.Connection.Unblocked]
    assert out[0][1].reason == "low on memory"


def test_block_needs_client_capability() -> None:
    session = Session()
    session.send(PROTOCOL_HEADER)
    session.send(start_ok(capabilities={}))
    session.send_frame(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    session.send_frame(0, commands.Connection.Open(virtual_host="/"))
    session.conn.block("low on memory")
    assert session.conn.data_to_send() == b""


def test_output_buffer_bound_aborts_connection() -> None:
    session = opened((1,), output_buffer_max_bytes=100_000)
    for tag in range(1, 100):
        session.conn.send_deliver(1, "c", tag, False, "", "q", BasicProperties(), b"x" * 10_000)
        if session.conn.state is ConnectionState.CLOSED:
            break
    assert session.conn.state is ConnectionState.CLOSED
    assert session.conn.output_buffer_bytes == 0
    assert session.conn.next_events()[-1].reply_code == 506


def test_handshake_timeout_applies_even_with_heartbeats_negotiated() -> None:
    session = Session()
    session.send(PROTOCOL_HEADER)
    session.send(start_ok())
    session.send_frame(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=60))
    assert session.conn.next_deadline_ms() == 10_000
    for now_ms in range(0, 10_001, 1000):
        session.conn.receive_data(HEARTBEAT, now_ms)
        session.conn.tick(now_ms)
    assert session.conn.state is ConnectionState.CLOSED
