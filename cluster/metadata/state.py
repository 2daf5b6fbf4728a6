"""The metadata's state and outcomes as values, and their cbor-able form (cluster.metadata.model applies commands).

What it is for: `MetadataState` is one replica's whole state (nodes, vhosts, users, permissions, exchanges,
bindings, queues, policies, runtime parameters, leases, mirrored-queue records, and the table of command ids
already applied); `Outcome` is what one command did (`Change`s) or why it was refused. `model.apply` maps a state
and a command to the next state and its outcome; this module only defines the values and how they travel.

How it works: the state is immutable (every map copied on write by `model`). `to_plain` / `from_plain` turn records
and commands into cbor-able data (dataclasses carry their type name under "t"; never pickle);
`command_to_dict` / `command_from_dict`, `outcome_to_dict` / `outcome_from_dict` are the wire form of a command
and its outcome (the Raft log of `cluster.metadata.store`, its RPCs), `snapshot` / `restore` the whole state's.
`cluster.metadata.model` re-exports every name here: callers import them from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import cbor2

from cluster.metadata import leases as ls
from cluster.metadata.commands import (
    COMMAND_TYPES,
    RECORD_TYPES,
    BindingRecord,
    Command,
    ExchangeRecord,
    NodeRecord,
    ParameterRecord,
    PermissionRecord,
    PolicyRecord,
    QueueRecord,
    UserRecord,
    VhostRecord,
)
from cluster.metadata.mirror import MirrorRecord

# ---------------------------------------------------------------------------------------------------- outcome


@dataclass(frozen=True, slots=True)
class Change:
    kind: str  # node, vhost, user, permission, exchange, binding, queue, policy, parameter
    key: tuple[str, ...]
    action: str  # created, updated, deleted


@dataclass(frozen=True, slots=True)
class Outcome:
    changes: tuple[Change, ...] = ()
    refused: str = ""  # non-empty: the command was refused and changed nothing
    duplicate: bool = False  # this command id was applied before; this is the first outcome, nothing changed

    @property
    def ok(self) -> bool:
        return not self.refused


# ---------------------------------------------------------------------------------------------------- state

BindingKey = tuple[str, str, str, str, str, bytes]


@dataclass(frozen=True, slots=True)
class MetadataState:
    protocol_version: int = 0  # 0 = no node yet; set by the first AddNode
    nodes: Mapping[str, NodeRecord] = field(default_factory=dict)
    vhosts: Mapping[str, VhostRecord] = field(default_factory=dict)
    users: Mapping[str, UserRecord] = field(default_factory=dict)
    permissions: Mapping[tuple[str, str], PermissionRecord] = field(default_factory=dict)  # (vhost, user)
    exchanges: Mapping[tuple[str, str], ExchangeRecord] = field(default_factory=dict)  # (vhost, name)
    bindings: Mapping[BindingKey, BindingRecord] = field(default_factory=dict)
    queues: Mapping[tuple[str, str], QueueRecord] = field(default_factory=dict)  # (vhost, name)
    policies: Mapping[tuple[str, str], PolicyRecord] = field(default_factory=dict)  # (vhost, name)
    parameters: Mapping[tuple[str, str, str], ParameterRecord] = field(default_factory=dict)  # (vhost, comp., name)
    leases: ls.Leases = field(default_factory=dict)  # (component, vhost, name): who runs it (cluster.metadata.leases)
    node_leases: ls.NodeLeases = field(default_factory=dict)  # node -> its lease expiry
    mirrors: Mapping[tuple[str, str], MirrorRecord] = field(default_factory=dict)  # (vhost, queue): cluster.metadata.mirror
    applied: Mapping[str, Outcome] = field(default_factory=dict)  # command id -> first outcome, oldest first

    def definitions(self) -> dict[str, Any]:
        """The snapshot without the command-id table: what the cluster's definitions are."""
        snap = snapshot(self)
        del snap["applied"]
        return snap


def binding_key(b: BindingRecord) -> BindingKey:
    args = cbor2.dumps(b.arguments, canonical=True)
    return (b.vhost, b.source, b.destination_kind, b.destination, b.routing_key, args)



# ---------------------------------------------------------------------------------------------------- codec

_BY_NAME: dict[str, type] = {t.__name__: t for t in (*COMMAND_TYPES, *RECORD_TYPES)}


def to_plain(obj: Any) -> Any:
    """A record, command or outcome as cbor-able data; dataclasses carry their type under "t"."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {"t": type(obj).__name__}
        for f in fields(obj):
            out[f.name] = to_plain(getattr(obj, f.name))
        return out
    if isinstance(obj, tuple | list):
        return [to_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def from_plain(data: Any) -> Any:
    """The inverse of `to_plain` for records and commands (tuple-typed fields come back as tuples)."""
    if not isinstance(data, dict) or "t" not in data:
        raise ValueError(f"not an encoded record or command: {data!r}")
    cls = _BY_NAME.get(data["t"])
    if cls is None:
        raise ValueError(f"unknown record or command type {data['t']!r}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if isinstance(value, dict) and "t" in value:
            value = from_plain(value)
        elif str(f.type).startswith("tuple") and isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def command_to_dict(command: Command) -> dict[str, Any]:
    result: dict[str, Any] = to_plain(command)
    return result


def command_from_dict(data: Any) -> Command:
    command = from_plain(data)
    if type(command) not in COMMAND_TYPES:  # (model.apply has a handler for each: test_model checks)
        raise ValueError(f"{type(command).__name__} is not a command")
    result: Command = command
    return result


def outcome_to_dict(outcome: Outcome) -> dict[str, Any]:
    return {"changes": [[c.kind, list(c.key), c.action] for c in outcome.changes],
            "refused": outcome.refused, "duplicate": outcome.duplicate}


def outcome_from_dict(data: Mapping[str, Any]) -> Outcome:
    changes = tuple(Change(k, tuple(key), a) for k, key, a in data["changes"])
    return Outcome(changes, data["refused"], data["duplicate"])


def snapshot(state: MetadataState) -> dict[str, Any]:
    """The whole state as cbor-able data (records as lists; the command-id table in order, oldest first)."""
    return {
        "protocol_version": state.protocol_version,
        **{attr: [to_plain(r) for r in getattr(state, attr).values()] for attr in _RECORD_MAPS},
        "applied": [[cid, outcome_to_dict(o)] for cid, o in state.applied.items()],
    }


_RECORD_MAPS: dict[str, Callable[[Any], Any]] = {
    "nodes": lambda r: r.name,
    "vhosts": lambda r: r.name,
    "users": lambda r: r.name,
    "permissions": lambda r: (r.vhost, r.user),
    "exchanges": lambda r: (r.vhost, r.name),
    "bindings": binding_key,
    "queues": lambda r: (r.vhost, r.name),
    "policies": lambda r: (r.vhost, r.name),
    "parameters": lambda r: (r.vhost, r.component, r.name),
    "leases": ls.lease_key,
    "node_leases": lambda r: r.node,
    "mirrors": lambda r: (r.vhost, r.name),
}


def restore(data: Mapping[str, Any]) -> MetadataState:
    maps: dict[str, Any] = {}
    for attr, key_of in _RECORD_MAPS.items():
        records = [from_plain(r) for r in data.get(attr, [])]  # (a map added later is absent from older ones)
        maps[attr] = {key_of(r): r for r in records}
    applied = {cid: outcome_from_dict(o) for cid, o in data["applied"]}
    return MetadataState(protocol_version=data["protocol_version"], applied=applied, **maps)
