"""deploy/: the compose file and HAProxy config are generated from the one topology and stay valid."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy import topology as topo


def test_checked_in_files_match_the_topology() -> None:
    assert topo.main(["--check"]) == 0, "run: python -m deploy.topology --write"


def test_compose_file_describes_every_node_haproxy_and_spark() -> None:
    layout = topo.load()
    compose = yaml.safe_load(topo.COMPOSE_FILE.read_text())
    services = compose["services"]
    node_names = [n.name for n in layout.nodes]
    for name in node_names:
        svc = services[name]
        assert svc["environment"]["RAFTMQ_NODE_NAME"] == name
        assert svc["environment"]["RAFTMQ_PORT"] == str(layout.amqp_port)
        assert f"{name}-data:/var/lib/raftmq" in svc["volumes"]
        assert f"{name}-data" in compose["volumes"]
        assert "deploy.healthcheck" in " ".join(svc["healthcheck"]["test"])
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (topo.HERE.parent / svc["build"]["context"].replace("..", ".")).exists()
    haproxy = services["haproxy"]
    # published on the host's loopback unless the topology says otherwise (guest/guest must not be open to all)
    assert haproxy["ports"][0] == f"{layout.haproxy_bind_address}:{layout.haproxy_port}:{layout.haproxy_port}"
    assert layout.haproxy_bind_address == "127.0.0.1"
    assert set(haproxy["depends_on"]) == set(node_names)
    assert all(dep["condition"] == "service_healthy" for dep in haproxy["depends_on"].values())
    assert "./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in haproxy["volumes"]
    assert "spark" in services and "toxiproxy" in services
    # the secret is generated per deployment (`python -m deploy.topology --new-secret`), never shipped
    assert topo.HERE / compose["secrets"]["cluster_secret"]["file"] == topo.SECRET_FILE
    assert "/deploy/cluster_secret" in (topo.HERE.parent / ".gitignore").read_text().splitlines()
    for name in node_names:  # each node has a PROXY protocol listener for HAProxy
        port = layout.amqp_port + topo.PROXY_PORT_OFFSET
        assert services[name]["environment"]["RAFTMQ_PROXY_PROTOCOL_PORT"] == str(port)
        assert str(port) in services[name]["expose"]


def test_haproxy_config_names_every_node_with_amqp_health_checks() -> None:
    layout = topo.load()
    text = topo.HAPROXY_FILE.read_text()
    for node in layout.nodes:  # the nodes' PROXY protocol listeners, health checks with the header too
        port = layout.amqp_port + topo.PROXY_PORT_OFFSET
        assert f"server {node.name} {node.name}:{port} check send-proxy-v2 check-send-proxy" in text
    assert f"tcp-check send-binary {topo.AMQP_PROTOCOL_HEADER_HEX}" in text
    assert "mode tcp" in text


@pytest.mark.skipif(shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
                    reason="HAProxy is not installed (./dev test installs it)")
def test_real_haproxy_accepts_the_generated_configs(tmp_path: Path) -> None:
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    layout = topo.load()
    local = topo.haproxy_cfg(layout, [("rmq1", "127.0.0.1", 5673), ("rmq2", "127.0.0.1", 5674)], 5672)
    proxied = topo.haproxy_cfg(layout, [("rmq1", "127.0.0.1", 16673)], 5672, bind_address="127.0.0.1",
                               proxy_protocol=True)  # as `raftmq cluster up` renders it
    for name, text in (("compose.cfg", topo.HAPROXY_FILE.read_text()), ("local.cfg", local),
                       ("proxied.cfg", proxied)):
        cfg = tmp_path / name
        # The compose config names hosts that only resolve inside the compose network.
        cfg.write_text(text.replace("rmq1:", "127.0.0.1:").replace("rmq2:", "127.0.0.1:")
                       .replace("rmq3:", "127.0.0.1:"))
        result = subprocess.run([binary, "-c", "-f", str(cfg)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
