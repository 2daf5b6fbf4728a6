"""Connection-level behaviour: heartbeats, bad protocol headers, connection.blocked, shutdown and restart."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import commands, frame, header

from tests.integration.conftest import AlarmControl, Target
from tests.integration.helpers import WAIT_S, drain, publish, queue_depth, read_frame, wait_until
from tests.integration.nodeproc import NodeProcess, external_target

SHUTDOWN_TEXT = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"


def _raw_open(target: Target, heartbeat_s: int) -> socket.socket:
    """Handshake by hand (PLAIN guest/guest) and return the open socket."""
    sock = socket.create_connection((target.host, target.port), timeout=WAIT_S)
    buffer = bytearray()
    sock.sendall(header.ProtocolHeader().marshal())
    assert isinstance(read_frame(sock, buffer), commands.Connection.Start)
    sock.sendall(frame.marshal(commands.Connection.StartOk(
        client_properties={"product": "raw-test"}, mechanism="PLAIN", response="\0guest\0guest"), 0))
    tune = read_frame(sock, buffer)
    assert isinstance(tune, commands.Connection.Tune)
    sock.sendall(frame.marshal(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, heartbeat_s), 0))
    sock.sendall(frame.marshal(commands.Connection.Open("/"), 0))
    while not isinstance(read_frame(sock, buffer), commands.Connection.OpenOk):
        pass
    return sock


def _wait_for_eof(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def test_heartbeats_keep_an_idle_connection_alive(amqp_target: Target) -> None:
    connection = pika.BlockingConnection(amqp_target.params(heartbeat=2))
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.2)
        ch = connection.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        publish(ch, "", q, b"alive")
        assert drain(ch, q) == [b"alive"]
    finally:
        connection.close()


def test_silent_client_is_disconnected_after_missed_heartbeats(amqp_target: Target) -> None:
    sock = _raw_open(amqp_target, heartbeat_s=1)
    try:
        assert _wait_for_eof(sock, timeout_s=30)
    finally:
        sock.close()


def test_wrong_protocol_header_gets_ours_back(amqp_target: Target) -> None:
    with socket.create_connection((amqp_target.host, amqp_target.port), timeout=WAIT_S) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        reply = b""
        while len(reply) < 8:
            chunk = sock.recv(8 - len(reply))
            if not chunk:
                break
            reply += chunk
        assert reply == b"AMQP\x00\x00\x09\x01"
        assert _wait_for_eof(sock, timeout_s=WAIT_S)


def test_connection_blocked_while_alarm_is_set(amqp_target: Target, alarm_control: AlarmControl) -> None:
    connection = pika.BlockingConnection(amqp_target.params())
    events: list[str] = []
    connection.add_on_connection_blocked_callback(lambda _c, _m: events.append("blocked"))
    connection.add_on_connection_unblocked_callback(lambda _c, _m: events.append("unblocked"))
    try:
        ch = connection.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        publish(ch, "", q, b"before")
        alarm_control.set_alarm(True)
        connection.process_data_events(time_limit=0.5)
        publish(ch, "", q, b"during")  # a publisher is told it is blocked at the latest when it publishes
        assert wait_until(lambda: "blocked" in events, connection)
        alarm_control.set_alarm(False)
        assert wait_until(lambda: events[-1:] == ["unblocked"], connection)
        assert wait_until(lambda: queue_depth(ch, q) == 2, connection)
        assert drain(ch, q) == [b"before", b"during"]
    finally:
        alarm_control.set_alarm(False)
        connection.close()


def test_a_blocked_publisher_that_keeps_publishing_is_not_read_until_the_alarm_clears(
    amqp_target: Target, alarm_control: AlarmControl
) -> None:
    publisher = pika.BlockingConnection(amqp_target.params())
    observer = pika.BlockingConnection(amqp_target.params())
    try:
        events: list[str] = []
        publisher.add_on_connection_blocked_callback(lambda _c, _m: events.append("blocked"))
        pch, och = publisher.channel(), observer.channel()
        q = och.queue_declare("", exclusive=False, auto_delete=False).method.queue
        publish(pch, "", q, b"first")  # a connection that has published is blocked when an alarm goes off
        assert wait_until(lambda: queue_depth(och, q) == 1, observer)
        alarm_control.set_alarm(True)
        assert wait_until(lambda: "blocked" in events, publisher)
        for n in range(50):  # pika does not stop on connection.blocked: these reach the socket
            publish(pch, "", q, f"m{n}".encode())
        publisher.process_data_events(time_limit=1.0)
        assert queue_depth(och, q) == 1  # the node does not read a blocked connection
        alarm_control.set_alarm(False)
        assert wait_until(lambda: queue_depth(och, q) == 51, publisher)
        assert drain(och, q) == [b"first"] + [f"m{n}".encode() for n in range(50)]
        och.queue_delete(q)
    finally:
        alarm_control.set_alarm(False)
        publisher.close()
        observer.close()


def test_sigterm_closes_connections_with_320_and_exits_0(own_node: Target) -> None:
    connection = pika.BlockingConnection(own_node.params())
    connection.channel()
    assert own_node.node is not None
    own_node.node.send_signal(signal.SIGTERM)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.1)
    assert info.value.reply_code == 320
    assert info.value.reply_text == SHUTDOWN_TEXT
    assert own_node.node.wait_exit() == 0


def test_durable_definitions_and_persistent_messages_survive_restart(own_node: Target) -> None:
    assert own_node.node is not None
    connection = pika.BlockingConnection(own_node.params())
    ch = connection.channel()
    ch.confirm_delivery()
    ch.exchange_declare("it-durable-x", "topic", durable=True)
    ch.queue_declare("it-durable-q", durable=True)
    ch.queue_bind("it-durable-q", "it-durable-x", "k.#")
    ch.queue_declare("it-transient-q", durable=False)
    publish(ch, "it-durable-x", "k.1", b"persistent", delivery_mode=2)
    publish(ch, "it-durable-x", "k.2", b"transient", delivery_mode=1)
    publish(ch, "", "it-transient-q", b"in-transient-queue", delivery_mode=2)
    connection.close()

    node = own_node.node.restart()
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        node.host, node.port, credentials=pika.PlainCredentials("guest", "guest")))
    try:
        ch = connection.channel()
        assert drain(ch, "it-durable-q") == [b"persistent"]
        publish(ch, "it-durable-x", "k.3", b"binding-survived")
        assert drain(ch, "it-durable-q") == [b"binding-survived"]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("it-transient-q", passive=True)
        assert info.value.reply_code == 404
    finally:
        connection.close()


def test_confirmed_messages_survive_a_crash(own_node: Target) -> None:
    assert own_node.node is not None
    connection = pika.BlockingConnection(own_node.params())
    ch = connection.channel()
    ch.queue_declare("it-crash-q", durable=True)
    ch.confirm_delivery()
    for i in range(100):
        publish(ch, "", "it-crash-q", str(i), delivery_mode=2)  # returns only once confirmed (fsynced)
    own_node.node.stop(signal.SIGKILL)
    node = own_node.node.start()
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        node.host, node.port, credentials=pika.PlainCredentials("guest", "guest")))
    try:
        assert drain(connection.channel(), "it-crash-q") == [str(i).encode() for i in range(100)]
    finally:
        connection.close()


def test_acked_messages_stay_gone_after_restart(own_node: Target) -> None:
    assert own_node.node is not None
    connection = pika.BlockingConnection(own_node.params())
    ch = connection.channel()
    ch.queue_declare("it-acked-q", durable=True)
    ch.confirm_delivery()
    for body in (b"a", b"b", b"c"):
        publish(ch, "", "it-acked-q", body, delivery_mode=2)
    method, _props, _body = ch.basic_get("it-acked-q")
    ch.basic_ack(method.delivery_tag)
    connection.close()
    node = own_node.node.restart()
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        node.host, node.port, credentials=pika.PlainCredentials("guest", "guest")))
    try:
        assert drain(connection.channel(), "it-acked-q") == [b"b", b"c"]
    finally:
        connection.close()


def test_connection_max_refuses_extra_connections(tmp_path: Path) -> None:
    """Single mode only: connection_max limits one node process's accept loop, the same code in cluster mode; behind
    HAProxy the count a client sees would be HAProxy's balancing, not the node's limit."""
    if external_target() is not None:
        pytest.skip("needs control of the node process")
    node = NodeProcess(tmp_path / "node", extra_args=("--connection-max", "2")).start()
    params = pika.ConnectionParameters(node.host, node.port, credentials=pika.PlainCredentials("guest", "guest"))
    try:
        first, second = pika.BlockingConnection(params), pika.BlockingConnection(params)
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(params)
        first.close()
        assert wait_until(lambda: _connects(params))
        second.close()
    finally:
        node.stop()


def _connects(params: pika.ConnectionParameters) -> bool:
    try:
        pika.BlockingConnection(params).close()
    except pika.exceptions.AMQPConnectionError:
        return False
    return True
