"""`raftmq cluster up --tls`: a 3-node cluster with a generated CA, each node with an amqps listener, and HAProxy
passing amqps through to the nodes (TLS ends at the node, the PROXY protocol header goes first).

pika, aio-pika and py-amqp connect through HAProxy's amqps frontend with the generated CA and publish with
confirms to a quorum queue and consume; pika logs in with EXTERNAL (the generated `guest` client certificate,
common name) through HAProxy, which shows the client certificate reached the node; a plain AMQP client on the amqps
frontend gets nowhere while a TLS connection carries on. HAProxy binds every interface here: from the host's
non-loopback address the loopback-only guest is refused over amqps (403), as the PROXY header names that address
to the node. Debian's `rabbitmqadmin --ssl` declares a queue through one node's HTTPS management listener and
reads it from another's. Real processes; no timing asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import sys
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

from deploy import node_plan
from deploy.portshard import owned

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
                                reason="HAProxy is not installed (apt-get install haproxy)")
NODES = 3
CLUSTER_CLI = [sys.executable, "-m", "node.cli", "cluster"]
COUNT = 100


def _free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_layout() -> tuple[int, int, int]:
    """(base port, HAProxy port, HAProxy amqps port) with every port the plan needs free, below the ephemeral
    range."""
    rng = random.Random(os.getpid() + 7)
    for _ in range(200):
        base = rng.randrange(2000, 12000)
        haproxy, haproxy_tls = base + NODES + 1, base + NODES + 2
        ports = [p for n in node_plan.plan_nodes(NODES, base, False, 5672, tls=True)
                 for p in (n.port, n.management_port, n.raft_port, n.metadata_port, n.proxy_port, n.tls_port,
                           n.tls_proxy_port, n.management_tls_port)]
        if all(owned(p) and _free(p) for p in [*ports, haproxy, haproxy_tls]):
            return base, haproxy, haproxy_tls
    raise RuntimeError("no free port layout")


@dataclass
class TlsCluster:
    data_dir: Path
    haproxy_port: int
    tls_port: int
    base_port: int = 0

    def management_tls_ports(self) -> list[int]:
        return [n.management_tls_port for n in node_plan.plan_nodes(NODES, self.base_port, False, 5672, tls=True)]

    @property
    def tls_dir(self) -> Path:
        return self.data_dir / node_plan.TLS_DIR_NAME

    def context(self, client: str | None = "client") -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.tls_dir / "ca.pem"))
        if client is not None:
            context.load_cert_chain(str(self.tls_dir / f"{client}.pem"), str(self.tls_dir / f"{client}.key"))
        return context


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    base, haproxy_port, tls_port = _free_layout()
    data_dir = tmp_path_factory.mktemp("tls-cluster") / "data"
    up = [*CLUSTER_CLI, "up", "--tls", "--nodes", str(NODES), "--base-port", str(base), "--haproxy-port",
          str(haproxy_port), "--tls-port", str(tls_port), "--haproxy-bind", "*", "--detach", "--data-dir",
          str(data_dir)]
    result = subprocess.run(up, capture_output=True, text=True, timeout=180)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"amqps://guest:guest@127.0.0.1:{tls_port}/" in result.stdout
        yield TlsCluster(data_dir, haproxy_port, tls_port, base)
    finally:
        subprocess.run([*CLUSTER_CLI, "down", "--data-dir", str(data_dir)], capture_output=True, timeout=120)


def _pika(cluster: TlsCluster, credentials: pika.credentials.VALID_TYPES | None = None,
          client: str | None = "client") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", cluster.tls_port, credentials=credentials or pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(cluster.context(client), "127.0.0.1"), connection_attempts=3, retry_delay=1,
        socket_timeout=10, blocked_connection_timeout=None))


def _quorum_round_trip(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, count: int) -> None:
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    for i in range(count):
        channel.basic_publish("", queue, f"q{i}".encode(), pika.BasicProperties(delivery_mode=2))
    got = []
    for _method, _props, body in channel.consume(queue, auto_ack=True, inactivity_timeout=30):
        assert body is not None, f"only {len(got)} of {count} arrived"
        got.append(body)
        if len(got) == count:
            break
    channel.cancel()
    assert got == [f"q{i}".encode() for i in range(count)]


def test_pika_through_haproxy_amqps_with_confirms_to_a_quorum_queue(cluster: TlsCluster) -> None:
    connection = _pika(cluster)
    try:
        _quorum_round_trip(connection.channel(), "tls-cluster-pika", COUNT)
    finally:
        connection.close()


def test_external_through_haproxy_reaches_the_node_with_the_client_certificate(cluster: TlsCluster) -> None:
    connection = _pika(cluster, pika.credentials.ExternalCredentials(), client="guest")
    try:
        _quorum_round_trip(connection.channel(), "tls-cluster-external", 10)
    finally:
        connection.close()


def test_aio_pika_through_haproxy_amqps(cluster: TlsCluster) -> None:
    async def run() -> None:
        connection = await aio_pika.connect(f"amqps://guest:guest@127.0.0.1:{cluster.tls_port}/",
                                            ssl_context=cluster.context(), timeout=30)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue("tls-cluster-aio", durable=True,
                                                arguments={"x-queue-type": "quorum"})
            for i in range(COUNT):
                await channel.default_exchange.publish(
                    aio_pika.Message(f"a{i}".encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    "tls-cluster-aio")
            got = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        got.append(message.body)
                    if len(got) == COUNT:
                        break
            assert got == [f"a{i}".encode() for i in range(COUNT)]

    asyncio.run(asyncio.wait_for(run(), 120))


def test_py_amqp_through_haproxy_amqps(cluster: TlsCluster) -> None:
    sslopts = {"ca_certs": str(cluster.tls_dir / "ca.pem"), "cert_reqs": ssl.CERT_REQUIRED,
               "server_hostname": "127.0.0.1"}
    connection = amqp.Connection(f"127.0.0.1:{cluster.tls_port}", userid="guest", password="guest", ssl=sslopts,
                                 confirm_publish=True, connect_timeout=10)
    connection.connect()
    try:
        channel = connection.channel()
        channel.queue_declare("tls-cluster-py-amqp", durable=True, auto_delete=False,
                              arguments={"x-queue-type": "quorum"})
        for i in range(COUNT):
            channel.basic_publish(amqp.Message(f"p{i}".encode(), delivery_mode=2), "", "tls-cluster-py-amqp")
        got = []
        while len(got) < COUNT:
            message = channel.basic_get("tls-cluster-py-amqp", no_ack=True)
            if message is not None:
                got.append(message.body)
        assert got == [f"p{i}".encode() for i in range(COUNT)]
    finally:
        connection.close()


def test_a_plain_client_on_the_amqps_frontend_gets_nowhere_and_others_carry_on(cluster: TlsCluster) -> None:
    survivor = _pika(cluster)
    try:
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", cluster.tls_port, credentials=pika.PlainCredentials("guest", "guest"),
                connection_attempts=1, socket_timeout=10))
        _quorum_round_trip(survivor.channel(), "tls-cluster-survivor", 10)
        plain = pika.BlockingConnection(pika.ConnectionParameters(  # and the plain frontend serves as before
            "127.0.0.1", cluster.haproxy_port, credentials=pika.PlainCredentials("guest", "guest"),
            connection_attempts=3, retry_delay=1, socket_timeout=10))
        _quorum_round_trip(plain.channel(), "tls-cluster-plain", 10)
        plain.close()
    finally:
        survivor.close()
    logs = "".join(p.read_text(errors="replace") for p in cluster.data_dir.glob("rmq*.log"))
    assert "amqps connection from 127.0.0.1 refused: TLS handshake failed" in logs


def _non_loopback_address() -> str | None:
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return next((a for a in out if "." in a and not a.startswith("127.")), None)


def test_guest_over_amqps_from_a_non_loopback_address_is_refused(cluster: TlsCluster) -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    params = pika.ConnectionParameters(  # (the node certificates name localhost, not this address)
        address, cluster.tls_port, credentials=pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(cluster.context(), "localhost"), connection_attempts=1, socket_timeout=10)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(params)
    assert "(403) 'ACCESS_REFUSED" in str(info.value)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):  # EXTERNAL as guest neither
        pika.BlockingConnection(pika.ConnectionParameters(
            address, cluster.tls_port, credentials=pika.credentials.ExternalCredentials(),
            ssl_options=pika.SSLOptions(cluster.context("guest"), "localhost"), connection_attempts=1,
            socket_timeout=10))


@pytest.mark.skipif(shutil.which("rabbitmqadmin") is None, reason="rabbitmqadmin is not installed")
def test_rabbitmqadmin_over_https_on_one_node_sees_what_another_declared(cluster: TlsCluster) -> None:
    first, *_, last = cluster.management_tls_ports()

    def admin(port: int, *args: str) -> str:
        done = subprocess.run(["rabbitmqadmin", "-H", "127.0.0.1", "-P", str(port), "-u", "guest", "-p", "guest",
                               "--ssl", "--ssl-ca-cert-file", str(cluster.tls_dir / "ca.pem"), "-f", "raw_json",
                               *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"rabbitmqadmin --ssl {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    admin(first, "declare", "queue", "name=tls-cluster-admin", "durable=true", 'arguments={"x-queue-type": "quorum"}')
    deadline = time.monotonic() + 30
    while "tls-cluster-admin" not in [q["name"] for q in json.loads(admin(last, "list", "queues"))]:
        assert time.monotonic() < deadline, "the queue never showed on the last node"
        time.sleep(0.2)
    admin(last, "delete", "queue", "name=tls-cluster-admin")
