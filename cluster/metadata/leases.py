"""Ownership leases for work that must run on one node at a time (dynamic shovels, federation links): the records,
the commands and the rules, pure.

What it is for: "each shovel runs on exactly one node" must hold even while nodes disagree about who is up (a
partition, the seconds before a dead node is reported down). So a node runs a shovel only while it holds the
shovel's lease in the metadata group, and a node takes a lease over only after the old holder's lease has
certainly expired. The rule, its timing and the clock assumption are in docs/shovel.md, "Where a shovel runs".

How it works: two maps in the metadata state. `leases`: (component, vhost, name) -> `LeaseRecord` (holder,
generation). `node_leases`: node -> `NodeLeaseRecord` (expires_ms): one expiry per node, renewed by
`RenewNodeLease` (and by every claim), so a node renews all its leases with one write. A lease is valid as long
as its holder's node lease is. `ClaimLease` is a compare-and-set on the generation: accepted when the lease is
free (never claimed, or released), held by the claimer already, or its holder's node lease expired `margin_ms`
before the claimer's `now_ms`; the new generation is the old one + 1. `ReleaseLease` frees a lease its holder no
longer runs. Time comes in as the proposer's wall clock (`now_ms`, taken before the command is sent), so every
replica decides the same; these commands never produce `Change`s (nothing mirrors them; the managers poll).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LeaseKey = tuple[str, str, str]  # component ("shovel", "federation"), vhost, name


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    component: str
    vhost: str
    name: str
    holder: str = ""  # "" = released
    generation: int = 0


@dataclass(frozen=True, slots=True)
class NodeLeaseRecord:
    node: str
    expires_ms: int  # the node's wall clock when it sent its last renewal, + the lease time


@dataclass(frozen=True, slots=True)
class ClaimLease:
    component: str
    vhost: str
    name: str
    node: str
    generation: int  # the generation this claim creates: the current one + 1
    now_ms: int  # the claimer's wall clock, read before sending
    lease_ms: int  # the claimer's node lease is renewed to now_ms + lease_ms
    margin_ms: int  # a lease held elsewhere is taken only once its holder's expiry + margin_ms <= now_ms
    cid: str = ""


@dataclass(frozen=True, slots=True)
class RenewNodeLease:
    node: str
    now_ms: int
    lease_ms: int
    cid: str = ""


@dataclass(frozen=True, slots=True)
class ReleaseLease:
    component: str
    vhost: str
    name: str
    node: str
    generation: int
    cid: str = ""


Leases = Mapping[LeaseKey, LeaseRecord]
NodeLeases = Mapping[str, NodeLeaseRecord]


def lease_key(record: LeaseRecord) -> LeaseKey:
    return (record.component, record.vhost, record.name)


def claim_refusal(leases: Leases, node_leases: NodeLeases, key: LeaseKey, node: str, now_ms: int,
                  margin_ms: int) -> str:
    """Why `node` may not claim `key` at `now_ms` ("" = it may). The model and the claimers use the same rule."""
    current = leases.get(key)
    if current is None or not current.holder or current.holder == node:
        return ""
    held = node_leases.get(current.holder)
    if held is None or held.expires_ms + margin_ms <= now_ms:
        return ""
    return (f"lease {key} is held by {current.holder} (generation {current.generation}) until "
            f"{held.expires_ms} + {margin_ms} ms; now {now_ms}")


def claim(leases: Leases, node_leases: NodeLeases, c: ClaimLease) -> tuple[Leases, NodeLeases, str]:
    """(leases, node leases, refusal): the claim applied, or the maps unchanged and why not."""
    key = (c.component, c.vhost, c.name)
    current = leases.get(key)
    generation = current.generation if current is not None else 0
    if c.generation != generation + 1:
        return leases, node_leases, f"lease {key} is at generation {generation}, not {c.generation - 1}"
    refusal = claim_refusal(leases, node_leases, key, c.node, c.now_ms, c.margin_ms)
    if refusal:
        return leases, node_leases, refusal
    new_leases = dict(leases)
    new_leases[key] = LeaseRecord(c.component, c.vhost, c.name, c.node, c.generation)
    return new_leases, _renewed(node_leases, c.node, c.now_ms + c.lease_ms), ""


def renew(node_leases: NodeLeases, c: RenewNodeLease) -> NodeLeases:
    return _renewed(node_leases, c.node, c.now_ms + c.lease_ms)


def release(leases: Leases, c: ReleaseLease) -> tuple[Leases, str]:
    key = (c.component, c.vhost, c.name)
    current = leases.get(key)
    if current is None or current.holder != c.node or current.generation != c.generation:
        return leases, f"lease {key} is not held by {c.node} at generation {c.generation}"
    new_leases = dict(leases)
    new_leases[key] = LeaseRecord(c.component, c.vhost, c.name, "", c.generation)
    return new_leases, ""


def _renewed(node_leases: NodeLeases, node: str, expires_ms: int) -> NodeLeases:
    current = node_leases.get(node)
    if current is not None and current.expires_ms >= expires_ms:  # a late, older renewal never shortens it
        return node_leases
    new = dict(node_leases)
    new[node] = NodeLeaseRecord(node, expires_ms)
    return new
