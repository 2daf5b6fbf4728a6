"""Management and Prometheus over HTTPS (`management_ssl_*`, `prometheus_ssl_port`, as RabbitMQ's management.ssl.*
and prometheus.ssl.*) on a real `raftmq node`, with certificates from deploy/certs.py.

The node asks for and requires a client certificate (verify_peer, fail_if_no_peer_cert). Shown: Debian's real
`rabbitmqadmin --ssl` with the CA and a client certificate declares, publishes to, gets from, lists and deletes a
queue; without a client certificate, with one from another CA, or without trusting the node's CA, it gets no
answer; plain HTTP on the HTTPS port is closed unanswered while the plain HTTP port keeps serving (and its overview lists the
https listeners); the Prometheus
HTTPS listener serves /metrics (parsed with prometheus_client) and nothing else. The cluster's HTTPS management
(`raftmq cluster up --tls`) is tested in tests/deploy/test_tls_cluster.py.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy.certs import TestPki, make_test_pki
from tests.integration.nodeproc import TEST_CONFIG_TOML, NodeProcess, external_target

RABBITMQADMIN = shutil.which("rabbitmqadmin")
pytestmark = pytest.mark.skipif(external_target() is not None, reason="needs its own node process")
HTTPS_LINE = re.compile(rb"management API \(HTTPS\) on port (\d+)")
PROMETHEUS_LINE = re.compile(rb"Prometheus metrics \(HTTPS\) on port (\d+)")
HTTP_LINE = re.compile(rb"management API on port (\d+)")
WAIT_S = 30.0


@dataclass
class Setup:
    pki: TestPki
    other_pki: TestPki
    node: NodeProcess
    https_port: int
    prometheus_port: int
    http_port: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])



@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("mgmt-https")
    pki = make_test_pki(workdir / "pki", {"node": "127.0.0.1"}, ("guest",))
    other = make_test_pki(workdir / "other-pki", {}, ("guest",), ca_name="another CA")
    paths = pki.nodes["node"]
    config = (f"management_ssl_port = {_free_port()}\nprometheus_ssl_port = {_free_port()}\n"
              f"management_ssl_certfile = \"{paths.cert}\"\nmanagement_ssl_keyfile = \"{paths.key}\"\n"
              f"management_ssl_cacertfile = \"{pki.ca.cert}\"\nmanagement_ssl_verify = \"verify_peer\"\n"
              f"management_ssl_fail_if_no_peer_cert = true\nmanagement_port = {_free_port()}\n{TEST_CONFIG_TOML}")
    node = NodeProcess(workdir / "node", config_toml=config).start()
    try:
        yield Setup(pki, other, node, node.logged_port(HTTPS_LINE), node.logged_port(PROMETHEUS_LINE),
                    node.logged_port(HTTP_LINE))
    finally:
        code = node.stop()
        assert code == 0, node.log_tail()


def _admin(setup: Setup, *args: str, client: TestPki | None = None, ca: bool = True) -> subprocess.CompletedProcess[str]:
    assert RABBITMQADMIN is not None
    tls = ["--ssl"]
    if ca:
        tls += ["--ssl-ca-cert-file", str(setup.pki.ca.cert)]
    if client is not None:
        tls += ["--ssl-cert-file", str(client.clients["guest"].cert), "--ssl-key-file", str(client.clients["guest"].key)]
    return subprocess.run([RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(setup.https_port), "-u", "guest", "-p", "guest",
                           *tls, "-f", "raw_json", *args], capture_output=True, text=True, timeout=60)


def _admin_ok(setup: Setup, *args: str) -> str:
    done = _admin(setup, *args, client=setup.pki)
    assert done.returncode == 0, f"rabbitmqadmin --ssl {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed")
def test_rabbitmqadmin_over_https_with_a_client_certificate(setup: Setup) -> None:
    queue = "https-q"
    assert _admin_ok(setup, "declare", "queue", f"name={queue}", "durable=true") == "queue declared\n"
    _admin_ok(setup, "publish", f"routing_key={queue}", "payload=over-tls")
    got = json.loads(_admin_ok(setup, "get", f"queue={queue}", "ackmode=ack_requeue_false"))
    assert [(m["payload"], m["routing_key"]) for m in got] == [("over-tls", queue)]
    assert queue in [q["name"] for q in json.loads(_admin_ok(setup, "list", "queues"))]
    assert _admin_ok(setup, "delete", "queue", f"name={queue}") == "queue deleted\n"


@pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed")
def test_rabbitmqadmin_is_refused_without_the_right_certificates(setup: Setup) -> None:
    for what, done in (("no client certificate", _admin(setup, "list", "queues")),
                       ("a client certificate from another CA", _admin(setup, "list", "queues", client=setup.other_pki)),
                       ("the node's CA not trusted", _admin(setup, "list", "queues", client=setup.pki, ca=False))):
        assert done.returncode != 0 and "[" not in done.stdout, f"{what}: {done.stdout}{done.stderr}"


def test_plain_http_on_the_https_port_is_closed_while_the_http_port_serves(setup: Setup) -> None:
    with socket.create_connection(("127.0.0.1", setup.https_port), timeout=WAIT_S) as sock:
        sock.sendall(b"GET /api/overview HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    assert b"HTTP/1.1" not in answer and b"overview" not in answer
    plain = http.client.HTTPConnection("127.0.0.1", setup.http_port, timeout=WAIT_S)
    plain.request("GET", "/api/aliveness-test/%2F", headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    response = plain.getresponse()
    response.read()
    assert response.status == 200
    plain.request("GET", "/api/overview", headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    overview = json.loads(plain.getresponse().read())
    listeners = {(row["protocol"], row["port"]) for row in overview["listeners"]}
    assert {("http", setup.http_port), ("https", setup.https_port),  # as RabbitMQ's overview lists them
            ("https/prometheus", setup.prometheus_port)} <= listeners, listeners
    plain.request("GET", "/api/nodes", headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    contexts = {(c["port"], c.get("ssl", False)) for c in json.loads(plain.getresponse().read())[0]["contexts"]}
    assert {(str(setup.http_port), False), (str(setup.https_port), True)} <= contexts, contexts


def test_prometheus_over_https_serves_metrics_only(setup: Setup) -> None:
    context = ssl.create_default_context(cafile=str(setup.pki.ca.cert))
    client = setup.pki.clients["guest"]
    context.load_cert_chain(str(client.cert), str(client.key))
    conn = http.client.HTTPSConnection("127.0.0.1", setup.prometheus_port, context=context, timeout=WAIT_S)
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    assert response.status == 200
    names = {family.name for family in text_string_to_metric_families(response.read().decode())}
    assert "rabbitmq_queues" in names
    conn.request("GET", "/api/overview", headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    response = conn.getresponse()
    response.read()
    assert response.status == 404
