"""Shovels over amqps on a real raftmq node with a TLS listener (`ssl_port`, verify_peer and a client certificate
required), certificates from deploy/certs.py: RabbitMQ's URI keys (`cacertfile`, `certfile`, `keyfile`, `verify`,
`server_name_indication`). One node is both ends: the source is its plain listener (`amqp://`, the node itself),
the destination its TLS listener. Shown: a verified link moves messages; `verify=verify_none` skips the server
check; an untrusted server (no `cacertfile`) or a wrong server name leaves the shovel retrying with the TLS error as
its reason, and moves nothing."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from deploy.certs import TestPki, make_test_pki
from tests.integration.nodeproc import TEST_CONFIG_TOML, NodeProcess, external_target
from tests.shovel.helpers import count, ctl_call, free_port, publish, wait_until

pytestmark = pytest.mark.skipif(external_target() is not None, reason="needs its own node process")
TLS_LINE = re.compile(rb"amqps listener on port (\d+)")


@dataclass
class TlsNode:
    node: NodeProcess
    mport: int
    tls_port: int
    pki: TestPki


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNode]:
    workdir = tmp_path_factory.mktemp("shovel-tls")
    pki = make_test_pki(workdir / "pki", {"node": "127.0.0.1"}, ("guest",))
    paths = pki.nodes["node"]
    config = (f"ssl_port = {free_port()}\nssl_certfile = \"{paths.cert}\"\nssl_keyfile = \"{paths.key}\"\n"
              f"ssl_cacertfile = \"{pki.ca.cert}\"\nssl_verify = \"verify_peer\"\nssl_fail_if_no_peer_cert = true\n"
              f"{TEST_CONFIG_TOML}")
    mport = free_port()
    node = NodeProcess(workdir / "node", config_toml=config, extra_args=("--management-port", str(mport))).start()
    try:
        tls_port = wait_until(lambda: _tls_port(node), 30, "the amqps listener")
        yield TlsNode(node, mport, tls_port, pki)
    finally:
        node.stop()


def _tls_port(node: NodeProcess) -> int | None:
    found = TLS_LINE.findall(node.log_path.read_bytes())
    return int(found[-1]) if found else None


def _amqps(setup: TlsNode, **keys: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in keys.items())
    return f"amqps://guest:guest@127.0.0.1:{setup.tls_port}/%2F?heartbeat=5&connection_timeout=3000&{query}"


def _client_cert(setup: TlsNode) -> dict[str, str]:
    client = setup.pki.clients["guest"]
    return {"certfile": str(client.cert), "keyfile": str(client.key)}


def _define(setup: TlsNode, name: str, dest_uri: str) -> None:
    value = {"src-uri": "amqp://", "src-queue": f"{name}-src", "dest-uri": dest_uri, "dest-queue": f"{name}-dst",
             "reconnect-delay": 1}
    code, out = ctl_call(setup.mport, "set_parameter", "shovel", name, json.dumps(value))
    assert code == 0, out


def _row(setup: TlsNode, name: str) -> dict[str, Any]:
    code, rows = ctl_call(setup.mport, "shovel_status")
    assert code == 0, rows
    return next(row for row in rows if row["name"] == name)


def _clear(setup: TlsNode, name: str) -> None:
    assert ctl_call(setup.mport, "clear_parameter", "shovel", name)[0] == 0


@pytest.mark.parametrize("keys", [
    pytest.param(lambda s: {"cacertfile": str(s.pki.ca.cert), "verify": "verify_peer",
                            "server_name_indication": "127.0.0.1", **_client_cert(s)}, id="verify_peer"),
    pytest.param(lambda s: {"verify": "verify_none", **_client_cert(s)}, id="verify_none"),
])
def test_a_shovel_over_amqps_moves_messages(tls_node: TlsNode, keys: Any) -> None:
    name = f"tls-{keys(tls_node).get('verify')}"
    publish(tls_node.node.port, f"{name}-src", 40)
    _define(tls_node, name, _amqps(tls_node, **keys(tls_node)))
    wait_until(lambda: count(tls_node.node.port, f"{name}-dst") == 40, 60, "40 messages moved over TLS")
    row = _row(tls_node, name)
    assert row["state"] == "running" and row["dest_uri"].startswith("amqps://guest@127.0.0.1:")
    _clear(tls_node, name)


@pytest.mark.parametrize(("keys", "reason"), [
    pytest.param(lambda s: {"verify": "verify_peer", **_client_cert(s)}, "CERTIFICATE_VERIFY_FAILED",
                 id="untrusted-server"),
    pytest.param(lambda s: {"cacertfile": str(s.pki.ca.cert), "server_name_indication": "other.example",
                            **_client_cert(s)}, "other.example", id="wrong-server-name"),
])
def test_a_server_that_fails_the_check_is_not_used(tls_node: TlsNode, keys: Any, reason: str) -> None:
    name = f"tls-bad-{reason[:5]}"
    publish(tls_node.node.port, f"{name}-src", 5)
    _define(tls_node, name, _amqps(tls_node, **keys(tls_node)))
    blocked = wait_until(lambda: _row(tls_node, name).get("blocked_reason") or None, 30, "the TLS failure shown")
    assert "TLS handshake" in blocked and reason in blocked, blocked
    time.sleep(1.5)  # (a retry after the reconnect delay fails the same way)
    assert _row(tls_node, name)["state"] == "starting"
    assert count(tls_node.node.port, f"{name}-dst") == -1  # the destination queue was never even declared
    _clear(tls_node, name)
