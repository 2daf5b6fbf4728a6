"""The client's real address behind HAProxy: a real node with a PROXY protocol listener, a real HAProxy sending
`send-proxy-v2` (health checks with the header too), pika clients.

Through HAProxy, guest (a loopback-only user) logs in from loopback and is refused with 403 ACCESS_REFUSED from the
host's non-loopback address (HAProxy listens on both; the node itself only sees HAProxy's loopback connection, so
only the header can tell them apart), and the management API lists the client's own address. On the PROXY
listener a plain AMQP client, a malformed header, a silent peer and a peer that hangs up mid-header are refused
(closed, logged) while an established connection carries on; a hand-built v2 header naming a remote address gets
guest refused, and v1 works as v2 does. The node's plain listener is unaffected.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pika.exceptions
import pytest
import requests

from deploy import runner
from deploy import topology as topo
from deploy.healthcheck import answers_amqp
from node.amqp.proxy_protocol import v1_header, v2_header
from tests.integration.nodeproc import LIMITED_USER, TEST_CONFIG_TOML, NodeProcess, external_target

pytestmark = [
    pytest.mark.skipif(shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
                       reason="HAProxy is not installed (apt-get install haproxy)"),
    pytest.mark.skipif(external_target() is not None, reason="needs its own node process"),
]
MANAGEMENT_LINE = re.compile(rb"management API on port (\d+)")
PROXY_LINE = re.compile(rb"PROXY protocol listener on port (\d+)")
WAIT_S = 30.0
HANDSHAKE_TIMEOUT_MS = 2000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _non_loopback_address() -> str | None:
    """An IPv4 address of this host that is not loopback (the source of a connection to it is that address)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return next((a for a in out if "." in a and not a.startswith("127.")), None)


@dataclass
class Setup:
    node: NodeProcess
    proxy_port: int
    management_port: int
    haproxy_port: int



@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("proxy")
    config = f"proxy_protocol_port = {_free_port()}\nhandshake_timeout_ms = {HANDSHAKE_TIMEOUT_MS}\n" + TEST_CONFIG_TOML
    node = NodeProcess(workdir / "node", config_toml=config).start()
    haproxy: subprocess.Popen[bytes] | None = None
    try:
        proxy_port = node.logged_port(PROXY_LINE)
        management_port = node.logged_port(MANAGEMENT_LINE)
        haproxy_port = _free_port()
        cfg = topo.haproxy_cfg(topo.load(), [("it", "127.0.0.1", proxy_port)], haproxy_port, maxconn=256,
                               bind_address="*", proxy_protocol=True)
        assert "send-proxy-v2 check-send-proxy" in cfg
        cfg_path = workdir / "haproxy.cfg"
        cfg_path.write_text(cfg)
        with (workdir / "haproxy.log").open("ab") as log:
            haproxy = subprocess.Popen([runner.ensure_haproxy(), "-db", "-f", str(cfg_path)], stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        # served only once HAProxy's health check (PROXY v2 LOCAL header, then the AMQP header) marked the node UP
        deadline = time.monotonic() + WAIT_S
        while not answers_amqp("127.0.0.1", haproxy_port, timeout_s=1.0):
            assert haproxy.poll() is None and time.monotonic() < deadline, (workdir / "haproxy.log").read_text()
            time.sleep(0.1)
        yield Setup(node, proxy_port, management_port, haproxy_port)
    finally:
        if haproxy is not None:
            haproxy.terminate()
            haproxy.wait(10)
        node.stop()


def _params(host: str, port: int, user: str = "guest", password: str = "guest") -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host, port, "/", pika.PlainCredentials(user, password), connection_attempts=1,
                                     socket_timeout=10, blocked_connection_timeout=None)


def _connection_hosts(setup: Setup) -> list[str]:
    reply = requests.get(f"http://127.0.0.1:{setup.management_port}/api/connections", auth=("guest", "guest"),
                         timeout=10)
    reply.raise_for_status()
    return [row["peer_host"] for row in reply.json()]


def test_guest_through_haproxy_from_loopback_works_and_is_listed_with_its_address(setup: Setup) -> None:
    connection = pika.BlockingConnection(_params("127.0.0.1", setup.haproxy_port))
    try:
        channel = connection.channel()
        channel.queue_declare("proxy-loopback", auto_delete=True)
        assert "127.0.0.1" in _connection_hosts(setup)
    finally:
        connection.close()


def test_guest_through_haproxy_from_a_non_loopback_address_is_refused(setup: Setup) -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(_params(address, setup.haproxy_port))
    assert "(403) 'ACCESS_REFUSED" in str(info.value)
    # another user may log in from there, and the node lists the client's address, not HAProxy's
    connection = pika.BlockingConnection(_params(address, setup.haproxy_port, *LIMITED_USER))
    try:
        hosts = _connection_hosts(setup)
        assert address in hosts, hosts
    finally:
        connection.close()


class HeaderShim:
    """A local TCP forwarder that opens each connection to the node's PROXY listener with `header` (hand-built),
    then pipes bytes both ways: pika behind a proxy we control."""

    def __init__(self, target_port: int, header: bytes) -> None:
        self.target_port = target_port
        self.header = header
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            upstream.sendall(self.header)
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


def test_a_v2_header_naming_a_remote_client_gets_guest_refused_and_v1_works_as_v2(setup: Setup) -> None:
    remote = HeaderShim(setup.proxy_port, v2_header(("203.0.113.7", 40000), ("192.0.2.2", 5672)))
    local_v1 = HeaderShim(setup.proxy_port, v1_header(("127.0.0.1", 40001), ("127.0.0.1", 5672)))
    try:
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
            pika.BlockingConnection(_params("127.0.0.1", remote.port))
        assert "(403) 'ACCESS_REFUSED" in str(info.value)
        connection = pika.BlockingConnection(_params("127.0.0.1", remote.port, *LIMITED_USER))
        try:
            assert "203.0.113.7" in _connection_hosts(setup)
        finally:
            connection.close()
        pika.BlockingConnection(_params("127.0.0.1", local_v1.port)).close()  # guest, as from loopback
    finally:
        remote.close()
        local_v1.close()


def _closed_by_node(sock: socket.socket) -> bool:
    """True once the node closes `sock` without having sent anything (a refused connection)."""
    sock.settimeout(WAIT_S)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def test_plain_malformed_silent_and_truncated_connections_are_refused_others_carry_on(setup: Setup) -> None:
    established = pika.BlockingConnection(_params("127.0.0.1", setup.haproxy_port))
    channel = established.channel()
    channel.queue_declare("proxy-survivor", auto_delete=True)
    before = setup.node.log_path.read_bytes().count(b"refused:")
    try:
        with pytest.raises(pika.exceptions.AMQPConnectionError):  # a plain AMQP client on the PROXY listener
            pika.BlockingConnection(_params("127.0.0.1", setup.proxy_port))
        bad = [
            b"AMQP\x00\x00\x09\x01",  # no header at all
            b"PROXY TCP4 999.1.1.1 127.0.0.1 1 2\r\nAMQP\x00\x00\x09\x01",  # malformed v1
            v2_header(("203.0.113.7", 1), ("127.0.0.1", 2))[:13] + b"\x12" + bytes(14),  # v2 over UDP
            b"PROXY " + b"x" * 200,  # v1 line over the limit
        ]
        for data in bad:
            with socket.create_connection(("127.0.0.1", setup.proxy_port)) as sock:
                sock.sendall(data)
                assert _closed_by_node(sock), data
        with socket.create_connection(("127.0.0.1", setup.proxy_port)) as silent:  # says nothing: timed out
            assert _closed_by_node(silent)
        with socket.create_connection(("127.0.0.1", setup.proxy_port)) as truncated:  # hangs up mid-header
            truncated.sendall(v2_header(("203.0.113.7", 1), ("127.0.0.1", 2))[:20])
            truncated.shutdown(socket.SHUT_WR)
            assert _closed_by_node(truncated)
        channel.basic_publish("", "proxy-survivor", b"still here")
        method, _, body = channel.basic_get("proxy-survivor", auto_ack=True)
        assert method is not None and body == b"still here"
        # the plain listener of the same node serves direct local clients as before
        pika.BlockingConnection(_params("127.0.0.1", setup.node.port)).close()
    finally:
        established.close()
    deadline = time.monotonic() + WAIT_S
    while setup.node.log_path.read_bytes().count(b"refused:") < before + 7 and time.monotonic() < deadline:
        time.sleep(0.1)
    log = setup.node.log_path.read_bytes()
    assert log.count(b"refused:") >= before + 7, setup.node.log_tail()
    assert b"refused: no PROXY protocol header within" in log
    assert b"refused: closed before the end of the PROXY protocol header" in log
