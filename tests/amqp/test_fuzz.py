"""Fuzz/property tests: random and mutated byte streams never crash ServerConnection or grow its buffers.

Every input must end in normal progress or a correct close: no exception escapes, ConnectionClosed comes at most
once and last, every frame we write parses, reply codes are RabbitMQ's (never 541 INTERNAL_ERROR), and the framer
never holds more than one partial frame.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import body as pbody
from pamqp import commands, header

from node.amqp import methods
from node.amqp.connection import ConnectionLimits, ConnectionState, ServerConnection
from node.amqp.events import ChannelClosed, ConnectionClosed
from node.amqp.spec import PROTOCOL_HEADER, ReplyCode

from .pamqp_client import HEARTBEAT, Users, marshal, parse_frames, start_ok

LIMITS = ConnectionLimits(frame_max=8192, max_message_size=20_000, output_buffer_max_bytes=1_000_000)
ALLOWED_CODES = {int(code) for code in ReplyCode} - {ReplyCode.INTERNAL_ERROR}


def handshake_bytes() -> bytes:
    return (
        PROTOCOL_HEADER
        + start_ok()
        + marshal(0, commands.Connection.TuneOk(channel_max=16, frame_max=8192, heartbeat=10))
        + marshal(0, commands.Connection.Open(virtual_host="/"))
    )


def session_frames() -> list[bytes]:
    """A realistic client session as separate frames."""
    frames = [marshal(1, commands.Channel.Open()), marshal(2, commands.Channel.Open())]
    frames.append(marshal(1, commands.Queue.Declare(queue="q", arguments={"x-max-length": 10})))
    frames.append(marshal(1, commands.Confirm.Select()))
    for n in range(3):
        body = bytes([n]) * (5000 * n)
        frames.append(marshal(1, commands.Basic.Publish(exchange="", routing_key="q", mandatory=True)))
        frames.append(
            marshal(
                1,
                header.ContentHeader(
                    0,
                    len(body),
                    commands.Basic.Properties(
                        content_type="text/plain", headers={"n": n, "s": "x"}, delivery_mode=2
                    ),
                ),
            )
        )
        frames += [marshal(1, pbody.ContentBody(body[i : i + 8184])) for i in range(0, len(body), 8184)]
    frames.append(marshal(2, commands.Basic.Consume(queue="q", consumer_tag="c")))
    frames.append(marshal(2, commands.Basic.Ack(delivery_tag=1, multiple=True)))
    frames.append(marshal(2, commands.Basic.Nack(delivery_tag=2, requeue=True)))
    frames.append(HEARTBEAT)
    frames.append(marshal(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)))
    frames.append(
        marshal(0, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    )
    return frames


HANDSHAKE = handshake_bytes()
SESSION = session_frames()


def run(chunks: list[bytes], ticks: list[int] | None = None) -> ServerConnection:
    conn = ServerConnection(Users(), LIMITS)
    output = b""
    events: list[Any] = []
    now_ms = 0
    for i, chunk in enumerate(chunks):
        conn.receive_data(chunk, now_ms)
        if ticks:
            now_ms += ticks[i % len(ticks)]
            conn.tick(now_ms)
        assert conn._framer.buffered_bytes <= max(conn.frame_max, LIMITS.frame_max) + 8
        assert conn.output_buffer_bytes <= LIMITS.output_buffer_max_bytes
        new_events = conn.next_events()
        assert len(new_events) <= len(chunk) // 8 + 3 + len(conn.open_channels) + 16  # ~one event per frame
        answer_closes(conn, new_events)
        events += new_events
        output += conn.data_to_send()
    check_output(output)
    closes = [e for e in events if isinstance(e, ConnectionClosed)]
    assert len(closes) <= 1
    if closes:
        assert events[-1] == closes[0] and conn.state is ConnectionState.CLOSED
        assert closes[0].reply_code != ReplyCode.INTERNAL_ERROR
    return conn


def answer_closes(conn: ServerConnection, events: list[Any]) -> None:
    """What the broker does: answer the client's channel and connection Close once it has handled the events."""
    for event in events:
        if isinstance(event, ChannelClosed) and event.by_client:
            conn.send_method(event.channel, methods.ChannelCloseOk())
        elif isinstance(event, ConnectionClosed) and event.by_client:
            conn.send_method(0, methods.ConnectionCloseOk())


def check_output(output: bytes) -> None:
    if output.startswith(b"AMQP"):
        assert output == PROTOCOL_HEADER
        return
    for channel, frame in parse_frames(output):
        if isinstance(frame, (commands.Connection.Close, commands.Channel.Close)):
            assert frame.reply_code in ALLOWED_CODES, frame
            assert frame.reply_text.split(" - ")[0] == ReplyCode(frame.reply_code).name
            assert (channel == 0) == isinstance(frame, commands.Connection.Close)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for point in points:
        pieces.append(data[last:point])
        last = point
    pieces.append(data[last:])
    return [p for p in pieces if p]


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_valid_session_survives_any_chunking() -> None:
    data = HANDSHAKE + b"".join(SESSION)
    for size in (1, 7, 8, 13, 100, 4096):
        conn = run([data[i : i + size] for i in range(0, len(data), size)])
        assert conn.state is ConnectionState.CLOSED


@FUZZ
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=5))
def test_random_bytes(data: bytes, cuts: list[int]) -> None:
    run(split(data, cuts))


@FUZZ
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=5))
def test_random_bytes_after_protocol_header(data: bytes, cuts: list[int]) -> None:
    run([PROTOCOL_HEADER, *split(data, cuts)])


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes_after_handshake(data: bytes) -> None:
    run([HANDSHAKE, marshal(1, commands.Channel.Open()), data])


@st.composite
def mutated_sessions(draw: st.DrawFn) -> bytes:
    frames = list(SESSION)
    for _ in range(draw(st.integers(1, 4))):
        if not frames:
            break
        index = draw(st.integers(0, len(frames) - 1))
        frame = bytearray(frames[index])
        action = draw(st.sampled_from(["flip", "truncate", "drop", "duplicate", "insert", "swap"]))
        if action == "flip" and frame:
            position = draw(st.integers(0, len(frame) - 1))
            frame[position] ^= draw(st.integers(1, 255))
            frames[index] = bytes(frame)
        elif action == "truncate":
            frames[index] = bytes(frame[: draw(st.integers(0, len(frame)))])
        elif action == "drop":
            del frames[index]
        elif action == "duplicate":
            frames.insert(index, bytes(frame))
        elif action in ("insert", "flip"):
            frames.insert(index, draw(st.binary(min_size=1, max_size=20)))
        else:
            other = draw(st.integers(0, len(frames) - 1))
            frames[index], frames[other] = frames[other], frames[index]
    return b"".join(frames)


@FUZZ
@given(
    stream=mutated_sessions(),
    cuts=st.lists(st.integers(0, 60000), max_size=6),
    ticks=st.lists(st.integers(0, 30000), min_size=1, max_size=3),
)
def test_mutated_sessions(stream: bytes, cuts: list[int], ticks: list[int]) -> None:
    run([HANDSHAKE, *split(stream, cuts)], ticks)


@FUZZ
@given(stream=mutated_sessions())
def test_mutated_handshake(stream: bytes) -> None:
    data = bytearray(HANDSHAKE + stream[:200])
    run([bytes(data[:40]), bytes(data[40:])])
