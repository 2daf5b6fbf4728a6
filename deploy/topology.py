"""The cluster topology (deploy/topology.toml) and the files generated from it.

`load()` reads the one description of the cluster's shape. `compose_yaml()` renders deploy/docker-compose.yml and
`haproxy_cfg()` renders an HAProxy configuration, both from that description, so the compose file, the HAProxy
config used on real hosts and the local runner (`raftmq cluster up`, which also reads the topology) cannot drift
apart. `python -m deploy.topology --write` regenerates the checked-in files; `--check` fails when they are stale
(a test runs the check).

Every node's other ports derive from its AMQP port as `raftmq node` derives them (node/runtime/config.py):
management HTTP +10000, queue Raft +20000, metadata Raft +21000 (`derived_ports`); the compose file exposes them
and passes `cluster_nodes` naming every node, and the secret from the compose secret file.

HAProxy health checks speak AMQP: they send the 0-9-1 protocol header and expect a Connection.Start frame
(type 1 on channel 0), so a node is in rotation only while it really answers AMQP.

Client addresses: HAProxy sends each node the PROXY protocol v2 header (`send-proxy-v2`, health checks too:
`check-send-proxy`) on the node's PROXY protocol listener (`proxy_protocol_port`, AMQP port + `PROXY_PORT_OFFSET`),
so loopback-only users, connection listings and logs see the client's address, not HAProxy's. HAProxy binds to
`bind_address`, 127.0.0.1 unless told otherwise (`raftmq cluster up --haproxy-bind`; in compose the container
binds every interface and the port is published on the topology's `haproxy_bind_address` of the host).

Compose reads the cluster secret from deploy/cluster_secret, which is not in the repository: `python -m
deploy.topology --new-secret` generates one (random, mode 0600) per deployment.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOPOLOGY_FILE = HERE / "topology.toml"
COMPOSE_FILE = HERE / "docker-compose.yml"
HAPROXY_FILE = HERE / "haproxy.cfg"
DOCKER_DNS = "127.0.0.11:53"  # the resolver Docker gives containers on a user-defined network
GENERATED_HEADER = "# Generated from deploy/topology.toml by `python -m deploy.topology --write`; do not edit.\n"
AMQP_PROTOCOL_HEADER_HEX = "414d515000000901"
CONNECTION_START_PREFIX_HEX = "010000"
PORT_OFFSETS = {"management": 10_000, "raft": 20_000, "metadata": 21_000}  # as node/runtime/config.py derives them
PROXY_PORT_OFFSET = 11_000  # the PROXY protocol listener HAProxy uses (set explicitly: a node does not derive it)
HAPROXY_BIND_DEFAULT = "127.0.0.1"
SECRET_FILE = HERE / "cluster_secret"
SECRET_BYTES = 32


def derived_ports(amqp_port: int) -> dict[str, int]:
    """The management, Raft and metadata ports of a node listening for AMQP on `amqp_port`."""
    return {name: amqp_port + offset for name, offset in PORT_OFFSETS.items()}


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str


@dataclass(frozen=True, slots=True)
class Topology:
    name: str
    image: str
    amqp_port: int
    haproxy_port: int
    haproxy_stats_port: int
    nodes: tuple[NodeSpec, ...]
    spark_image: str
    spark_enabled: bool
    toxiproxy_image: str
    toxiproxy_enabled: bool
    toxiproxy_api_port: int
    haproxy_bind_address: str = HAPROXY_BIND_DEFAULT


def load(path: Path = TOPOLOGY_FILE) -> Topology:
    raw = tomllib.loads(path.read_text())
    cluster = raw["cluster"]
    nodes = tuple(NodeSpec(name=str(n["name"])) for n in raw.get("nodes", []))
    if not nodes:
        raise ValueError(f"{path}: the topology names no nodes")
    if len({n.name for n in nodes}) != len(nodes):
        raise ValueError(f"{path}: node names must be unique")
    spark = raw.get("spark", {})
    toxiproxy = raw.get("toxiproxy", {})
    return Topology(
        name=str(cluster["name"]),
        image=str(cluster["image"]),
        amqp_port=int(cluster["amqp_port"]),
        haproxy_port=int(cluster["haproxy_port"]),
        haproxy_stats_port=int(cluster["haproxy_stats_port"]),
        nodes=nodes,
        spark_image=str(spark.get("image", "apache/spark:3.5.3")),
        spark_enabled=bool(spark.get("enabled", False)),
        toxiproxy_image=str(toxiproxy.get("image", "ghcr.io/shopify/toxiproxy:2.9.0")),
        toxiproxy_enabled=bool(toxiproxy.get("enabled", False)),
        toxiproxy_api_port=int(toxiproxy.get("api_port", 8474)),
        haproxy_bind_address=str(cluster.get("haproxy_bind_address", HAPROXY_BIND_DEFAULT)),
    )


HAPROXY_MAXCONN = 20000
# Health-check timing. A node busy with a burst of handshakes (1000 connections at once on a loaded 2-core machine)
# answered a check 2-4 s late, and two such checks in a row marked it DOWN and cut its sessions: so 3 failures in a
# row (`fall`), each allowed `timeout check`. A dead process refuses the check's connect at once: DOWN after the
# failing check and two more at `fastinter` (2-4 s); a hung one after about 3 x (5 s + 1 s). RabbitMQ deployments
# behind HAProxy mostly use a plain TCP connect check with `inter 5s rise 2 fall 3` (the kernel answers it even for a
# hung node); ours still speaks AMQP. `retries 3` + `option redispatch`: a client sent to a node that refuses the
# connect (dead, not yet marked DOWN) is sent to another node instead of failing.
CHECK_TIMEOUT = "5s"
CHECK_TIMING = "inter 2s fastinter 1s downinter 1s fall 3 rise 2"


@dataclass(frozen=True, slots=True)
class TlsFrontend:
    """HAProxy's amqps frontend (TCP passthrough): where it listens, the nodes' TLS listeners (name, host, port),
    and the CA file its health checks verify the nodes' certificates with."""

    bind_port: int
    servers: tuple[tuple[str, str, int], ...]
    ca_file: str


def haproxy_cfg(topology: Topology, servers: list[tuple[str, str, int]], bind_port: int,
                stats_port: int | None = None, maxconn: int | None = HAPROXY_MAXCONN,
                bind_address: str = HAPROXY_BIND_DEFAULT, proxy_protocol: bool = False,
                tls: TlsFrontend | None = None, resolver: str | None = None) -> str:
    """An HAProxy config in TCP mode over `servers` (name, host, port), with AMQP-speaking health checks, listening
    on `bind_address` ("*": every interface). With `proxy_protocol` the servers' ports are PROXY protocol listeners:
    HAProxy sends them a v2 header on every connection, health checks included. With `tls`, a second frontend
    passes amqps through to the nodes' TLS listeners untouched (TLS ends at the node, so client certificates reach
    it); its health checks do the TLS handshake (checking the node's certificate against `tls.ca_file`), then AMQP.

    HAProxy needs about two file descriptors per connection and refuses to start when it cannot raise its limit
    that far, so a local runner passes a `maxconn` that fits the machine's hard limit; with `maxconn` None HAProxy
    derives it from the limit it finds (compose: a container's limit is the Docker daemon's). With `resolver` (a DNS
    server, Docker's 127.0.0.11 in compose) HAProxy re-resolves the servers' names while it runs: a container that
    is restarted or reconnected to its network may come back on another address."""
    server_options = " send-proxy-v2 check-send-proxy" if proxy_protocol else ""
    if resolver is not None:
        server_options += " resolvers dns init-addr last,libc,none"
    lines = [
        GENERATED_HEADER.rstrip("\n") if servers and servers[0][1] != "127.0.0.1" else "# Generated by raftmq.",
        "global",
        *([f"    maxconn {maxconn}"] if maxconn is not None else []),
        "",
        "defaults",
        "    mode tcp",
        "    timeout connect 5s",
        "    timeout client 3h",
        "    timeout server 3h",
        f"    timeout check {CHECK_TIMEOUT}",
        "    option tcplog",
        "",
        *([] if resolver is None else
          ["resolvers dns", f"    nameserver dns1 {resolver}", "    hold valid 1s", "    hold other 1s", ""]),
        f"frontend {topology.name}_amqp",
        f"    bind {bind_address}:{bind_port}",
        f"    default_backend {topology.name}_nodes",
        "",
        f"backend {topology.name}_nodes",
        "    balance leastconn",
        "    retries 3",
        "    option redispatch",
        "    option tcp-check",
        f"    tcp-check send-binary {AMQP_PROTOCOL_HEADER_HEX}",
        f"    tcp-check expect binary {CONNECTION_START_PREFIX_HEX}",
        f"    default-server {CHECK_TIMING} on-marked-down shutdown-sessions",
    ]
    checks = lines[lines.index(f"backend {topology.name}_nodes") + 1:]  # (the amqps backend checks the same way)
    lines += [f"    server {name} {host}:{port} check{server_options}" for name, host, port in servers]
    if tls is not None:
        lines += ["", f"frontend {topology.name}_amqps", f"    bind {bind_address}:{tls.bind_port}",
                  f"    default_backend {topology.name}_nodes_tls", "", f"backend {topology.name}_nodes_tls", *checks]
        lines += [f"    server {name} {host}:{port} check check-ssl ca-file {tls.ca_file} verify required{server_options}"
                  for name, host, port in tls.servers]
    if stats_port is not None:
        lines += ["", "frontend stats", "    mode http", f"    bind {bind_address}:{stats_port}", "    stats enable",
                  "    stats uri /stats", "    stats refresh 5s"]
    return "\n".join(lines) + "\n"


def compose_haproxy_cfg(topology: Topology) -> str:
    servers = [(n.name, n.name, topology.amqp_port + PROXY_PORT_OFFSET) for n in topology.nodes]
    # Inside its container HAProxy listens on every interface; the host publishes the ports on haproxy_bind_address.
    return haproxy_cfg(topology, servers, topology.haproxy_port, topology.haproxy_stats_port, maxconn=None,
                       bind_address="*", proxy_protocol=True, resolver=DOCKER_DNS)


def _node_service(topology: Topology, node: NodeSpec) -> list[str]:
    members = ",".join(f"{n.name}={n.name}:{topology.amqp_port}" for n in topology.nodes)
    health = f"python -m deploy.healthcheck 127.0.0.1 {topology.amqp_port}"
    # cluster_secret is a setting, not a file: read the compose secret into the environment at start ($$ = $).
    # Compose mounts the secret file as it is on the host (0600, the deployer's), so the container starts as root
    # to read it and then runs the node as the image's unprivileged user raftmq (setpriv, util-linux).
    start = ('RAFTMQ_CLUSTER_SECRET="$$(cat /run/secrets/cluster_secret)" '
             'exec setpriv --reuid=raftmq --regid=raftmq --init-groups raftmq node')
    proxy_port = topology.amqp_port + PROXY_PORT_OFFSET
    ports = [topology.amqp_port, proxy_port, *derived_ports(topology.amqp_port).values()]
    return [
        f"  {node.name}:",
        f"    image: {topology.image}",
        "    build:",
        "      context: ..",
        "      dockerfile: deploy/Dockerfile",
        f"    hostname: {node.name}",
        "    user: root",
        "    environment:",
        f"      RAFTMQ_NODE_NAME: {node.name}",
        f"      RAFTMQ_PORT: \"{topology.amqp_port}\"",
        "      RAFTMQ_DATA_DIR: /var/lib/raftmq",
        f"      RAFTMQ_CLUSTER_NODES: \"{members}\"",
        f"      RAFTMQ_PROXY_PROTOCOL_PORT: \"{proxy_port}\"",
        f"    entrypoint: [\"sh\", \"-c\", {json.dumps(start)}]",
        "    secrets:",
        "      - cluster_secret",
        "    volumes:",
        f"      - {node.name}-data:/var/lib/raftmq",
        "    expose:",
        *[f"      - \"{port}\"" for port in ports],
        "    healthcheck:",
        f"      test: [\"CMD-SHELL\", \"{health}\"]",
        "      interval: 5s",
        "      timeout: 3s",
        "      retries: 12",
        "      start_period: 10s",
        "    restart: unless-stopped",
    ]


def compose_yaml(topology: Topology) -> str:
    # No top-level `name:` (Compose v1, Debian's docker-compose 1.29, refuses it): give the project with `-p`.
    lines = [GENERATED_HEADER.rstrip("\n"), "services:"]
    for node in topology.nodes:
        lines += _node_service(topology, node)
    lines += [
        "  haproxy:",
        "    image: haproxy:2.6",
        "    volumes:",
        "      - ./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro",
        "    ports:",
        f"      - \"{topology.haproxy_bind_address}:{topology.haproxy_port}:{topology.haproxy_port}\"",
        f"      - \"{topology.haproxy_bind_address}:{topology.haproxy_stats_port}:{topology.haproxy_stats_port}\"",
        "    depends_on:",
    ]
    lines += [f"      {n.name}:\n        condition: service_healthy" for n in topology.nodes]
    lines += ["    restart: unless-stopped"]
    if topology.toxiproxy_enabled:
        lines += [
            "  toxiproxy:",
            f"    image: {topology.toxiproxy_image}",
            "    ports:",
            f"      - \"{topology.toxiproxy_api_port}:{topology.toxiproxy_api_port}\"",
            "    profiles: [\"chaos\"]",
        ]
    if topology.spark_enabled:
        first = topology.nodes[0].name
        lines += [
            "  spark:",
            f"    image: {topology.spark_image}",
            "    command: [\"/opt/spark/bin/spark-submit\", \"--master\", \"local[*]\", "
            "\"/opt/raftmq/spark_analytics/job.py\", \"--input\", \"/telemetry/*/telemetry/*.jsonl\", "
            "\"--output\", \"/results\"]",
            "    volumes:",
            "      - ../spark_analytics:/opt/raftmq/spark_analytics:ro",
            "      - spark-results:/results",
        ]
        lines += [f"      - {n.name}-data:/telemetry/{n.name}:ro" for n in topology.nodes]
        lines += ["    depends_on:", f"      - {first}", "    profiles: [\"analytics\"]"]
    lines += ["volumes:"]
    lines += [f"  {n.name}-data: {{}}" for n in topology.nodes]
    if topology.spark_enabled:
        lines += ["  spark-results: {}"]
    lines += ["secrets:", "  cluster_secret:", f"    file: ./{SECRET_FILE.name}"]
    return "\n".join(lines) + "\n"


def generated_files(topology: Topology) -> dict[Path, str]:
    return {COMPOSE_FILE: compose_yaml(topology), HAPROXY_FILE: compose_haproxy_cfg(topology)}


def new_secret(path: Path = SECRET_FILE) -> bool:
    """Generate this deployment's cluster secret into `path` (random, mode 0600 from creation); False (and the file
    is left alone) when it exists already."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(SECRET_BYTES) + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.topology", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", action="store_true", help="regenerate the checked-in files")
    group.add_argument("--check", action="store_true", help="fail when the checked-in files are stale")
    group.add_argument("--new-secret", action="store_true",
                       help=f"generate this deployment's cluster secret into {SECRET_FILE} (kept when it exists)")
    args = parser.parse_args(argv)
    if args.new_secret:
        created = new_secret()
        print(f"{SECRET_FILE}: {'generated' if created else 'exists, kept'}")
        return 0
    stale = []
    for path, text in generated_files(load()).items():
        if args.write:
            path.write_text(text)
        elif not path.exists() or path.read_text() != text:
            stale.append(path.name)
    if stale:
        print(f"stale generated files: {', '.join(stale)}; run python -m deploy.topology --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
