"""The plan `raftmq cluster up` starts from: each node's name, address and ports, its config file, the cluster secret.

`plan_nodes` names nodes rmq1..rmqN on base_port + i (or on 127.0.1.i with one port, like separate hosts); each
node's Raft, metadata and management ports derive from its AMQP port (deploy.topology.derived_ports) or, where those
would pass 65535, lie below it and are written into its config explicitly (`plan_ports`); the PROXY-protocol,
Prometheus and (--tls) amqps and HTTPS management ports sit at fixed offsets. `write_node_configs` writes one
private config per node (<data-dir>/<name>.toml, mode 0600): its ports and, in cluster mode, `cluster_nodes` naming
every member and the `cluster_secret` (generated once into <data-dir>/cluster_secret and reused by every later
`up`); with --tls its amqps and HTTPS settings, from a local CA and certificates generated once into
<data-dir>/tls (`ensure_test_pki`, deploy/certs.py). `node_command` is a node's command line (naming its config
file), so a restart, by deploy/rolling.py or chaos/, is the same cluster member. No process is started here.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from deploy import topology as topo

SECRET_FILE_NAME = "cluster_secret"
SECRET_BYTES = 32
TLS_DIR_NAME = "tls"
TLS_PORT_OFFSET = 12_000  # a node's amqps listener (set explicitly: a node does not derive it)
TLS_PROXY_PORT_OFFSET = 13_000  # its amqps listener with the PROXY protocol, HAProxy's target
MANAGEMENT_TLS_PORT_OFFSET = 14_000  # its management API over HTTPS (management_ssl_port)
PROMETHEUS_PORT_OFFSET = 10_020  # node i on 5672+i serves /metrics on 15692+i, as RabbitMQ's make start-cluster
TLS_CLIENTS = ("guest", "client")  # client certificates written for a --tls cluster (CN = the name)
NODES_MAX = 1000  # node ports are base+i and the other ports +-10000/20000/21000 away: they never meet below this


def _node_address(index: int, base_port: int, distinct_addresses: bool, node_port: int) -> tuple[str, int]:
    if distinct_addresses:
        return f"127.0.1.{index}", node_port
    return "127.0.0.1", base_port + index


def node_config_path(name: str, data_dir: str) -> Path:
    """Where `up` writes a node's cluster settings: next to its data directory, <cluster data dir>/<name>.toml."""
    return Path(data_dir).parent / f"{name}.toml"


def node_command(name: str, host: str, port: int, data_dir: str, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The command line of one node; a restart (here or by chaos/) runs the same command, so it is the same node
    (in cluster mode it names the node's config file, which holds the cluster settings and secret)."""
    config = node_config_path(name, data_dir)
    config_args = ["--config", str(config)] if config.exists() else []
    return [sys.executable, "-m", "node.cli", "node", "--node-name", name, "--port", str(port),
            "--listen-address", host, "--data-dir", data_dir, *config_args, *extra_args]


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (mode 0600 from creation, replaced atomically)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def cluster_secret(data_dir: Path) -> str:
    """The cluster's secret: read from <data-dir>/cluster_secret, or generated there (mode 0600) the first time."""
    path = data_dir / SECRET_FILE_NAME
    if path.exists():
        secret = path.read_text().strip()
        from node.runtime.secret_strength import secret_weakness

        weakness = secret_weakness(secret)
        if weakness is not None:
            raise SystemExit(f"raftmq cluster: {path} holds a secret the nodes refuse: {weakness}; remove the file "
                             "to have a new one generated (on a cluster with data, every node must get the same)")
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
        return secret
    secret = secrets.token_hex(SECRET_BYTES)
    write_private(path, secret + "\n")
    return secret


def cluster_mode_supported() -> bool:
    """True when `raftmq node` knows the cluster settings (node/runtime/config.py)."""
    from node.runtime.config import SETTINGS

    return {"cluster_nodes", "cluster_secret"} <= {s.name for s in SETTINGS}


@dataclass(frozen=True, slots=True)
class NodePlan:
    """One node `up` starts: its name, address and every port it serves."""

    name: str
    host: str
    port: int  # AMQP
    management_port: int
    raft_port: int
    metadata_port: int
    proxy_port: int = 0  # the node's PROXY protocol listener for HAProxy (proxy_protocol_port); 0 = none
    tls_port: int = 0  # --tls: the node's amqps listener (ssl_port); 0 = none
    tls_proxy_port: int = 0  # --tls: its amqps listener with the PROXY protocol (ssl_proxy_protocol_port)
    prometheus_port: int = 0  # its /metrics listener (prometheus_port); 0 = not written (the node's own setting)
    management_tls_port: int = 0  # --tls: its management API over HTTPS (management_ssl_port); 0 = none

    @property
    def derived(self) -> bool:
        """True when the node would derive the same ports itself (so cluster_nodes can name the AMQP port only)."""
        ports = topo.derived_ports(self.port)
        return (self.raft_port, self.metadata_port) == (ports["raft"], ports["metadata"])

    def member_spec(self) -> str:
        """This node as a `cluster_nodes` entry: name=host:amqp_port[:raft_port:metadata_port]."""
        extra = "" if self.derived else f":{self.raft_port}:{self.metadata_port}"
        return f"{self.name}={self.host}:{self.port}{extra}"


def plan_ports(amqp_port: int) -> dict[str, int]:
    """A node's management, Raft and metadata ports: AMQP + offset as the node derives them, or AMQP - offset for
    the ones that would pass 65535 (high base ports, e.g. picked from the ephemeral range by tests); those are then
    written into the node's config explicitly."""
    return {name: amqp_port + offset if amqp_port + offset <= 65535 else amqp_port - offset
            for name, offset in topo.PORT_OFFSETS.items()}


def proxy_port(amqp_port: int) -> int:
    """A node's PROXY protocol listener (HAProxy's target): AMQP + PROXY_PORT_OFFSET, or minus it past 65535."""
    port = amqp_port + topo.PROXY_PORT_OFFSET
    return port if port <= 65535 else amqp_port - topo.PROXY_PORT_OFFSET


def offset_port(amqp_port: int, offset: int) -> int:
    """AMQP + offset, or minus it past 65535 (as `proxy_port`)."""
    port = amqp_port + offset
    return port if port <= 65535 else amqp_port - offset


def tls_settings(node: NodePlan, tls_dir: Path) -> list[str]:
    """A --tls node's amqps settings (TOML lines): its certificate from `tls_dir`, client certificates asked for
    and checked against the cluster's CA, EXTERNAL by common name; and its management API over HTTPS with the same
    certificate."""
    return [f"ssl_port = {node.tls_port}", f"ssl_proxy_protocol_port = {node.tls_proxy_port}",
            f"ssl_certfile = {json.dumps(str(tls_dir / f'{node.name}.pem'))}",
            f"ssl_keyfile = {json.dumps(str(tls_dir / f'{node.name}.key'))}",
            f"ssl_cacertfile = {json.dumps(str(tls_dir / 'ca.pem'))}",
            'ssl_verify = "verify_peer"', "ssl_cert_login = true", 'ssl_cert_login_from = "common_name"',
            f"management_ssl_port = {node.management_tls_port}",
            f"management_ssl_certfile = {json.dumps(str(tls_dir / f'{node.name}.pem'))}",
            f"management_ssl_keyfile = {json.dumps(str(tls_dir / f'{node.name}.key'))}"]


def ensure_test_pki(data_dir: Path, plan: list[NodePlan]) -> Path:
    """<data-dir>/tls with a CA and every node's and TLS_CLIENTS' certificates: generated the first time (or when a
    node's is missing), reused otherwise."""
    tls_dir = data_dir / TLS_DIR_NAME
    wanted = ["ca", *(n.name for n in plan), *TLS_CLIENTS]
    if not all((tls_dir / f"{name}.pem").exists() and (tls_dir / f"{name}.key").exists() for name in wanted):
        from deploy.certs import make_test_pki

        make_test_pki(tls_dir, {n.name: n.host for n in plan}, TLS_CLIENTS, ca_name=f"raftmq test CA {data_dir.name}")
    return tls_dir


def node_config_text(node: NodePlan, members: list[NodePlan], secret: str | None,
                     tls_dir: Path | None = None) -> str:
    """A node's TOML config: its management port, and in cluster mode every member and the secret (JSON strings
    are valid TOML strings); with `tls_dir` its amqps settings."""
    lines = ["# Written by `raftmq cluster up` (mode 0600: it may hold the cluster secret).",
             f"management_port = {node.management_port}"]
    if node.proxy_port:
        lines.append(f"proxy_protocol_port = {node.proxy_port}")
    if node.prometheus_port:
        lines.append(f"prometheus_port = {node.prometheus_port}")
    if tls_dir is not None and node.tls_port:
        lines += tls_settings(node, tls_dir)
    if secret is not None:
        specs = ", ".join(json.dumps(m.member_spec()) for m in members)
        lines += [f"cluster_nodes = [{specs}]", f"cluster_secret = {json.dumps(secret)}"]
    return "\n".join(lines) + "\n"


def write_node_configs(data_dir: Path, plan: list[NodePlan], cluster: bool, tls_dir: Path | None = None) -> None:
    """One private config per node: its ports, and in cluster mode every member and the cluster secret; with
    `tls_dir` (--tls) its amqps settings."""
    secret = cluster_secret(data_dir) if cluster else None
    for node in plan:
        write_private(node_config_path(node.name, str(data_dir / node.name)),
                       node_config_text(node, plan, secret, tls_dir))


def plan_nodes(count: int, base_port: int, distinct_addresses: bool, node_port: int,
               tls: bool = False) -> list[NodePlan]:
    """Every node: rmq1..rmqN on base_port+i, or on 127.0.1.i with one port, with its other ports (and with `tls`
    its amqps ports)."""
    if not 1 <= count <= NODES_MAX:
        raise SystemExit(f"raftmq cluster: --nodes must be 1..{NODES_MAX}")
    plan = []
    for i in range(1, count + 1):
        host, port = _node_address(i, base_port, distinct_addresses, node_port)
        if not 0 < port <= 65535:
            raise SystemExit(f"raftmq cluster: node port {port} is out of range; use a lower --base-port")
        ports = plan_ports(port)
        tls_ports = (offset_port(port, TLS_PORT_OFFSET), offset_port(port, TLS_PROXY_PORT_OFFSET)) if tls else (0, 0)
        plan.append(NodePlan(f"rmq{i}", host, port, ports["management"], ports["raft"], ports["metadata"],
                             proxy_port(port), *tls_ports, prometheus_port=offset_port(port, PROMETHEUS_PORT_OFFSET),
                             management_tls_port=offset_port(port, MANAGEMENT_TLS_PORT_OFFSET) if tls else 0))
    return plan
