"""Online membership of the metadata group: the pure rules (no I/O), used by `store` and `node/runtime`.

What it is for: the cluster's members change while it runs (`raftmq ctl join_cluster` / `leave_cluster` /
`forget_cluster_node`). Three sources say who is a member, and this module decides between them:

- the pysyncobj group's members (metadata addresses; changed one at a time with addNodeToCluster /
  removeNodeFromCluster, and cached on disk by each node because pysyncobj does not restore them at a restart);
- the node records of the replicated metadata (`NodeRecord`, with every endpoint of a node that has recorded them);
- `cluster_nodes` in the node's configuration (the static list the first nodes were started with).

Which source wins (docs/cluster.md, "Metadata membership"): the metadata group's membership is the cached pysyncobj
member list once a node has one (`cluster_nodes` only seeds the very first start); the cluster's nodes are the
nodes with a record, plus the `cluster_nodes` entries whose metadata address is in the group (listed nodes that
have not recorded themselves yet). A node listed in this node's `cluster_nodes` is reached at the endpoints listed
there (an operator's route, e.g. through a proxy); any other node at the endpoints of its record.
A node that was removed (forgotten, left) is in neither the group nor the records, so a stale `cluster_nodes`
entry does not bring it back.

How it works: plain functions and frozen dataclasses; the join request and the members cache are cbor with their
fields checked on decode (`MembershipDecodeError`), because both cross a trust boundary (the network, the disk).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cbor2

from cluster.metadata.commands import AddNode, NodeRecord

MEMBERS_CACHE_FORMAT = 1
JOIN_REQUEST_FORMAT = 1
NAME_BYTES_MAX = 255
MEMBERS_MAX = 64  # a bound on the member list we accept from the disk or a peer
DEFAULT_AMQP_PORT = 5672
METADATA_PORT_OFFSET = 21_000  # as node/runtime/config.py (the metadata port derived from the AMQP port)
JOIN_COMMAND = "raftmq_join"  # the pysyncobj utility message a joining node sends to a member
JOIN_PHASE_RECORD = "record"  # AddNode (version and name checked): nothing else changes
JOIN_PHASE_ADD = "add"  # addNodeToCluster of a recorded node


class MembershipDecodeError(ValueError):
    """Bytes that are not a well-formed join request / members cache."""


@dataclass(frozen=True, slots=True)
class NodeEndpoints:
    """Every address of one node: AMQP, Raft (queue groups), metadata (pysyncobj), management HTTP."""

    name: str
    host: str
    amqp_port: int
    raft_port: int
    metadata_port: int
    management_port: int

    @property
    def metadata_address(self) -> str:
        return f"{self.host}:{self.metadata_port}"


def endpoints_of(record: NodeRecord) -> NodeEndpoints | None:
    """The record's endpoints, or None when it has not recorded them (a node of an older version)."""
    port = record.address.rpartition(":")[2]
    if not record.host or not record.raft_port or not record.amqp_port or not port.isdigit():
        return None
    return NodeEndpoints(record.name, record.host, record.amqp_port, record.raft_port, int(port),
                         record.management_port)


def cluster_endpoints(records: Mapping[str, NodeRecord], configured: Sequence[NodeEndpoints],
                      group: Iterable[str], self_endpoints: NodeEndpoints) -> tuple[NodeEndpoints, ...]:
    """The cluster's nodes (see the module header for the rule), sorted by name, this node always included."""
    in_group = set(group)
    by_name = {c.name: c for c in configured}
    chosen: dict[str, NodeEndpoints] = {self_endpoints.name: self_endpoints}
    for name, record in records.items():
        if name in chosen:
            continue
        found = by_name.get(name) or endpoints_of(record)  # this node's own route to a listed node wins
        if found is not None:
            chosen[name] = found
    for entry in configured:
        if entry.name not in chosen and entry.metadata_address in in_group:
            chosen[entry.name] = entry
    return tuple(chosen[name] for name in sorted(chosen))


def record_needs_endpoints(record: NodeRecord | None, me: NodeEndpoints) -> bool:
    """Whether this node should (re-)record its endpoints: missing or different from what it serves."""
    if record is None:
        return False  # not joined yet: the join records them
    return (record.host, record.amqp_port, record.raft_port, record.management_port) != (
        me.host, me.amqp_port, me.raft_port, me.management_port)


def add_node_command(me: NodeEndpoints, version: int) -> AddNode:
    return AddNode(me.name, me.metadata_address, version, host=me.host, amqp_port=me.amqp_port,
                   raft_port=me.raft_port, management_port=me.management_port)


# ---------------------------------------------------------------------------------------------------- seeds


def derived_metadata_port(amqp_port: int) -> int:
    """The metadata port of a node whose AMQP port is `amqp_port` (as the runner writes it: +21000, or -21000
    where that would pass 65535)."""
    port = amqp_port + METADATA_PORT_OFFSET
    return port if port <= 65535 else amqp_port - METADATA_PORT_OFFSET


def parse_seed(text: str) -> str:
    """The metadata address (host:port) of the node to join, from what an operator types:
    `rabbit@host` (AMQP port 5672), `host`, `host:amqp_port`, `name=host:amqp_port[:raft_port[:metadata_port]]`
    (a `cluster_nodes` entry). ValueError when it is none of those."""
    text = text.strip()
    if "=" in text:
        text = text.partition("=")[2].strip()
    elif "@" in text:
        text = text.partition("@")[2].strip()
    host, ports = _split_host(text)
    numbers = [_port(p, text) for p in ports]
    if not host or len(numbers) > 3:
        raise ValueError(f"{text!r} is not [name@]host[:amqp_port[:raft_port[:metadata_port]]]")
    if len(numbers) == 3:
        return f"{host}:{numbers[2]}"
    amqp = numbers[0] if numbers else DEFAULT_AMQP_PORT
    return f"{host}:{derived_metadata_port(amqp)}"


def _split_host(text: str) -> tuple[str, list[str]]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, [p for p in rest.split(":") if p] if rest.startswith(":") else []
    host, _, rest = text.partition(":")
    return host, rest.split(":") if rest else []


def _port(text: str, where: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= 65535:
        raise ValueError(f"{where!r}: bad port {text!r}")
    return int(text)


# ---------------------------------------------------------------------------------------------------- join request


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """What a joining node tells the member it contacts (over pysyncobj's authenticated utility channel)."""

    endpoints: NodeEndpoints
    version: int

    def add_node(self, cid: str) -> AddNode:
        command = add_node_command(self.endpoints, self.version)
        return AddNode(command.name, command.address, command.version, cid, command.host, command.amqp_port,
                       command.raft_port, command.management_port)


def encode_join_request(request: JoinRequest) -> bytes:
    e = request.endpoints
    return bytes(cbor2.dumps([JOIN_REQUEST_FORMAT, e.name, e.host, e.amqp_port, e.raft_port, e.metadata_port,
                              e.management_port, request.version]))


def decode_join_request(data: Any) -> JoinRequest:
    try:
        fields = cbor2.loads(data) if isinstance(data, bytes) else None
    except (cbor2.CBORDecodeError, ValueError, TypeError, EOFError) as exc:
        raise MembershipDecodeError(f"undecodable join request: {exc}") from None
    if not isinstance(fields, list) or len(fields) != 8 or fields[0] != JOIN_REQUEST_FORMAT:
        raise MembershipDecodeError("not a join request of this version")
    _, name, host, amqp, raft, metadata, management, version = fields
    if not (_is_name(name) and _is_name(host)):
        raise MembershipDecodeError("join request: bad node name or host")
    ports = (amqp, raft, metadata, management)
    if not all(isinstance(p, int) and 0 < p <= 65535 for p in ports) or not isinstance(version, int):
        raise MembershipDecodeError("join request: bad port or version")
    return JoinRequest(NodeEndpoints(name, host, amqp, raft, metadata, management), version)


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value.encode()) <= NAME_BYTES_MAX and value.isprintable()


def join_refusal(records: Mapping[str, NodeRecord], protocol_version: int, request: JoinRequest) -> str:
    """Why the cluster refuses this join ("" = admit): another protocol version, or the name is taken by a node at
    another metadata address (forget that node first). The same name at the same address is a re-join: admitted."""
    e = request.endpoints
    if protocol_version and request.version != protocol_version:
        return (f"node {e.name} speaks metadata protocol version {request.version}; this cluster speaks version "
                f"{protocol_version}")
    for name, record in records.items():
        if name == e.name and record.address != e.metadata_address:
            return f"a node named {name} is already a member at {record.address}; forget it first"
        if name != e.name and record.address == e.metadata_address:
            return f"node {name} is already a member at {record.address}"
    return ""


# ---------------------------------------------------------------------------------------------------- members cache


@dataclass(frozen=True, slots=True)
class MembersCache:
    """This node's last known metadata group (metadata addresses, itself included); `left`: it left the cluster
    (`leave_cluster`) and must not start as a member again until its data directory is reset."""

    addresses: tuple[str, ...]
    left: bool = False


def encode_members_cache(cache: MembersCache) -> bytes:
    return bytes(cbor2.dumps({"format": MEMBERS_CACHE_FORMAT, "addresses": sorted(cache.addresses),
                              "left": cache.left}))


def decode_members_cache(data: bytes) -> MembersCache:
    try:
        doc = cbor2.loads(data)
    except (cbor2.CBORDecodeError, ValueError, TypeError, EOFError) as exc:
        raise MembershipDecodeError(f"undecodable members cache: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != MEMBERS_CACHE_FORMAT:
        raise MembershipDecodeError("not a members cache of this version")
    addresses, left = doc.get("addresses"), doc.get("left")
    if (not isinstance(addresses, list) or len(addresses) > MEMBERS_MAX or not isinstance(left, bool)
            or not all(_is_name(a) and ":" in a for a in addresses)):
        raise MembershipDecodeError("members cache: bad fields")
    return MembersCache(tuple(addresses), left)


def start_partners(cache: MembersCache | None, configured_peers: Sequence[str], self_address: str) -> tuple[str, ...]:
    """The pysyncobj partners to start with: the cached group (minus this node) once there is one, else the
    configured peers (the first start)."""
    if cache is None:
        return tuple(configured_peers)
    return tuple(a for a in cache.addresses if a != self_address)
