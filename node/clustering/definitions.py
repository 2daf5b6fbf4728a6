"""Definitions between the broker and the cluster metadata: records one way, metadata commands the other.

What it is for: in cluster mode the broker's definitions (vhosts, users, permissions, exchanges, queues,
bindings, policies) live in the metadata group (`cluster.metadata.model`). Two translations are needed:
- `mirror_records(old, new)`: the broker records (`node.broker.records`, `deleted=True` for deletions) that take
  a broker holding metadata state `old` to state `new`, in an order the broker can apply (creations parents
  first, deletions children first). Mirroring by diffing whole states (unchanged maps are the same object, the
  metadata state is copy-on-write, so they are skipped at once) needs no per-change bookkeeping and converges
  even when the watch channel was restarted.
- `commands_for(records, ...)`: the metadata commands for the records of one broker `Persist` effect; a new queue
  gets its placement (leader and members) from `placement`.
Pure functions of their inputs (no I/O), so they are unit-tested on their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cluster.metadata import model as md
from cluster.metadata import placement
from cluster.metadata.mirror import DeclareMirror
from node.broker import records as br
from node.broker.ha_policy import HaSpec, ha_spec, mirror_replicas
from node.broker.policies import Policy, PolicyError, make_policy, match_policy

QUEUE_TYPE_ARG = "x-queue-type"
GROUP_SIZE_ARG = "x-quorum-initial-group-size"

# (metadata state attribute, broker record builder) in creation order; deletions run in reverse.
_MIRRORED_ATTRS = ("vhosts", "users", "permissions", "exchanges", "queues", "bindings", "policies")


def _build(cls: type[Any], **values: Any) -> Any:
    """A broker record with the values its dataclass has fields for (newer fields are filled when present)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def broker_record(attr: str, rec: Any, deleted: bool = False) -> Any:
    """The broker record for one metadata record of `attr` (one of `_MIRRORED_ATTRS`)."""
    if attr == "vhosts":
        return _build(br.VHostRecord, name=rec.name, deleted=deleted, limits=dict(getattr(rec, "limits", {})))
    if attr == "users":
        return _build(br.UserRecord, name=rec.name, password_hash=rec.password_hash, tags=tuple(rec.tags),
                      deleted=deleted, limits=dict(getattr(rec, "limits", {})))
    if attr == "permissions":
        return _build(br.PermissionRecord, user=rec.user, vhost=rec.vhost, configure=rec.configure,
                      write=rec.write, read=rec.read, deleted=deleted)
    if attr == "exchanges":
        return _build(br.ExchangeRecord, vhost=rec.vhost, name=rec.name, type=rec.type, durable=rec.durable,
                      auto_delete=rec.auto_delete, internal=rec.internal, arguments=dict(rec.arguments),
                      deleted=deleted)
    if attr == "queues":
        return _build(br.QueueRecord, vhost=rec.vhost, name=rec.name, auto_delete=rec.auto_delete,
                      arguments=dict(rec.arguments), durable=rec.durable, exclusive_owner=rec.exclusive_owner or None,
                      deleted=deleted)
    if attr == "bindings":
        return _build(br.BindingRecord, vhost=rec.vhost, source=rec.source, dest_kind=rec.destination_kind,
                      destination=rec.destination, routing_key=rec.routing_key, arguments=dict(rec.arguments),
                      deleted=deleted)
    if attr == "policies":
        return _build(br.PolicyRecord, vhost=rec.vhost, name=rec.name, pattern=rec.pattern, apply_to=rec.apply_to,
                      definition=dict(rec.definition), priority=rec.priority, deleted=deleted)
    raise ValueError(f"not a mirrored attribute: {attr}")


def _diff(old: Mapping[Any, Any], new: Mapping[Any, Any]) -> tuple[list[Any], list[Any]]:
    """(records created or changed, records deleted) going from `old` to `new`."""
    if old is new:
        return [], []
    upserts = [rec for key, rec in new.items() if old.get(key) != rec]
    deletes = [rec for key, rec in old.items() if key not in new]
    return upserts, deletes


def _placement_only(old: md.QueueRecord | None, new: md.QueueRecord) -> bool:
    return old is not None and dataclasses.replace(old, leader="", members=()) == dataclasses.replace(
        new, leader="", members=())


def mirror_records(old: md.MetadataState, new: md.MetadataState) -> list[Any]:
    """Broker records turning the definitions of `old` into those of `new` (empty when nothing changed).

    A queue whose placement alone changed is not re-sent (the broker's definition is unchanged)."""
    creations: list[Any] = []
    deletions: list[Any] = []
    for attr in _MIRRORED_ATTRS:
        before, after = getattr(old, attr), getattr(new, attr)
        upserts, deletes = _diff(before, after)
        if attr == "queues":
            upserts = [q for q in upserts if not _placement_only(before.get((q.vhost, q.name)), q)]
        creations.extend(broker_record(attr, rec) for rec in upserts)
        deletions.append([broker_record(attr, rec, deleted=True) for rec in deletes])
    for group in reversed(deletions):
        creations.extend(group)
    return creations


def queue_type(arguments: Mapping[str, Any]) -> str:
    kind = arguments.get(QUEUE_TYPE_ARG, "classic")
    return kind if isinstance(kind, str) and kind in md.QUEUE_TYPES else "classic"


Placement = Callable[[md.MetadataState, str, str, str, Mapping[str, Any]], tuple[str, tuple[str, ...]]]


def group_size_of(arguments: Mapping[str, Any], default: int) -> int:
    wanted = arguments.get(GROUP_SIZE_ARG, default)
    return wanted if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted > 0 else default


def client_local_placement(self_name: str, group_size_default: int, configured: Sequence[str] = ()) -> Placement:
    """`cluster.metadata.placement.place_queue` with the declaring node as leader ("client-local", as RabbitMQ)
    and `x-quorum-initial-group-size` (else `group_size_default`) voters for a quorum queue. The `configured`
    nodes (cluster_nodes) that the metadata does not list yet count as up: the membership is static, and this
    node's replica may not have applied a peer's join yet; a node the metadata marks down is never chosen."""

    def place(state: md.MetadataState, vhost: str, name: str, kind: str,
              arguments: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
        size = group_size_of(arguments, group_size_default)
        missing = {n: md.NodeRecord(n, "", state.protocol_version) for n in configured if n not in state.nodes}
        if missing:
            state = dataclasses.replace(state, nodes={**state.nodes, **missing})
        return placement.place_queue(state, vhost, name, kind, self_name, size)

    return place


def vhost_policies(state: md.MetadataState, vhost: str) -> list[Policy]:
    """The vhost's valid policies, as the broker holds them (an invalid record is left out)."""
    policies = []
    for record in state.policies.values():
        if record.vhost == vhost:
            try:
                policies.append(make_policy(vhost, record.name, record.pattern, record.apply_to,
                                            dict(record.definition), record.priority))
            except PolicyError:
                continue
    return policies


def mirror_spec_in(state: md.MetadataState, vhost: str, name: str,
                   policies: Sequence[Policy] | None = None) -> HaSpec | None:
    """The ha-* mirroring asked for a classic queue `name` by the one policy of the vhost that applies to it
    (`policies`: the vhost's, when the caller has them already)."""
    chosen = match_policy(vhost_policies(state, vhost) if policies is None else policies, "queue", name, "classic")
    return ha_spec(chosen.definition) if chosen is not None else None


def live_nodes(state: md.MetadataState, me: str) -> tuple[str, ...]:
    """The nodes a new mirror may be placed on: every node not recorded down, and `me`, sorted."""
    return tuple(sorted({n for n, r in state.nodes.items() if r.state != "down"} | {me}))


def _queue_command(rec: Any, state: md.MetadataState, place: Placement) -> md.Command:
    if rec.deleted:
        return md.DeleteQueue(rec.vhost, rec.name)
    existing = state.queues.get((rec.vhost, rec.name))
    arguments = dict(rec.arguments)
    kind = queue_type(arguments)
    leader, members = (existing.leader, existing.members) if existing is not None else place(state, rec.vhost, rec.name, kind, arguments)
    owner = getattr(rec, "exclusive_owner", "") or ""
    if existing is not None and existing.type == "mirrored":
        kind = "mirrored"  # (a redeclare keeps the queue as it is)
    elif existing is None and kind == "classic" and not owner:
        spec = mirror_spec_in(state, rec.vhost, rec.name)
        if spec is not None:  # an ha-mode policy at declare: a mirrored queue (docs/mirrored_queues.md)
            kind = "mirrored"
            members = mirror_replicas(spec, live_nodes(state, leader), leader)
            leader = members[0]
    return md.DeclareQueue(md.QueueRecord(
        vhost=rec.vhost, name=rec.name, type=kind, durable=bool(getattr(rec, "durable", True)),
        auto_delete=rec.auto_delete, exclusive_owner=str(owner), arguments=arguments, leader=leader,
        members=members, initial_leader=existing.initial_leader if existing is not None else leader))


def command_for(rec: Any, state: md.MetadataState, place: Placement) -> md.Command | None:
    """The metadata command for one broker record; None for records that are not definitions (messages)."""
    if isinstance(rec, br.VHostRecord):
        return md.DeleteVhost(rec.name) if rec.deleted else md.PutVhost(rec.name, limits=dict(rec.limits))
    if isinstance(rec, br.UserRecord):
        return md.DeleteUser(rec.name) if rec.deleted else md.PutUser(rec.name, rec.password_hash, tuple(rec.tags),
                                                                      limits=dict(rec.limits))
    if isinstance(rec, br.PermissionRecord):
        if rec.deleted:
            return md.ClearPermissions(rec.user, rec.vhost)
        return md.SetPermissions(rec.user, rec.vhost, rec.configure, rec.write, rec.read)
    if isinstance(rec, br.ExchangeRecord):
        if rec.deleted:
            return md.DeleteExchange(rec.vhost, rec.name)
        return md.DeclareExchange(md.ExchangeRecord(
            vhost=rec.vhost, name=rec.name, type=rec.type, durable=bool(getattr(rec, "durable", True)),
            auto_delete=rec.auto_delete, internal=rec.internal, arguments=dict(rec.arguments)))
    if isinstance(rec, br.QueueRecord):
        return _queue_command(rec, state, place)
    if isinstance(rec, br.PolicyRecord):
        if rec.deleted:
            return md.ClearPolicy(rec.vhost, rec.name)
        return md.SetPolicy(md.PolicyRecord(vhost=rec.vhost, name=rec.name, pattern=rec.pattern,
                                            apply_to=rec.apply_to, definition=dict(rec.definition),
                                            priority=rec.priority))
    if isinstance(rec, br.BindingRecord):
        binding = md.BindingRecord(vhost=rec.vhost, source=rec.source, destination=rec.destination,
                                   destination_kind=rec.dest_kind, routing_key=rec.routing_key,
                                   arguments=dict(rec.arguments))
        return md.Unbind(binding) if rec.deleted else md.Bind(binding)
    if isinstance(rec, br.MetadataBarrierRecord):
        return md.Barrier()
    return None


def commands_for(records: Sequence[Any], state: md.MetadataState, place: Placement) -> list[md.Command]:
    """The metadata commands of one Persist effect, in the broker's order."""
    commands: list[md.Command] = []
    for rec in records:
        command = command_for(rec, state, place)
        if command is not None:
            commands.append(command)
        if isinstance(command, md.DeclareQueue) and command.queue.type == "mirrored":
            commands.append(declare_mirror(state, command.queue))
    return commands


def declare_mirror(state: md.MetadataState, queue: md.QueueRecord) -> md.Command:
    """The controller's record of a mirrored queue (after its DeclareQueue; the same replicas again: a no-op)."""
    spec = mirror_spec_in(state, queue.vhost, queue.name)
    min_insync = spec.min_insync if spec is not None else 1
    promote = spec.promote_on_failure if spec is not None else "when-synced"
    existing = state.mirrors.get((queue.vhost, queue.name))
    if existing is not None:
        min_insync, promote = existing.min_insync, existing.promote_on_failure
    return DeclareMirror(queue.vhost, queue.name, tuple(queue.members), max(1, min(min_insync, len(queue.members))),
                         promote)


def missing_bootstrap(records: Sequence[Any], state: md.MetadataState) -> list[Any]:
    """The bootstrap definitions (default vhost, users, permissions) the metadata does not hold yet: a node
    adds its configured users to the cluster once, and never overwrites what the cluster already has."""
    missing: list[Any] = []
    for rec in records:
        if isinstance(rec, br.VHostRecord):
            absent = rec.name not in state.vhosts
        elif isinstance(rec, br.UserRecord):
            absent = rec.name not in state.users
        else:
            absent = isinstance(rec, br.PermissionRecord) and (rec.vhost, rec.user) not in state.permissions
        if absent and rec not in missing:
            missing.append(rec)
    return missing
