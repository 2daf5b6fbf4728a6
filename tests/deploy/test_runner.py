"""deploy/runner.py and deploy/node_plan.py without starting nodes: the port plan, the secret, the per-node cluster config and `status`."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest
import trio

from deploy import node_plan, runner
from deploy import topology as topo
from node.runtime import config as node_config
from tests.broker.harness import Client
from tests.management.helpers import served_broker


def _all_ports(plan: list[node_plan.NodePlan]) -> list[int]:
    return [p for n in plan for p in (n.port, n.management_port, n.raft_port, n.metadata_port)]


@pytest.mark.parametrize("base_port", [5672, 30000, 44000, 60000])
def test_node_ports_never_collide_across_nodes(base_port: int) -> None:
    plan = node_plan.plan_nodes(7, base_port, False, 5672)
    assert [(n.name, n.port) for n in plan] == [(f"rmq{i}", base_port + i) for i in range(1, 8)]
    ports = _all_ports(plan)
    assert len(ports) == len(set(ports)) and all(0 < p <= 65535 for p in ports)
    if base_port == 5672:  # low ports: exactly what the node derives by itself
        assert all(n.derived for n in plan) and plan[0].member_spec() == "rmq1=127.0.0.1:5673"
        assert (plan[0].management_port, plan[0].raft_port, plan[0].metadata_port) == (15673, 25673, 26673)


def test_distinct_addresses_share_one_port_set() -> None:
    plan = node_plan.plan_nodes(3, 5672, True, 5672)
    assert [(n.host, n.port, n.management_port) for n in plan] == [(f"127.0.1.{i}", 5672, 15672) for i in (1, 2, 3)]
    with pytest.raises(SystemExit):
        node_plan.plan_nodes(0, 5672, False, 5672)
    with pytest.raises(SystemExit):
        node_plan.plan_nodes(3, 65534, False, 5672)


def test_derived_port_offsets_match_the_node_defaults() -> None:
    offsets = {name: getattr(node_config, f"{name.upper()}_PORT_OFFSET", None) for name in topo.PORT_OFFSETS}
    if None in offsets.values():
        pytest.skip("node/runtime/config.py does not define the port offsets yet")
    assert offsets == topo.PORT_OFFSETS


def test_secret_is_generated_private_and_reused(tmp_path: Path) -> None:
    secret = node_plan.cluster_secret(tmp_path)
    path = tmp_path / node_plan.SECRET_FILE_NAME
    assert len(secret) >= 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert node_plan.cluster_secret(tmp_path) == secret
    os.chmod(path, 0o644)
    assert node_plan.cluster_secret(tmp_path) == secret and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("short\n")
    with pytest.raises(SystemExit):
        node_plan.cluster_secret(tmp_path)


def _explicit_ports_supported() -> bool:
    """node/runtime/config.py reads name=host:amqp:raft:metadata entries (needed for high base ports)."""
    try:
        probe = node_config.load(["--cluster-nodes", "a=127.0.0.1:1:2:3", "--node-name", "a",
                                  "--cluster-secret", "s" * 32], environ={})[0]
        return node_config.cluster_layout(probe).members[0].raft_port == 2
    except (AttributeError, node_config.ConfigError):
        return False


@pytest.mark.parametrize("base_port", [6000, 50000])
def test_cluster_config_names_every_node_and_reaches_the_node_command(tmp_path: Path, base_port: int) -> None:
    plan = node_plan.plan_nodes(3, base_port, False, 5672)
    node_plan.write_node_configs(tmp_path, plan, cluster=True)
    cfg = node_plan.node_config_path("rmq2", str(tmp_path / "rmq2"))
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    secret = (tmp_path / node_plan.SECRET_FILE_NAME).read_text().strip()
    values = node_config.values_from_toml(cfg)  # the node's own reader accepts the file
    assert values["cluster_nodes"] == tuple(n.member_spec() for n in plan)
    assert values["cluster_secret"] == secret and values["management_port"] == plan[1].management_port
    if _explicit_ports_supported():  # and the node's cluster validation finds the planned ports
        loaded, _ = node_config.load(["--config", str(cfg), "--node-name", "rmq2", "--port", str(plan[1].port)],
                                     environ={})
        layout = node_config.cluster_layout(loaded)
        assert [(m.name, m.amqp_port, m.raft_port, m.metadata_port) for m in layout.members] == [
            (n.name, n.port, n.raft_port, n.metadata_port) for n in plan]
        assert layout.members[1].management_port == plan[1].management_port
    command = node_plan.node_command("rmq2", "127.0.0.1", plan[1].port, str(tmp_path / "rmq2"))
    assert command[command.index("--config") + 1] == str(cfg)
    assert secret not in " ".join(command)  # the secret never shows in ps
    node_plan.write_node_configs(tmp_path, plan, cluster=False)
    standalone = node_config.values_from_toml(cfg)
    assert standalone == {"management_port": plan[1].management_port, "proxy_protocol_port": plan[1].proxy_port,
                          "prometheus_port": plan[1].prometheus_port}
    assert len({node.prometheus_port for node in plan}) == len(plan)  # one /metrics port per node on one host


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_status_lists_queues_from_the_first_node_that_answers(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "answers_amqp", lambda host, port, timeout_s=1.0: True)
    async with served_broker() as s:
        client = Client(s.broker)
        client.open()
        client.declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
        client.publish("", "qq", b"x")
        dead = runner.NodeProcess("rmq1", "127.0.0.1", 5673, os.getpid(), str(tmp_path / "rmq1"), "log1",
                                  _closed_port())
        live = runner.NodeProcess("rmq2", "127.0.0.1", 5674, os.getpid(), str(tmp_path / "rmq2"), "log2", s.port)
        state = runner.ClusterState([dead, live], None, None, None, None)
        (tmp_path / runner.STATE_FILE_NAME).write_text(json.dumps(
            {"nodes": [vars_of(dead), vars_of(live)], "haproxy_pid": None, "haproxy_port": None,
             "haproxy_config": None, "haproxy_log": None}))
        assert runner.load_state(tmp_path) == state
        report = await trio.to_thread.run_sync(runner.status_report, tmp_path)
    assert [n["management_port"] for n in report["nodes"]] == [dead.management_port, s.port]  # type: ignore[index]
    assert report["queues"] == [{"name": "qq", "vhost": "/", "type": "quorum", "leader": "rabbit@test",
                                 "members": ["rabbit@test"], "messages_ready": 1, "messages_unacknowledged": 0}]


def vars_of(node: runner.NodeProcess) -> dict[str, object]:
    return {f: getattr(node, f) for f in node.__dataclass_fields__}


def test_status_of_an_old_cluster_json_derives_the_management_port(tmp_path: Path) -> None:
    old = {"nodes": [{"name": "rmq1", "host": "127.0.0.1", "port": 5673, "pid": 0, "data_dir": "d", "log": "l"}],
           "haproxy_pid": None, "haproxy_port": None, "haproxy_config": None, "haproxy_log": None}
    (tmp_path / runner.STATE_FILE_NAME).write_text(json.dumps(old))
    report = runner.status_report(tmp_path)
    assert report["nodes"][0]["management_port"] == 15673  # type: ignore[index]
    assert report["nodes"][0]["state"] == "stopped" and report["queues"] == []  # type: ignore[index]


def test_haproxy_maxconn_fits_the_open_files_limit() -> None:
    assert runner.haproxy_maxconn(20000) == 9950  # two descriptors per connection, some reserved
    assert runner.haproxy_maxconn(-1) == topo.HAPROXY_MAXCONN  # unlimited
    assert runner.haproxy_maxconn(1024) == 462 and runner.haproxy_maxconn(10) == 64
    assert "maxconn 9950" in topo.haproxy_cfg(topo.load(), [("rmq1", "127.0.0.1", 5673)], 5672, maxconn=9950)


@pytest.mark.parametrize("base_port", [5672, 30000, 60000])
def test_tls_ports_never_collide_and_reach_the_node_config(tmp_path: Path, base_port: int) -> None:
    plan = node_plan.plan_nodes(3, base_port, False, 5672, tls=True)
    ports = [p for n in plan for p in (n.port, n.management_port, n.raft_port, n.metadata_port, n.proxy_port,
                                       n.tls_port, n.tls_proxy_port)]
    assert len(ports) == len(set(ports)) and all(0 < p <= 65535 for p in ports)
    tls_dir = node_plan.ensure_test_pki(tmp_path, plan)
    assert {p.name for p in tls_dir.iterdir()} >= {"ca.pem", "ca.key", "rmq1.pem", "rmq3.key", "guest.pem"}
    ca_before = (tls_dir / "ca.pem").read_bytes()
    assert node_plan.ensure_test_pki(tmp_path, plan) == tls_dir and (tls_dir / "ca.pem").read_bytes() == ca_before
    node_plan.write_node_configs(tmp_path, plan, cluster=True, tls_dir=tls_dir)
    cfg = node_plan.node_config_path("rmq2", str(tmp_path / "rmq2"))
    loaded = dataclasses.replace(node_config.NodeConfig(), **node_config.values_from_toml(cfg))
    assert (loaded.ssl_port, loaded.ssl_proxy_protocol_port) == (plan[1].tls_port, plan[1].tls_proxy_port)
    assert loaded.ssl_certfile == str(tls_dir / "rmq2.pem") and loaded.ssl_cert_login
    from node.runtime.tls import server_context

    server_context(loaded)  # the generated files load
    assert node_plan.plan_nodes(3, base_port, False, 5672)[0].tls_port == 0  # without --tls: none
