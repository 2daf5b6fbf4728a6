"""The cluster metadata's records and commands: plain frozen dataclasses, no behaviour.

What it is for: `cluster.metadata.model` applies these commands to a state made of these records; they are split
out so the state machine stays readable. Everything here is also importable from `cluster.metadata.model`.

How it works: every command carries an optional command id (`cid`) for idempotent retries; declares carry the
full definition. `COMMAND_TYPES` / `RECORD_TYPES` list them for the codec (cluster/metadata/state.py `to_plain` / `from_plain`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cluster.metadata.leases import ClaimLease, LeaseRecord, NodeLeaseRecord, ReleaseLease, RenewNodeLease
from cluster.metadata.mirror import MIRROR_COMMAND_TYPES, MirrorCommand, MirrorRecord
from cluster.metadata.mirror_convert import ConvertToClassic, ConvertToMirror

Args = dict[str, Any]

# ---------------------------------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    address: str  # host:port of its metadata (pysyncobj) endpoint
    version: int
    state: str = "up"
    # Its other endpoints (issue 5, online membership; 0/"" = not recorded yet: cluster_nodes has them).
    host: str = ""
    amqp_port: int = 0
    raft_port: int = 0
    management_port: int = 0


@dataclass(frozen=True, slots=True)
class VhostRecord:
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)  # max-connections, max-queues (RabbitMQ's vhost limits)


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    password_hash: str
    tags: tuple[str, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)  # max-connections, max-channels (RabbitMQ's user limits)


@dataclass(frozen=True, slots=True)
class PermissionRecord:
    user: str
    vhost: str
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"


@dataclass(frozen=True, slots=True)
class ExchangeRecord:
    vhost: str
    name: str
    type: str = "direct"
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: Args = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BindingRecord:
    vhost: str
    source: str
    destination: str
    destination_kind: str = "queue"  # "queue" or "exchange"
    routing_key: str = ""
    arguments: Args = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueRecord:
    vhost: str
    name: str
    type: str = "classic"
    durable: bool = True
    auto_delete: bool = False
    exclusive_owner: str = ""  # "" = not exclusive; else the owning connection's cluster-wide id
    arguments: Args = field(default_factory=dict)
    leader: str = ""
    members: tuple[str, ...] = ()
    # Which declaration this is (chosen by the declaring command; 0 = recorded before incarnations existed): a
    # queue deleted and declared again under its name is a new incarnation, and a node holding the Raft group of
    # an older one deletes that local state before it joins the group again (node/runtime/cluster/runtime.py).
    incarnation: int = 0
    # The leader named when the queue was declared, never changed afterwards ("" = none: declared before this field,
    # or by a node that does not name one). Every node starts the queue's Raft group with its term-1 vote cast for
    # this node, which then leads term 1 without an election (cluster.raft.core.raft.bootstrap_state).
    initial_leader: str = ""
    # How many times the queue's log moved from a mirror log back to a Raft group (`ConvertToClassic`,
    # cluster/metadata/mirror_convert.py): part of the Raft group id, so each move starts a new group (a node down
    # meanwhile deletes the older group's stream instead of rejoining with it); `initial_leader` is then the node
    # that sealed the mirror log, which leads the new group's term 1 from its seed.
    generation: int = 0


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    vhost: str
    name: str
    pattern: str
    apply_to: str = "all"
    definition: Args = field(default_factory=dict)
    priority: int = 0


@dataclass(frozen=True, slots=True)
class ParameterRecord:
    """A runtime parameter of a vhost (component "shovel", ...); `value` is its JSON text, validated by the
    component's owner before the command is proposed."""

    vhost: str
    component: str
    name: str
    value: str = ""


# ---------------------------------------------------------------------------------------------------- commands


@dataclass(frozen=True, slots=True)
class AddNode:
    """Record a node (a restarted node: marked up again). Empty endpoints keep the ones already recorded."""

    name: str
    address: str
    version: int
    cid: str = ""
    host: str = ""
    amqp_port: int = 0
    raft_port: int = 0
    management_port: int = 0


@dataclass(frozen=True, slots=True)
class RemoveNode:
    """Forget a node. Refused while queues list it as a member, unless `force`: then it is dropped from every
    member list (the leader moves to the next member) and the queues it was the only member of are deleted."""

    name: str
    force: bool = False
    cid: str = ""


@dataclass(frozen=True, slots=True)
class SetNodeState:
    name: str
    state: str
    cid: str = ""


@dataclass(frozen=True, slots=True)
class PutVhost:
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)
    cid: str = ""


@dataclass(frozen=True, slots=True)
class DeleteVhost:
    name: str
    cid: str = ""


@dataclass(frozen=True, slots=True)
class PutUser:
    name: str
    password_hash: str
    tags: tuple[str, ...] = ()
    cid: str = ""
    limits: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeleteUser:
    name: str
    cid: str = ""


@dataclass(frozen=True, slots=True)
class SetPermissions:
    user: str
    vhost: str
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"
    cid: str = ""


@dataclass(frozen=True, slots=True)
class ClearPermissions:
    user: str
    vhost: str
    cid: str = ""


@dataclass(frozen=True, slots=True)
class DeclareExchange:
    exchange: ExchangeRecord
    cid: str = ""


@dataclass(frozen=True, slots=True)
class DeleteExchange:
    vhost: str
    name: str
    cid: str = ""


@dataclass(frozen=True, slots=True)
class Bind:
    binding: BindingRecord
    cid: str = ""


@dataclass(frozen=True, slots=True)
class Unbind:
    binding: BindingRecord
    cid: str = ""


@dataclass(frozen=True, slots=True)
class DeclareQueue:
    """The full definition, placement included. Redeclaring an equal definition keeps the current placement."""

    queue: QueueRecord
    cid: str = ""


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    vhost: str
    name: str
    cid: str = ""


@dataclass(frozen=True, slots=True)
class SetQueueLeader:
    vhost: str
    name: str
    leader: str
    cid: str = ""


@dataclass(frozen=True, slots=True)
class SetQueueMembers:
    """New member list; the leader is kept if still a member, else the first member becomes leader."""

    vhost: str
    name: str
    members: tuple[str, ...]
    cid: str = ""


@dataclass(frozen=True, slots=True)
class AddQueueMember:
    """Grow: add one known node to a queue's members (already a member: nothing changes)."""

    vhost: str
    name: str
    node: str
    cid: str = ""


@dataclass(frozen=True, slots=True)
class RemoveQueueMember:
    """Shrink: drop one member (not a member: nothing changes; the last member: refused). A removed leader is
    replaced by the first remaining member."""

    vhost: str
    name: str
    node: str
    cid: str = ""


@dataclass(frozen=True, slots=True)
class SetPolicy:
    policy: PolicyRecord
    cid: str = ""


@dataclass(frozen=True, slots=True)
class ClearPolicy:
    vhost: str
    name: str
    cid: str = ""


@dataclass(frozen=True, slots=True)
class SetParameter:
    parameter: ParameterRecord
    cid: str = ""


@dataclass(frozen=True, slots=True)
class ClearParameter:
    vhost: str
    component: str
    name: str
    cid: str = ""


@dataclass(frozen=True, slots=True)
class Barrier:
    """Changes nothing and is never remembered in the command-id table: a replica that has applied it has applied
    everything committed before it (`MetadataStore.sync()`, for reads that must see the latest state)."""

    cid: str = ""


Command = (
    Barrier | AddNode | RemoveNode | SetNodeState | PutVhost | DeleteVhost | PutUser | DeleteUser | SetPermissions
    | ClearPermissions | DeclareExchange | DeleteExchange | Bind | Unbind | DeclareQueue | DeleteQueue
    | SetQueueLeader | SetQueueMembers | AddQueueMember | RemoveQueueMember | SetPolicy | ClearPolicy
    | SetParameter | ClearParameter | ClaimLease | RenewNodeLease | ReleaseLease | MirrorCommand | ConvertToMirror
    | ConvertToClassic
)

COMMAND_TYPES: tuple[type, ...] = (
    Barrier, AddNode, RemoveNode, SetNodeState, PutVhost, DeleteVhost, PutUser, DeleteUser, SetPermissions,
    ClearPermissions, DeclareExchange, DeleteExchange, Bind, Unbind, DeclareQueue, DeleteQueue,
    SetQueueLeader, SetQueueMembers, AddQueueMember, RemoveQueueMember, SetPolicy, ClearPolicy,
    SetParameter, ClearParameter, ClaimLease, RenewNodeLease, ReleaseLease, *MIRROR_COMMAND_TYPES, ConvertToMirror,
    ConvertToClassic,
)
RECORD_TYPES: tuple[type, ...] = (
    NodeRecord, VhostRecord, UserRecord, PermissionRecord, ExchangeRecord, BindingRecord, QueueRecord,
    PolicyRecord, ParameterRecord, LeaseRecord, NodeLeaseRecord, MirrorRecord,
)
