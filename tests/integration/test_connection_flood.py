"""A flood of silent and half-open connections does not stop a node serving others, and the handshake timeout
closes them (`handshake_timeout_ms`, RabbitMQ's `handshake_timeout`; 5 s here, half the default, so the test
takes less time).

The test holds FLOOD sockets open to a real `raftmq node` (10,000, as issue 20 asks; RAFTMQ_TEST_FLOOD=N for
another number; the test raises its own and the node's RLIMIT_NOFILE to fit): a third send nothing, a third half a protocol
header ("AMQP"), a third the whole header and then nothing (the node has sent connection.start and waits for
start-ok). While they are all open, a pika connection opened before the flood publishes with confirms and gets its
message back, and a new pika client connects, declares a queue, publishes with confirms and consumes (it waits its
turn behind the flood sockets still in the listen backlog: accept is first come, first served). Then every flood
socket must be closed by the node (EOF) once the handshake timeout has passed; the connection opened before the
flood, past its handshake, stays open. Nothing here asserts a duration: the figures the run measured (flood
opened, clients served, how many flood sockets were still open after that, flood closed, the node's RSS) are
printed (`-s` shows them; docs/benchmarks.md).

Single mode only: this is one node process's accept loop and readers, the same code in cluster mode, and the test
needs the node's configuration (handshake timeout) and file-descriptor limit; behind HAProxy the flood would
measure HAProxy's `maxconn` instead."""

from __future__ import annotations

import os
import resource
import select
import socket
import time
from pathlib import Path

import pika
import pytest

from tests.integration.nodeproc import TEST_CONFIG_TOML, NodeProcess, external_target

FLOOD = int(os.environ.get("RAFTMQ_TEST_FLOOD", "10000"))
HANDSHAKE_TIMEOUT_MS = 5_000
FD_SPARE = 500  # descriptors the test process and the node need besides the flood
CLOSE_WAIT_S = 60.0  # generous: when every flood socket must have been closed by the node


def _raise_fd_limit(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, wanted))
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def _node_fd_limit() -> None:  # runs in the node's child before exec
    _raise_fd_limit(FLOOD + FD_SPARE)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _open_flood(port: int, count: int) -> list[socket.socket]:
    socks = []
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        kind = i % 3
        if kind == 1:
            s.sendall(b"AMQP")  # half a protocol header
        elif kind == 2:
            s.sendall(b"AMQP\x00\x00\x09\x01")  # the whole header, then silence
        s.setblocking(False)
        socks.append(s)
    return socks


def _closed_by_peer(sock: socket.socket) -> bool:
    """Drain what the node sent (connection.start); True at EOF or reset."""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _serve_one(port: int, tag: str) -> None:
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
                                       connection_attempts=1, socket_timeout=30, stack_timeout=120,
                                       blocked_connection_timeout=None)
    connection = pika.BlockingConnection(params)
    try:
        ch = connection.channel()
        ch.confirm_delivery()
        queue = ch.queue_declare(f"flood-{tag}", exclusive=True).method.queue
        for i in range(10):
            ch.basic_publish("", queue, f"m{i}".encode())
        got = []
        for _method, _props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=30):
            assert body is not None, "the consumer got nothing while the flood was open"
            got.append(body)
            if len(got) == 10:
                break
        assert got == [f"m{i}".encode() for i in range(10)]
        ch.cancel()
    finally:
        connection.close()


def test_flood_of_silent_connections_does_not_stop_the_node(tmp_path: Path) -> None:
    if external_target() is not None:
        pytest.skip("needs control of the node process")
    if _raise_fd_limit(FLOOD + FD_SPARE) < FLOOD + FD_SPARE:
        pytest.skip(f"the hard RLIMIT_NOFILE is below {FLOOD + FD_SPARE}")
    config = f"handshake_timeout_ms = {HANDSHAKE_TIMEOUT_MS}\n" + TEST_CONFIG_TOML
    node = NodeProcess(tmp_path / "node", config_toml=config, preexec=_node_fd_limit).start()
    assert node.process is not None
    flood: list[socket.socket] = []
    early = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, credentials=pika.PlainCredentials("guest", "guest"), connection_attempts=1))
    try:
        rss_before = _rss_kib(node.process.pid)
        started = time.monotonic()
        flood = _open_flood(node.port, FLOOD)
        opened_s = time.monotonic() - started

        served_at = time.monotonic()
        early_ch = early.channel()
        early_ch.confirm_delivery()
        early_queue = early_ch.queue_declare("", exclusive=True).method.queue
        early_ch.basic_publish("", early_queue, b"early")
        assert early_ch.basic_get(early_queue, auto_ack=True)[2] == b"early"
        early_s = time.monotonic() - served_at
        served_at = time.monotonic()
        _serve_one(node.port, "during")  # connects, publishes with confirms and consumes while the flood is open
        served_s = time.monotonic() - served_at
        rss_flood = _rss_kib(node.process.pid)
        open_socks = {s.fileno(): s for s in flood if not _closed_by_peer(s)}
        open_after_served = len(open_socks)

        poller = select.poll()
        for fd in open_socks:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        deadline = time.monotonic() + CLOSE_WAIT_S
        while open_socks and time.monotonic() < deadline:
            for fd, _event in poller.poll(500):
                sock = open_socks.get(fd)
                if sock is not None and _closed_by_peer(sock):
                    poller.unregister(fd)
                    del open_socks[fd]
        closed_s = time.monotonic() - started
        assert not open_socks, f"{len(open_socks)} of {FLOOD} silent connections were not closed by the node"

        assert early.is_open  # a connection past its handshake is not subject to the handshake timeout
        early.process_data_events(time_limit=0)
        _serve_one(node.port, "after")
        print(f"\nflood of {FLOOD}: opened in {opened_s:.1f} s; served during it: a connection opened before in "
              f"{early_s:.2f} s, a new pika client in {served_s:.2f} s, after which {open_after_served} flood "
              f"sockets were still open; all closed by the node {closed_s:.1f} s after the flood began (handshake "
              f"timeout {HANDSHAKE_TIMEOUT_MS} ms); node RSS {rss_before // 1024} MiB before, {rss_flood // 1024} "
              "MiB with the flood open")
    finally:
        for s in flood:
            s.close()
        if early.is_open:
            early.close()
        code = node.stop()
    assert code == 0, node.log_tail()
