"""The cluster's definitions as a deterministic, pure state machine.

What it is for: every node holds one replica of the cluster metadata — nodes, vhosts, users, permissions,
exchanges, bindings, queues with their placement (type, leader, members), policies and runtime parameters
(shovels: `SetParameter`/`ClearParameter`, the value kept as JSON text). The replicas are kept equal
by applying the same commands in the same order (the Raft log of `cluster.metadata.store`); this module is the
function those commands go through: `apply(state, command) -> (state, Outcome)`.

How it works:
- `MetadataState` is immutable: every map is copied on write, so a reader in another thread always sees a whole
  state, and an old state stays valid as a value (the store swaps one reference).
- Every command is idempotent. Declares carry the full definition, deletes of something absent do nothing, and a
  command carrying a command id (`cid`) is remembered in a bounded table (`DEDUP_MAX` most recent ids, oldest
  dropped first): applying the same id again returns the first outcome and changes nothing. So a client may retry
  after LEADER_CHANGED or a timeout with an unknown outcome.
- An `Outcome` says what changed (`Change(kind, key, action)`) or why the command was refused. Refusals are
  remembered under their id as well: one command id has exactly one outcome.
- Deletes cascade: a vhost takes its exchanges, queues, bindings, permissions and policies; a queue or exchange
  takes the bindings that name it; a user takes its permissions.
- A vhost comes with RabbitMQ's pre-declared exchanges (`PREDECLARED_EXCHANGES`: amq.direct, amq.fanout, ...),
  as every broker's vhost does, so binds to them are checked like any other; a bind naming one in a state written
  before that adds the missing ones in the same step.
- The values (`MetadataState`, `Outcome`, `Change`) and their cbor-able form (`snapshot(state)` / `restore(dict)`,
  `command_to_dict` / `command_from_dict`: str, int, bool, lists, dicts, never pickle) are in
  `cluster.metadata.state`; this module re-exports them, as it does the records and commands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from cluster.metadata import leases as ls
from cluster.metadata.commands import (  # re-exported: model is where callers import them from
    COMMAND_TYPES,
    RECORD_TYPES,
    AddNode,
    AddQueueMember,
    Barrier,
    Bind,
    BindingRecord,
    ClearParameter,
    ClearPermissions,
    ClearPolicy,
    Command,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    DeleteUser,
    DeleteVhost,
    ExchangeRecord,
    NodeRecord,
    ParameterRecord,
    PermissionRecord,
    PolicyRecord,
    PutUser,
    PutVhost,
    QueueRecord,
    RemoveNode,
    RemoveQueueMember,
    SetNodeState,
    SetParameter,
    SetPermissions,
    SetPolicy,
    SetQueueLeader,
    SetQueueMembers,
    Unbind,
    UserRecord,
    VhostRecord,
)
from cluster.metadata.mirror import (
    MIRROR_COMMAND_TYPES,
    AlterMirrorReplicas,
    MirrorCommand,
    apply_mirror,
)
from cluster.metadata.mirror_convert import (
    ConvertToClassic,
    ConvertToMirror,
    back_refusal,
    converted,
    refusal,
)
from cluster.metadata.state import (  # re-exported as well
    BindingKey,
    Change,
    MetadataState,
    Outcome,
    binding_key,
    command_from_dict,
    command_to_dict,
    from_plain,
    outcome_from_dict,
    outcome_to_dict,
    restore,
    snapshot,
    to_plain,
)

PROTOCOL_VERSION = 1
DEDUP_MAX = 4096
NODE_STATES = ("up", "down")
QUEUE_TYPES = ("classic", "quorum", "mirrored", "stream")
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
# Every vhost has these from its creation on, as in RabbitMQ (the broker's node/broker/vhost.py PREDECLARED).
PREDECLARED_EXCHANGES = (
    ("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"), ("amq.headers", "headers"),
    ("amq.match", "headers"), ("amq.rabbitmq.trace", "topic"),
)
PREDECLARED_INTERNAL = frozenset({"amq.rabbitmq.trace"})  # internal, as in RabbitMQ (the Firehose's exchange)

# The records and commands live in cluster.metadata.commands, the state and its codec in cluster.metadata.state;
# callers import them from here.
__all__ = [
    "BindingKey", "Change", "MetadataState", "Outcome", "binding_key", "command_from_dict", "command_to_dict",
    "from_plain", "outcome_from_dict", "outcome_to_dict", "restore", "snapshot", "to_plain",
    "AddNode", "AddQueueMember", "Barrier", "Bind", "BindingRecord", "ClearParameter", "ClearPermissions",
    "ClearPolicy", "Command", "COMMAND_TYPES", "DeclareExchange", "DeclareQueue", "DeleteExchange", "DeleteQueue",
    "DeleteUser", "DeleteVhost", "ExchangeRecord", "NodeRecord", "ParameterRecord", "PermissionRecord",
    "PolicyRecord", "PutUser", "PutVhost", "QueueRecord", "RECORD_TYPES", "RemoveNode", "RemoveQueueMember",
    "SetNodeState", "SetParameter", "SetPermissions", "SetPolicy", "SetQueueLeader", "SetQueueMembers", "Unbind",
    "UserRecord", "VhostRecord",
]


def _put(m: Mapping[Any, Any], key: Any, value: Any) -> dict[Any, Any]:
    new = dict(m)
    new[key] = value
    return new


def _without(m: Mapping[Any, Any], keys: set[Any]) -> dict[Any, Any]:
    return {k: v for k, v in m.items() if k not in keys}


Step = tuple[MetadataState, Outcome]


def _refuse(state: MetadataState, why: str) -> Step:
    return state, Outcome(refused=why)


def _upsert(state: MetadataState, attr: str, kind: str, key: Any, record: Any, ckey: tuple[str, ...]) -> Step:
    current = getattr(state, attr)
    old = current.get(key)
    if old == record:
        return state, Outcome()
    action = "created" if old is None else "updated"
    updated: dict[str, Any] = {attr: _put(current, key, record)}
    new_state = replace(state, **updated)
    return new_state, Outcome((Change(kind, ckey, action),))


# ---------------------------------------------------------------------------------------------------- handlers


def _add_node(s: MetadataState, c: AddNode) -> Step:
    if s.protocol_version and c.version != s.protocol_version:
        return _refuse(s, f"node {c.name} speaks metadata protocol version {c.version}; "
                          f"this cluster speaks version {s.protocol_version}")
    if s.protocol_version == 0:
        s = replace(s, protocol_version=c.version)
    record = NodeRecord(c.name, c.address, c.version, "up", c.host, c.amqp_port, c.raft_port, c.management_port)
    old = s.nodes.get(c.name)
    if not c.host and old is not None:  # a start without endpoints keeps the recorded ones
        record = replace(record, host=old.host, amqp_port=old.amqp_port, raft_port=old.raft_port,
                         management_port=old.management_port)
    return _upsert(s, "nodes", "node", c.name, record, (c.name,))


def _remove_node(s: MetadataState, c: RemoveNode) -> Step:
    if c.name not in s.nodes:
        return s, Outcome()
    hosting = sorted(k for k, q in s.queues.items() if c.name in q.members)
    if hosting and not c.force:
        shown = ", ".join(f"{vh}/{name}" for vh, name in hosting[:5])
        return _refuse(s, f"node {c.name} is still a member of {len(hosting)} queue(s) ({shown}"
                          f"{', ...' if len(hosting) > 5 else ''}); move them first or force")
    changes: list[Change] = []
    for key in hosting:
        q = s.queues[key]
        if q.members == (c.name,):
            s, outcome = _delete_queue(s, DeleteQueue(q.vhost, q.name))
        else:
            s, outcome = _set_queue_members(s, SetQueueMembers(q.vhost, q.name,
                                                               tuple(m for m in q.members if m != c.name)))
        changes += outcome.changes
    s = replace(s, nodes=_without(s.nodes, {c.name}))
    return s, Outcome((*changes, Change("node", (c.name,), "deleted")))


def _set_node_state(s: MetadataState, c: SetNodeState) -> Step:
    node = s.nodes.get(c.name)
    if node is None:
        return _refuse(s, f"no node {c.name}")
    if c.state not in NODE_STATES:
        return _refuse(s, f"unknown node state {c.state!r}")
    return _upsert(s, "nodes", "node", c.name, replace(node, state=c.state), (c.name,))


def _put_vhost(s: MetadataState, c: PutVhost) -> Step:
    s, outcome = _upsert(s, "vhosts", "vhost", c.name, VhostRecord(c.name, c.description, c.tags, dict(c.limits)), (c.name,))
    s, created = _ensure_predeclared(s, c.name)
    return s, Outcome((*outcome.changes, *created)) if created else outcome


def _ensure_predeclared(s: MetadataState, vhost: str) -> tuple[MetadataState, list[Change]]:
    """The vhost's pre-declared `amq.*` exchanges, added where missing (also for a state written before they were
    part of every vhost, when a bind names one)."""
    missing = [ExchangeRecord(vhost, name, kind, internal=name in PREDECLARED_INTERNAL)
               for name, kind in PREDECLARED_EXCHANGES
               if (vhost, name) not in s.exchanges]
    if not missing or vhost not in s.vhosts:
        return s, []
    exchanges = dict(s.exchanges)
    for record in missing:
        exchanges[(vhost, record.name)] = record
    return replace(s, exchanges=exchanges), [Change("exchange", (vhost, r.name), "created") for r in missing]


def _cascade(s: MetadataState, attr: str, kind: str, doomed: set[Any],
             describe: Callable[[Any], tuple[str, ...]]) -> tuple[MetadataState, list[Change]]:
    if not doomed:
        return s, []
    changes = [Change(kind, describe(k), "deleted") for k in getattr(s, attr) if k in doomed]
    updated: dict[str, Any] = {attr: _without(getattr(s, attr), doomed)}
    return replace(s, **updated), changes


def _drop_bindings(s: MetadataState, doomed: set[BindingKey]) -> tuple[MetadataState, list[Change]]:
    return _cascade(s, "bindings", "binding", doomed, lambda k: k[:5])


def _delete_vhost(s: MetadataState, c: DeleteVhost) -> Step:
    if c.name not in s.vhosts:
        return s, Outcome()
    changes: list[Change] = []
    for attr, kind in (("exchanges", "exchange"), ("queues", "queue"), ("permissions", "permission"),
                       ("policies", "policy"), ("parameters", "parameter"), ("mirrors", "mirror")):
        doomed = {k for k in getattr(s, attr) if k[0] == c.name}
        s, more = _cascade(s, attr, kind, doomed, lambda k: tuple(k))
        changes += more
    s, more = _drop_bindings(s, {k for k in s.bindings if k[0] == c.name})
    changes += more
    s = replace(s, vhosts=_without(s.vhosts, {c.name}))
    return s, Outcome((*changes, Change("vhost", (c.name,), "deleted")))


def _put_user(s: MetadataState, c: PutUser) -> Step:
    return _upsert(s, "users", "user", c.name, UserRecord(c.name, c.password_hash, c.tags, dict(c.limits)), (c.name,))


def _delete_user(s: MetadataState, c: DeleteUser) -> Step:
    if c.name not in s.users:
        return s, Outcome()
    s, changes = _cascade(s, "permissions", "permission", {k for k in s.permissions if k[1] == c.name}, tuple)
    s = replace(s, users=_without(s.users, {c.name}))
    return s, Outcome((*changes, Change("user", (c.name,), "deleted")))


def _set_permissions(s: MetadataState, c: SetPermissions) -> Step:
    if c.user not in s.users:
        return _refuse(s, f"no user {c.user}")
    if c.vhost not in s.vhosts:
        return _refuse(s, f"no vhost {c.vhost}")
    rec = PermissionRecord(c.user, c.vhost, c.configure, c.write, c.read)
    return _upsert(s, "permissions", "permission", (c.vhost, c.user), rec, (c.vhost, c.user))


def _clear_permissions(s: MetadataState, c: ClearPermissions) -> Step:
    s2, changes = _cascade(s, "permissions", "permission", {(c.vhost, c.user)} & set(s.permissions), tuple)
    return s2, Outcome(tuple(changes))


def _declare_exchange(s: MetadataState, c: DeclareExchange) -> Step:
    x = c.exchange
    if x.vhost not in s.vhosts:
        return _refuse(s, f"no vhost {x.vhost}")
    if x.type not in EXCHANGE_TYPES and not x.type.startswith("x-"):
        return _refuse(s, f"unknown exchange type {x.type!r}")
    return _upsert(s, "exchanges", "exchange", (x.vhost, x.name), x, (x.vhost, x.name))


def _delete_exchange(s: MetadataState, c: DeleteExchange) -> Step:
    if (c.vhost, c.name) not in s.exchanges:
        return s, Outcome()
    s, changes = _drop_bindings(s, {k for k in s.bindings if k[0] == c.vhost and (
        k[1] == c.name or (k[2] == "exchange" and k[3] == c.name))})
    s = replace(s, exchanges=_without(s.exchanges, {(c.vhost, c.name)}))
    return s, Outcome((*changes, Change("exchange", (c.vhost, c.name), "deleted")))


def _bind(s: MetadataState, c: Bind) -> Step:
    b = c.binding
    before = s  # a refusal changes nothing
    created: list[Change] = []
    predeclared = {name for name, _ in PREDECLARED_EXCHANGES}
    if b.source in predeclared or (b.destination_kind == "exchange" and b.destination in predeclared):
        s, created = _ensure_predeclared(s, b.vhost)
    if (b.vhost, b.source) not in s.exchanges:
        return _refuse(before, f"no exchange {b.source!r} in vhost {b.vhost}")
    targets = s.queues if b.destination_kind == "queue" else s.exchanges
    if b.destination_kind not in ("queue", "exchange") or (b.vhost, b.destination) not in targets:
        return _refuse(before, f"no {b.destination_kind} {b.destination!r} in vhost {b.vhost}")
    key = binding_key(b)
    s, outcome = _upsert(s, "bindings", "binding", key, b, key[:5])
    return s, Outcome((*created, *outcome.changes)) if created else outcome


def _unbind(s: MetadataState, c: Unbind) -> Step:
    key = binding_key(c.binding)
    s2, changes = _drop_bindings(s, {key} & set(s.bindings))
    return s2, Outcome(tuple(changes))


def _same_definition(a: QueueRecord, b: QueueRecord) -> bool:
    return (replace(a, leader="", members=(), incarnation=0, initial_leader="", generation=0)
            == replace(b, leader="", members=(), incarnation=0, initial_leader="", generation=0))


def _declare_queue(s: MetadataState, c: DeclareQueue) -> Step:
    q = c.queue
    if q.vhost not in s.vhosts:
        return _refuse(s, f"no vhost {q.vhost}")
    if q.type not in QUEUE_TYPES:
        return _refuse(s, f"unknown queue type {q.type!r}")
    if not q.members or q.leader not in q.members or len(set(q.members)) != len(q.members):
        return _refuse(s, f"queue {q.name!r}: the leader must be one of distinct members")
    if q.initial_leader not in ("", q.leader):
        return _refuse(s, f"queue {q.name!r}: the initial leader must be the leader")
    old = s.queues.get((q.vhost, q.name))
    if old is not None:
        if _same_definition(old, q):
            return s, Outcome()
        return _refuse(s, f"queue {q.name!r} in vhost {q.vhost} exists with a different definition")
    return _upsert(s, "queues", "queue", (q.vhost, q.name), q, (q.vhost, q.name))


def _delete_queue(s: MetadataState, c: DeleteQueue) -> Step:
    if (c.vhost, c.name) not in s.queues:
        return s, Outcome()
    s, changes = _drop_bindings(s, {k for k in s.bindings if k[0] == c.vhost and k[2] == "queue"
                                    and k[3] == c.name})
    s, more = _cascade(s, "mirrors", "mirror", {(c.vhost, c.name)} & set(s.mirrors), tuple)
    s = replace(s, queues=_without(s.queues, {(c.vhost, c.name)}))
    return s, Outcome((*changes, *more, Change("queue", (c.vhost, c.name), "deleted")))


def _set_queue_leader(s: MetadataState, c: SetQueueLeader) -> Step:
    q = s.queues.get((c.vhost, c.name))
    if q is None:
        return _refuse(s, f"no queue {c.name!r} in vhost {c.vhost}")
    if c.leader not in q.members:
        return _refuse(s, f"{c.leader} is not a member of queue {c.name!r}")
    return _upsert(s, "queues", "queue", (c.vhost, c.name), replace(q, leader=c.leader), (c.vhost, c.name))


def _set_queue_members(s: MetadataState, c: SetQueueMembers) -> Step:
    q = s.queues.get((c.vhost, c.name))
    if q is None:
        return _refuse(s, f"no queue {c.name!r} in vhost {c.vhost}")
    if not c.members or len(set(c.members)) != len(c.members):
        return _refuse(s, f"queue {c.name!r}: members must be distinct and not empty")
    leader = q.leader if q.leader in c.members else c.members[0]
    new = replace(q, members=c.members, leader=leader)
    return _upsert(s, "queues", "queue", (c.vhost, c.name), new, (c.vhost, c.name))


def _add_queue_member(s: MetadataState, c: AddQueueMember) -> Step:
    q = s.queues.get((c.vhost, c.name))
    if q is None:
        return _refuse(s, f"no queue {c.name!r} in vhost {c.vhost}")
    if c.node not in s.nodes:
        return _refuse(s, f"no node {c.node}")
    if c.node in q.members:
        return s, Outcome()
    return _set_queue_members(s, SetQueueMembers(c.vhost, c.name, (*q.members, c.node)))


def _remove_queue_member(s: MetadataState, c: RemoveQueueMember) -> Step:
    q = s.queues.get((c.vhost, c.name))
    if q is None:
        return _refuse(s, f"no queue {c.name!r} in vhost {c.vhost}")
    if c.node not in q.members:
        return s, Outcome()
    if q.members == (c.node,):
        return _refuse(s, f"{c.node} is the last member of queue {c.name!r}; delete the queue instead")
    return _set_queue_members(s, SetQueueMembers(c.vhost, c.name, tuple(m for m in q.members if m != c.node)))


def _set_policy(s: MetadataState, c: SetPolicy) -> Step:
    p = c.policy
    if p.vhost not in s.vhosts:
        return _refuse(s, f"no vhost {p.vhost}")
    return _upsert(s, "policies", "policy", (p.vhost, p.name), p, (p.vhost, p.name))


def _clear_policy(s: MetadataState, c: ClearPolicy) -> Step:
    s2, changes = _cascade(s, "policies", "policy", {(c.vhost, c.name)} & set(s.policies), tuple)
    return s2, Outcome(tuple(changes))


def _set_parameter(s: MetadataState, c: SetParameter) -> Step:
    p = c.parameter
    if p.vhost not in s.vhosts:
        return _refuse(s, f"no vhost {p.vhost}")
    key = (p.vhost, p.component, p.name)
    return _upsert(s, "parameters", "parameter", key, p, key)


def _clear_parameter(s: MetadataState, c: ClearParameter) -> Step:
    s2, changes = _cascade(s, "parameters", "parameter", {(c.vhost, c.component, c.name)} & set(s.parameters),
                           tuple)
    return s2, Outcome(tuple(changes))


def _claim_lease(s: MetadataState, c: ls.ClaimLease) -> Step:
    leases, node_leases, refused = ls.claim(s.leases, s.node_leases, c)
    return replace(s, leases=leases, node_leases=node_leases), Outcome(refused=refused)  # (no Change: polled)


def _release_lease(s: MetadataState, c: ls.ReleaseLease) -> Step:
    leases, refused = ls.release(s.leases, c)
    return replace(s, leases=leases), Outcome(refused=refused)


def _mirror(s: MetadataState, c: MirrorCommand) -> Step:
    q = s.queues.get((c.vhost, c.name))
    if q is None or q.type != "mirrored":
        return _refuse(s, f"no mirrored queue {c.name!r} in vhost {c.vhost}")
    record, refused = apply_mirror(s.mirrors, c)
    if refused or record is None:
        return _refuse(s, refused) if refused else (s, Outcome())
    s, outcome = _upsert(s, "mirrors", "mirror", (c.vhost, c.name), record, (c.vhost, c.name))
    if isinstance(c, AlterMirrorReplicas) and q.members != record.replicas:  # the queue's members follow
        leader = record.leader if record.leader in record.replicas else record.replicas[0]
        s, more = _upsert(s, "queues", "queue", (c.vhost, c.name), replace(q, members=record.replicas,
                                                                           leader=leader), (c.vhost, c.name))
        outcome = Outcome((*outcome.changes, *more.changes))
    return s, outcome


def _convert_to_mirror(s: MetadataState, c: ConvertToMirror) -> Step:
    """A classic queue becomes mirrored (cluster/metadata/mirror_convert.py): its type and members, and its record."""
    q = s.queues.get((c.vhost, c.name))
    if q is not None and q.type == "mirrored" and q.incarnation == c.incarnation:
        return s, Outcome()  # converted already
    why = refusal(None if q is None else q.type, None if q is None else q.incarnation,
                  bool(q is not None and q.exclusive_owner), c)
    if why or q is None:
        return _refuse(s, why)
    key = (c.vhost, c.name)
    s, outcome = _upsert(s, "queues", "queue", key, replace(q, type="mirrored", members=c.replicas, leader=c.leader),
                         key)
    s, more = _upsert(s, "mirrors", "mirror", key, converted(c), key)
    return s, Outcome((*outcome.changes, *more.changes))


def _convert_to_classic(s: MetadataState, c: ConvertToClassic) -> Step:
    """A mirrored queue becomes classic again (cluster/metadata/mirror_convert.py): type, members, leader, initial
    leader and generation of the queue in one step, and its mirror record deleted."""
    key = (c.vhost, c.name)
    q = s.queues.get(key)
    if q is not None and q.type == "classic" and q.incarnation == c.incarnation and q.generation > c.generation:
        return s, Outcome()  # converted already
    record = s.mirrors.get(key)
    why = back_refusal(None if q is None else q.type, None if q is None else q.incarnation,
                       None if q is None else q.generation, record, c)
    if why or q is None:
        return _refuse(s, why)
    s, outcome = _upsert(s, "queues", "queue", key, replace(q, type="classic", members=(c.leader,), leader=c.leader,
                                                           initial_leader=c.leader, generation=c.generation + 1), key)
    s, more = _cascade(s, "mirrors", "mirror", {key}, tuple)
    return s, Outcome((*outcome.changes, *more))


_HANDLERS: dict[type, Callable[[MetadataState, Any], Step]] = {
    **{t: _mirror for t in MIRROR_COMMAND_TYPES}, ConvertToMirror: _convert_to_mirror,
    ConvertToClassic: _convert_to_classic,
    Barrier: lambda s, c: (s, Outcome()), AddNode: _add_node, RemoveNode: _remove_node,
    SetNodeState: _set_node_state, PutVhost: _put_vhost,
    DeleteVhost: _delete_vhost, PutUser: _put_user, DeleteUser: _delete_user,
    SetPermissions: _set_permissions, ClearPermissions: _clear_permissions,
    DeclareExchange: _declare_exchange, DeleteExchange: _delete_exchange, Bind: _bind, Unbind: _unbind,
    DeclareQueue: _declare_queue, DeleteQueue: _delete_queue, SetQueueLeader: _set_queue_leader,
    SetQueueMembers: _set_queue_members, AddQueueMember: _add_queue_member,
    RemoveQueueMember: _remove_queue_member, SetPolicy: _set_policy, ClearPolicy: _clear_policy,
    SetParameter: _set_parameter, ClearParameter: _clear_parameter, ls.ClaimLease: _claim_lease,
    ls.RenewNodeLease: lambda s, c: (replace(s, node_leases=ls.renew(s.node_leases, c)), Outcome()),
    ls.ReleaseLease: _release_lease,
}


def apply(state: MetadataState, command: Command) -> tuple[MetadataState, Outcome]:
    """Apply one command. Deterministic; a command id seen before returns its first outcome unchanged."""
    if isinstance(command, Barrier):
        return state, Outcome()  # not remembered: barriers would push real command ids out of the window
    cid = command.cid
    if cid and cid in state.applied:
        return state, replace(state.applied[cid], duplicate=True)
    new_state, outcome = _HANDLERS[type(command)](state, command)
    if cid:
        new_state = replace(new_state, applied=_remember(state.applied, cid, outcome))
    return new_state, outcome


def _remember(applied: Mapping[str, Outcome], cid: str, outcome: Outcome) -> dict[str, Outcome]:
    new = dict(applied)
    new[cid] = outcome
    while len(new) > DEDUP_MAX:
        del new[next(iter(new))]
    return new


def diff(old: MetadataState, new: MetadataState) -> tuple[Change, ...]:
    """The changes that turn `old` into `new` (for a replica whose state was replaced by a snapshot)."""
    changes: list[Change] = []
    for attr, kind in _KINDS.items():
        before, after = getattr(old, attr), getattr(new, attr)
        for key in before:
            if key not in after:
                changes.append(Change(kind, _change_key(kind, key), "deleted"))
        for key, record in after.items():
            if key not in before:
                changes.append(Change(kind, _change_key(kind, key), "created"))
            elif before[key] != record:
                changes.append(Change(kind, _change_key(kind, key), "updated"))
    return tuple(changes)


_KINDS = {"nodes": "node", "vhosts": "vhost", "users": "user", "permissions": "permission",
          "exchanges": "exchange", "bindings": "binding", "queues": "queue", "policies": "policy",
          "parameters": "parameter", "mirrors": "mirror"}


def _change_key(kind: str, key: Any) -> tuple[str, ...]:
    if kind == "binding":
        return tuple(key[:5])
    return tuple(key) if isinstance(key, tuple) else (key,)
