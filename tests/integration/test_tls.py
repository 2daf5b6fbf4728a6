"""amqps: real `raftmq node` processes with a TLS listener (`ssl_port`), certificates from deploy/certs.py, and real
clients (pika, aio-pika, py-amqp).

Node `strict` asks for a client certificate and refuses a client without one (verify_peer +
fail_if_no_peer_cert), with certificate login by common name; node `optional` asks for one but lets a client
without one in (verify_peer only), with certificate login by distinguished name (RabbitMQ's default). Shown: the
three clients publish with confirms and consume over TLS; EXTERNAL logs in as the user the certificate names (a
vhost only that user may open), is refused (403) for a certificate naming no user, and is not offered without a
verified certificate; a client without a certificate, or with one from another CA, is refused on `strict`; a
plain AMQP client on the TLS port is closed and logged while an established TLS connection carries on; the plain
listener is unaffected. The amqps listener with the PROXY protocol (`ssl_proxy_protocol_port`) takes the header and
the ClientHello in one segment (the bytes after the header go to TLS) and refuses TLS without the header.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import amqp
import pika
import pika.credentials
import pika.exceptions
import pytest

from deploy.certs import TestPki, make_test_pki
from node.amqp.proxy_protocol import v2_header
from tests.integration.nodeproc import (
    PRIVATE_USER,
    PRIVATE_VHOST,
    TEST_CONFIG_TOML,
    NodeProcess,
    external_target,
)

pytestmark = pytest.mark.skipif(external_target() is not None, reason="needs its own node processes")
TLS_LINE = re.compile(rb"amqps listener on port (\d+)")
TLS_PROXY_LINE = re.compile(rb"amqps PROXY protocol listener on port (\d+)")
WAIT_S = 30.0
HANDSHAKE_TIMEOUT_MS = 3000
DN_USER = "CN=dn-user,O=raftmq test cluster"  # what `distinguished_name` makes of the dn-user certificate


@dataclass
class TlsNode:
    node: NodeProcess
    tls_port: int


@dataclass
class Setup:
    pki: TestPki
    other_pki: TestPki  # another CA: its client certificate is untrusted
    strict: TlsNode
    optional: TlsNode
    optional_proxy_port: int  # optional's amqps listener with the PROXY protocol (ssl_proxy_protocol_port)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])



def _start(workdir: Path, pki: TestPki, settings: str) -> TlsNode:
    paths = pki.nodes["node"]
    config = (f"ssl_port = {_free_port()}\nssl_certfile = \"{paths.cert}\"\nssl_keyfile = \"{paths.key}\"\n"
              f"ssl_cacertfile = \"{pki.ca.cert}\"\nhandshake_timeout_ms = {HANDSHAKE_TIMEOUT_MS}\n{settings}"
              f"{TEST_CONFIG_TOML}\n[[users]]\nname = \"{DN_USER}\"\npassword = \"unused-dn-pw\"\ntags = []\n"
              "vhost = \"/\"\n")
    node = NodeProcess(workdir, config_toml=config).start()
    try:
        return TlsNode(node, node.logged_port(TLS_LINE))
    except BaseException:
        node.stop()
        raise


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("tls")
    clients = ("guest", PRIVATE_USER[0], "nobody", "dn-user")
    pki = make_test_pki(workdir / "pki", {"node": "127.0.0.1"}, clients)
    other = make_test_pki(workdir / "other-pki", {}, ("guest",), ca_name="another CA")
    strict = _start(workdir / "strict", pki, "ssl_verify = \"verify_peer\"\nssl_fail_if_no_peer_cert = true\n"
                    "ssl_cert_login = true\nssl_cert_login_from = \"common_name\"\n")
    try:
        optional = _start(workdir / "optional", pki, "ssl_verify = \"verify_peer\"\nssl_cert_login = true\n"
                          f"ssl_proxy_protocol_port = {_free_port()}\n")
        try:
            yield Setup(pki, other, strict, optional, optional.node.logged_port(TLS_PROXY_LINE))
        finally:
            optional.node.stop()
    finally:
        strict.node.stop()


def _context(setup: Setup, client: str | None, pki: TestPki | None = None) -> ssl.SSLContext:
    """A client context trusting our CA, with `client`'s certificate (from `pki`, ours by default) if named."""
    context = ssl.create_default_context(cafile=str(setup.pki.ca.cert))
    if client is not None:
        paths = (pki or setup.pki).clients[client]
        context.load_cert_chain(str(paths.cert), str(paths.key))
    return context


def _pika(setup: Setup, node: TlsNode, client: str | None, credentials: pika.credentials.VALID_TYPES | None = None,
          vhost: str = "/", pki: TestPki | None = None) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        "localhost", node.tls_port, vhost, credentials or pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(_context(setup, client, pki), "localhost"), connection_attempts=1,
        socket_timeout=10, blocked_connection_timeout=None)
    return pika.BlockingConnection(params)


def _round_trip_pika(connection: pika.BlockingConnection, queue: str, count: int = 50) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, auto_delete=True)
    for i in range(count):
        channel.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2), mandatory=True)
    got = []
    for _method, _props, body in channel.consume(queue, auto_ack=True, inactivity_timeout=10):
        assert body is not None, "a message did not arrive"
        got.append(body)
        if len(got) == count:
            break
    channel.cancel()
    assert got == [f"m{i}".encode() for i in range(count)]


def test_pika_publishes_with_confirms_and_consumes_over_tls(setup: Setup) -> None:
    for node in (setup.strict, setup.optional):
        connection = _pika(setup, node, "guest")
        try:
            _round_trip_pika(connection, "tls-pika")
        finally:
            connection.close()


def test_a_client_without_certificate_logs_in_with_a_password_where_certificates_are_optional(setup: Setup) -> None:
    connection = _pika(setup, setup.optional, None)
    try:
        _round_trip_pika(connection, "tls-no-cert")
    finally:
        connection.close()


def test_aio_pika_publishes_with_confirms_and_consumes_over_tls(setup: Setup) -> None:
    async def run() -> None:
        connection = await aio_pika.connect(f"amqps://guest:guest@localhost:{setup.strict.tls_port}/",
                                            ssl_context=_context(setup, "guest"), timeout=10)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue("tls-aio-pika", auto_delete=True)
            for i in range(50):
                await channel.default_exchange.publish(aio_pika.Message(f"a{i}".encode()), "tls-aio-pika")
            got = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        got.append(message.body)
                    if len(got) == 50:
                        break
            assert got == [f"a{i}".encode() for i in range(50)]

    asyncio.run(asyncio.wait_for(run(), 60))


def test_aio_pika_logs_in_with_external(setup: Setup) -> None:
    async def run() -> None:
        url = f"amqps://localhost:{setup.strict.tls_port}/{PRIVATE_VHOST}?auth=external"
        connection = await aio_pika.connect(url, ssl_context=_context(setup, PRIVATE_USER[0]), timeout=10)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue("tls-aio-external", auto_delete=True)

    asyncio.run(asyncio.wait_for(run(), 60))


def test_py_amqp_publishes_with_confirms_and_consumes_over_tls(setup: Setup) -> None:
    client = setup.pki.clients["guest"]
    sslopts = {"ca_certs": str(setup.pki.ca.cert), "certfile": str(client.cert), "keyfile": str(client.key),
               "cert_reqs": ssl.CERT_REQUIRED, "server_hostname": "localhost"}  # py-amqp's form: wrap_socket's
    connection = amqp.Connection(f"localhost:{setup.strict.tls_port}", userid="guest", password="guest",
                                 ssl=sslopts, confirm_publish=True, connect_timeout=10)
    connection.connect()
    try:
        channel = connection.channel()
        channel.queue_declare("tls-py-amqp", auto_delete=True)
        for i in range(50):
            channel.basic_publish(amqp.Message(f"p{i}".encode()), "", "tls-py-amqp")  # waits for the confirm
        got = []
        for _ in range(50):
            message = channel.basic_get("tls-py-amqp", no_ack=True)
            assert message is not None
            got.append(message.body)
        assert got == [f"p{i}".encode() for i in range(50)]
    finally:
        connection.close()


def test_external_logs_in_as_the_user_the_certificate_names(setup: Setup) -> None:
    # common name (strict): only it-private-owner may open the private vhost
    connection = _pika(setup, setup.strict, PRIVATE_USER[0], pika.credentials.ExternalCredentials(), PRIVATE_VHOST)
    try:
        connection.channel().queue_declare("tls-external", auto_delete=True)
    finally:
        connection.close()
    # distinguished name (optional, RabbitMQ's default): the user named "CN=dn-user,O=raftmq test cluster"
    connection = _pika(setup, setup.optional, "dn-user", pika.credentials.ExternalCredentials())
    try:
        _round_trip_pika(connection, "tls-external-dn", count=5)
    finally:
        connection.close()
    # the same certificate by common name names no user on strict
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        _pika(setup, setup.strict, "dn-user", pika.credentials.ExternalCredentials())
    assert "ACCESS_REFUSED" in str(info.value)


def test_external_for_a_certificate_naming_no_user_is_refused_403(setup: Setup) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        _pika(setup, setup.strict, "nobody", pika.credentials.ExternalCredentials())
    assert "(403) 'ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL" in str(info.value)


def test_external_is_not_offered_without_a_verified_certificate(setup: Setup) -> None:
    with pytest.raises(pika.exceptions.AuthenticationError) as info:  # pika finds no mechanism it can use
        _pika(setup, setup.optional, None, pika.credentials.ExternalCredentials())
    assert "EXTERNAL" in str(info.value)
    connection = pika.BlockingConnection(pika.ConnectionParameters(  # nor on the plain listener
        "127.0.0.1", setup.optional.node.port, credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1, socket_timeout=10))
    connection.close()
    with pytest.raises(pika.exceptions.AuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", setup.optional.node.port, credentials=pika.credentials.ExternalCredentials(),
            connection_attempts=1, socket_timeout=10))


def _refused_count(node: TlsNode) -> int:
    return node.node.log_tail(1_000_000).count("amqps connection from")


def _wait_refused(node: TlsNode, before: int) -> str:
    deadline = time.monotonic() + WAIT_S
    while _refused_count(node) <= before:
        assert time.monotonic() < deadline, node.node.log_tail()
        time.sleep(0.05)
    return node.node.log_tail(1_000_000).rsplit("amqps connection from", 1)[1].splitlines()[0]


@pytest.mark.parametrize("client", ["none", "untrusted"])
def test_strict_refuses_a_client_without_a_trusted_certificate(setup: Setup, client: str) -> None:
    before = _refused_count(setup.strict)
    survivor = _pika(setup, setup.strict, "guest")
    try:
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            if client == "none":
                _pika(setup, setup.strict, None)
            else:
                _pika(setup, setup.strict, "guest", pki=setup.other_pki)
        line = _wait_refused(setup.strict, before)
        assert "TLS handshake failed" in line
        _round_trip_pika(survivor, f"tls-survivor-{client}", count=5)
    finally:
        survivor.close()


def test_a_plain_amqp_client_on_the_tls_port_is_closed_and_others_carry_on(setup: Setup) -> None:
    before = _refused_count(setup.strict)
    survivor = _pika(setup, setup.strict, "guest")
    try:
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", setup.strict.tls_port, credentials=pika.PlainCredentials("guest", "guest"),
                connection_attempts=1, socket_timeout=10))
        assert "TLS handshake failed" in _wait_refused(setup.strict, before)
        # a silent client gets the handshake timeout
        with socket.create_connection(("127.0.0.1", setup.strict.tls_port), timeout=30) as raw:
            assert raw.recv(100) == b""  # closed by the node after HANDSHAKE_TIMEOUT_MS, nothing sent
        assert "no TLS handshake within" in _wait_refused(setup.strict, before + 1)
        _round_trip_pika(survivor, "tls-survivor-plain", count=5)
        plain = pika.BlockingConnection(pika.ConnectionParameters(  # the plain listener serves as before
            "127.0.0.1", setup.strict.node.port, credentials=pika.PlainCredentials("guest", "guest"),
            connection_attempts=1, socket_timeout=10))
        _round_trip_pika(plain, "tls-plain-listener", count=5)
        plain.close()
    finally:
        survivor.close()



class _BioClient:
    """A TLS client over a plain socket through memory BIOs, so the test controls what each write carries."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")

    def _receive(self) -> None:
        data = self.sock.recv(65536)
        assert data, "closed by the node"
        self.incoming.write(data)

    def handshake(self, first: bytes) -> None:
        """The TLS handshake; its first write is `first` followed by the ClientHello, in one segment (as HAProxy
        sends the PROXY header and the client's first bytes)."""
        pending = first
        while True:
            try:
                self.tls.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            self.sock.sendall(pending + self.outgoing.read())
            pending = b""
            if done:
                return
            self._receive()

    def exchange(self, data: bytes, size: int) -> bytes:
        self.tls.write(data)
        self.sock.sendall(self.outgoing.read())
        while True:
            try:
                return self.tls.read(size)
            except ssl.SSLWantReadError:
                self._receive()


def test_the_amqps_proxy_listener_takes_the_header_then_tls_in_one_segment(setup: Setup) -> None:
    header = v2_header(("127.0.0.1", 40000), ("127.0.0.1", setup.optional_proxy_port))
    with socket.create_connection(("127.0.0.1", setup.optional_proxy_port), timeout=30) as sock:
        client = _BioClient(sock, _context(setup, "guest"))
        client.handshake(header)
        assert client.exchange(b"AMQP\x00\x00\x09\x01", 3) == b"\x01\x00\x00"  # Connection.Start follows
    # without the header (TLS straight away) the connection is refused, logged, and others are untouched
    before = setup.optional.node.log_tail(1_000_000).count("refused")
    with (socket.create_connection(("127.0.0.1", setup.optional_proxy_port), timeout=30) as sock,
          pytest.raises((ssl.SSLError, OSError, AssertionError))):
        _BioClient(sock, _context(setup, "guest")).handshake(b"")
    deadline = time.monotonic() + WAIT_S
    while setup.optional.node.log_tail(1_000_000).count("refused") <= before:
        assert time.monotonic() < deadline, setup.optional.node.log_tail()
        time.sleep(0.05)
    connection = _pika(setup, setup.optional, "guest")
    connection.close()
