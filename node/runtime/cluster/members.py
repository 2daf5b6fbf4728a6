"""Cluster membership in the runtime: online join/leave/forget, and quorum member replacement.

What it is for:
- Online membership (docs/cluster.md, "Metadata membership"). The cluster's nodes are what the metadata says
  (node records + the metadata group, `cluster.metadata.membership.cluster_endpoints`), not the static
  `cluster_nodes`. `watch_membership` (started by `ClusterRuntime.run`) polls every `MEMBERSHIP_POLL_S`: it records
  this node's endpoints if the metadata lacks them and brings the runtime's `layout` (queue group learners,
  reconciliation, `/api/nodes`), placement, liveness and the queue Raft transport's peers in step. `join` (run on a
  lone node: two-phase admission through a member, then its metadata store is replaced by a member of the cluster's
  group), `leave` (queue memberships moved away, removed from the metadata and the group, marked left, stopped) and
  `forget` (a dead node: moved, removed from the metadata and the group) back `raftmq ctl`; refusals raise
  `MembershipError(status, reason)`, which the management view answers with.
- Member replacement: when a quorum queue's member has been down (no Raft connection, `PeerLiveness`) for
  `member_replace_after_ms`, the metadata leader asks `cluster.metadata.placement.replacement_plan` which up node
  replaces it (one member per queue at a time, and only while the queue still has a live majority, so the change
  can commit), and records the new member list (`SetQueueMembers`). The Raft side follows like every other member
  change (`node.clustering.reconcile`: the new node is promoted once caught up, then the old one removed, kept a learner).

How it works: the runtime object is duck-typed (`ClusterRuntime`); `_add_raft_peer` / `_remove_raft_peer` use the
Raft transport's `add_peer` / `remove_peer` and run its dial loop (`dial_forever`) for a peer this node dials
under a cancel scope of ours.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from functools import partial
from typing import Any

import trio

from cluster.metadata import membership as mb
from cluster.metadata import model as md
from cluster.metadata import placement
from cluster.metadata.secret import ClusterSecretError
from cluster.metadata.store import JoinRefused, MetadataError, MetadataStore, MetadataTimeout
from cluster.raft.core.types import NodeId
from node.clustering.definitions import client_local_placement
from node.runtime.config import ClusterLayout, ClusterMember
from node.runtime.dispatch import wall_ms

log = logging.getLogger("raftmq.cluster")


async def replace_member(runtime: Any, vhost: str, queue: str, old: str, new: str) -> bool:
    """Record `new` instead of `old` among the queue's members (the Raft change follows). True when committed."""
    record = runtime.store.state.queues.get((vhost, queue))
    if record is None or old not in record.members or new in record.members:
        return False
    log.warning("cluster: queue %s/%s: replacing member %s (down) with %s", vhost, queue, old, new)
    members = tuple(new if m == old else m for m in record.members)
    outcome = await runtime.apply_definition(md.SetQueueMembers(vhost, queue, members))
    return outcome is not None and outcome.ok


# ---------------------------------------------------------------------------------------------------- membership
# Online membership of the cluster (docs/cluster.md, "Metadata membership"): the cluster's nodes follow the
# metadata (node records + the pysyncobj group, `cluster.metadata.membership.cluster_endpoints`) instead of the
# static `cluster_nodes`; `watch_membership` keeps the runtime's layout, placement, liveness and Raft peers in step,
# `join` / `leave` / `forget` are the operator commands behind `raftmq ctl`.

MEMBERSHIP_POLL_S = 0.5
ENDPOINTS_RECORD_INTERVAL_S = 5.0  # at most one AddNode (own endpoints) attempt this often
LEAVE_QUEUES_WAIT_S = 30.0  # leave_cluster: how long to wait for the queue groups to drop this node as a voter
STOP_AFTER_LEAVE_S = 0.5  # the HTTP answer leaves before the node stops
JOIN_ADD_TIMEOUT_S = 60.0  # join_cluster: how long the seed may take to add this node to the metadata group
NEW_PEER_GRACE_MS = 10_000  # a peer added while running is not reported down before this (plus node_down_after_ms)


def own_endpoints(runtime: Any) -> mb.NodeEndpoints:
    me = runtime.layout.me
    return mb.NodeEndpoints(me.name, me.host, me.amqp_port, me.raft_port, me.metadata_port, me.management_port)


def _configured(runtime: Any) -> tuple[mb.NodeEndpoints, ...]:
    """The `cluster_nodes` entries (the layout the node was started with; remembered on first use)."""
    configured: tuple[mb.NodeEndpoints, ...] | None = getattr(runtime, "configured_endpoints", None)
    if configured is None:
        configured = tuple(mb.NodeEndpoints(m.name, m.host, m.amqp_port, m.raft_port, m.metadata_port,
                                            m.management_port) for m in runtime.layout.members)
        runtime.configured_endpoints = configured
    return configured


def desired_layout(runtime: Any, store: MetadataStore) -> ClusterLayout | None:
    """The layout the metadata says (None while the store has no member list: stopped or starting)."""
    group = store.members()
    if not group:
        return None
    configured = _configured(runtime)
    me = own_endpoints(runtime)
    nodes = mb.cluster_endpoints(store.state.nodes, configured, group, me)
    members = tuple(ClusterMember(e.name, e.host, e.amqp_port, e.raft_port, e.metadata_port, e.management_port)
                    for e in nodes)
    return ClusterLayout(runtime.name, members, runtime.layout.secret)


def apply_layout(runtime: Any, layout: ClusterLayout, now_ms: int) -> None:
    """Make the runtime use `layout`: names (group memberships, reconciliation, /api/nodes), placement, liveness
    and the Raft transport's peers."""
    old = {m.name: m for m in runtime.layout.members}
    new = {m.name: m for m in layout.members}
    added = sorted(n for n in new if n not in old or _raft_address(old[n]) != _raft_address(new[n]))
    removed = sorted(n for n in old if n not in new)
    runtime.layout = layout
    runtime.place = client_local_placement(runtime.name, runtime.config.quorum_initial_group_size, layout.names)
    liveness = runtime.liveness
    liveness.peers = tuple(p.name for p in layout.peers)
    for name in added:  # a new peer gets NEW_PEER_GRACE_MS + node_down_after_ms to connect (a joining node
        liveness._last_seen_ms[name] = now_ms + NEW_PEER_GRACE_MS  # restarts its metadata store first)
    for name in removed:
        liveness.down.discard(name)
        liveness.down_since_ms.pop(name, None)
        liveness._last_seen_ms.pop(name, None)
    if added or removed:
        log.warning("cluster: members now %s (added %s, removed %s)", list(layout.names), added, removed)
    if runtime.raft is not None:
        for name in added:
            if name != runtime.name:
                _add_raft_peer(runtime, NodeId(name), _raft_address(new[name]))
        for name in removed:
            _remove_raft_peer(runtime, NodeId(name))


def _raft_address(member: ClusterMember) -> tuple[str, int]:
    return (member.host, member.raft_port)


def _add_raft_peer(runtime: Any, peer: NodeId, address: tuple[str, int]) -> None:
    """Teach the Raft transport a peer while it runs; the dialing side's dial loop runs in the cluster runtime's
    nursery under a cancel scope of ours."""
    transport = runtime.raft.transport
    transport.add_peer(peer, address)
    dialers: dict[NodeId, trio.CancelScope] = runtime.__dict__.setdefault("membership_dialers", {})
    nursery = runtime._metadata_tasks
    if transport.dials(peer) and nursery is not None:
        if peer in dialers:
            dialers.pop(peer).cancel()
        scope = dialers[peer] = trio.CancelScope()
        nursery.start_soon(_dial, transport, peer, scope)


async def _dial(transport: Any, peer: NodeId, scope: trio.CancelScope) -> None:
    with scope:
        await transport.dial_forever(peer)


def _remove_raft_peer(runtime: Any, peer: NodeId) -> None:
    """Forget a peer: inbound connections from it are refused from now on, ours is closed and not redialed (a
    statically configured peer's dial loop keeps trying its old address: harmless, nothing listens there)."""
    dialers: dict[NodeId, trio.CancelScope] = runtime.__dict__.get("membership_dialers", {})
    if peer in dialers:
        dialers.pop(peer).cancel()
    runtime.raft.transport.remove_peer(peer)


def adopt_metadata_layout(runtime: Any) -> None:
    """At start, once the metadata store runs and before the Raft runtime and any queue group exist: use the
    metadata's members. A queue group's stored log is replayed on top of the membership its node declares it with
    (`_membership`, from the layout), so a node whose `cluster_nodes` is stale (a joined node lists only itself)
    would otherwise declare wrong voters and could even elect itself alone."""
    store: MetadataStore | None = runtime.store
    layout = None if store is None else desired_layout(runtime, store)
    if layout is not None and layout.members != runtime.layout.members:
        apply_layout(runtime, layout, wall_ms())


async def watch_membership(runtime: Any) -> None:
    """Every MEMBERSHIP_POLL_S: record this node's endpoints if the metadata lacks them, and bring the runtime's
    layout in step with the metadata. Started by `ClusterRuntime.run`."""
    last_recorded = -ENDPOINTS_RECORD_INTERVAL_S
    while True:
        try:
            store: MetadataStore | None = runtime.store
            if store is not None and store.members():
                me = own_endpoints(runtime)
                record = store.state.nodes.get(runtime.name)
                if mb.record_needs_endpoints(record, me) and trio.current_time() - last_recorded >= \
                        ENDPOINTS_RECORD_INTERVAL_S:
                    last_recorded = trio.current_time()
                    runtime._metadata_tasks.start_soon(runtime.apply_definition,
                                                       mb.add_node_command(me, store.config.version))
                layout = desired_layout(runtime, store)
                if layout is not None and layout.members != runtime.layout.members:
                    apply_layout(runtime, layout, wall_ms())
        except Exception:
            log.exception("cluster: membership watch failed")
        await trio.sleep(MEMBERSHIP_POLL_S)


# ---------------------------------------------------------------------------------------------------- join


class MembershipError(Exception):
    """A join/leave/forget refused: `status` is the HTTP status the management API answers with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def join(runtime: Any, seed_text: str) -> dict[str, Any]:
    """Join the cluster of the node at `seed_text` (this node must be alone and hold no queues: its own
    definitions are replaced by the cluster's, as `rabbitmqctl join_cluster` after a reset)."""
    store: MetadataStore = runtime.store
    try:
        seed = mb.parse_seed(seed_text)
    except ValueError as exc:
        raise MembershipError(400, str(exc)) from None
    me = own_endpoints(runtime)
    others = [a for a in store.members() if a != me.metadata_address]
    if others:
        if seed in others:
            return {"node": runtime.name, "joined": True, "already_member": True, "members": list(runtime.layout.names)}
        raise MembershipError(409, f"{runtime.name} is already in a cluster with {len(others)} other node(s); "
                                   "leave_cluster first")
    if store.state.queues:
        raise MembershipError(409, f"{runtime.name} holds {len(store.state.queues)} queue(s); a joining node must be "
                                   "empty (its definitions are replaced by the cluster's): delete them, or reset it")
    request = mb.JoinRequest(me, store.config.version)
    secret = runtime.layout.secret
    try:
        members = await MetadataStore.request_join(seed, secret, request, mb.JOIN_PHASE_RECORD)
    except ClusterSecretError as exc:
        raise MembershipError(403, f"cannot join through {seed}: {exc}") from None
    except JoinRefused as exc:
        raise MembershipError(409, f"the cluster refused {runtime.name}: {exc}") from None
    except MetadataTimeout as exc:
        raise MembershipError(504, str(exc)) from None
    log.warning("cluster: %s recorded by the cluster through %s (metadata group %s); restarting the metadata store "
                "as a member", runtime.name, seed, list(members))
    await _become_member(runtime, store, seed, request, members)
    return {"node": runtime.name, "joined": True, "through": seed, "members": list(runtime.layout.names)}


async def _become_member(runtime: Any, old: MetadataStore, seed: str, request: mb.JoinRequest,
                         members: tuple[str, ...]) -> None:
    """Replace this node's lone metadata store by a member of the cluster's group: stop it (keeping its watchers
    until the swap), reset its data, start the new one with the group as partners while the seed adds this node
    to the group (pysyncobj's procedure), bring the layout in step, then swap (the runtime's metadata watcher
    re-watches the new store and mirrors the cluster's definitions)."""
    me = request.endpoints
    partners = tuple(m for m in members if m != me.metadata_address)
    config = dataclasses.replace(old.config, peers=partners, endpoints=me)
    ticking = old.syncobj_for_shutdown()
    old.stop_replication()
    await trio.to_thread.run_sync(_wait_stopped, ticking)
    data_dir = config.data_dir
    if data_dir is not None:
        await trio.to_thread.run_sync(lambda: shutil.rmtree(data_dir, ignore_errors=True))
    new = MetadataStore(config)
    new.write_members_cache(mb.MembersCache((*partners, me.metadata_address)))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(MetadataStore.request_join, seed, runtime.layout.secret, request,
                                       mb.JOIN_PHASE_ADD, timeout_s=JOIN_ADD_TIMEOUT_S))
            await new.start()
    except* (MetadataError, ClusterSecretError) as group:
        log.error("cluster: %s: joining the metadata group failed: %s", runtime.name, group.exceptions)
        new.close()
        raise MembershipError(503, f"recorded by the cluster, but joining its metadata group failed "
                                   f"({group.exceptions[0]}); forget_cluster_node {runtime.name} on a member, reset "
                                   "this node and join again") from None
    layout = desired_layout(runtime, new)
    runtime.store = new
    if layout is not None:
        apply_layout(runtime, layout, wall_ms())
    old.close()


def _wait_stopped(syncobj: Any) -> None:
    deadline = time.monotonic() + 5.0
    while syncobj is not None and syncobj.tick_thread_alive() and time.monotonic() < deadline:
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------------- leave, forget


async def evacuate(runtime: Any, node: str) -> list[dict[str, Any]]:
    """Move every queue membership of `node` to other up nodes (`placement.evacuation_plan`), as recorded
    `SetQueueMembers`; the queue groups' Raft leaders then change the Raft memberships."""
    moved = []
    for vhost, queue, _, new in placement.evacuation_plan(runtime.store.state, node):
        record = runtime.store.state.queues.get((vhost, queue))
        if record is None:
            continue
        members = tuple(m for m in record.members if m != node) + ((new,) if new else ())
        await _metadata(runtime, md.SetQueueMembers(vhost, queue, members))
        moved.append({"vhost": vhost, "queue": queue, "to": new or None})
    return moved


async def _metadata(runtime: Any, command: md.Command) -> md.Outcome:
    outcome: md.Outcome | None = await runtime.apply_definition(command)
    if outcome is None:
        raise MembershipError(503, "the metadata group did not commit the change in time (outcome unknown)")
    if not outcome.ok:
        raise MembershipError(400, outcome.refused)
    return outcome


async def _wait_not_voter(runtime: Any, timeout_s: float) -> list[str]:
    """Wait (bounded) until no queue group this node knows has it as a voter; the groups that still do."""
    me = NodeId(runtime.name)

    def still_voter() -> list[str]:
        if runtime.raft is None:
            return []
        found = []
        for group in list(runtime.group_queues):
            membership = runtime.raft.membership_of(group)
            if membership is not None and me in membership.voters:
                found.append(str(group))
        return found

    with trio.move_on_after(timeout_s):
        while still_voter():
            await trio.sleep(MEMBERSHIP_POLL_S)
    return still_voter()


async def leave(runtime: Any) -> dict[str, Any]:
    """This node leaves the cluster: its queue memberships move away (and the queue groups drop it as a voter),
    it is removed from the metadata (`RemoveNode`) and then from the metadata group, it marks its data as left,
    and it stops."""
    store: MetadataStore = runtime.store
    me = own_endpoints(runtime)
    if not [a for a in store.members() if a != me.metadata_address]:
        raise MembershipError(409, f"{runtime.name} is not in a cluster with other nodes")
    moved = await evacuate(runtime, runtime.name)
    still_voter = await _wait_not_voter(runtime, LEAVE_QUEUES_WAIT_S)
    if still_voter:
        log.warning("cluster: leaving while still a voter of %s (their leaders will drop it)", still_voter)
    try:
        await store.transfer_leadership_away()
        await _metadata(runtime, md.RemoveNode(runtime.name, force=True))
        await store.request_removal()
    except MetadataTimeout as exc:
        raise MembershipError(504, f"leave_cluster incomplete: {exc}; run it again") from None
    store.mark_left()
    log.warning("cluster: %s left the cluster; stopping", runtime.name)
    runtime._metadata_tasks.start_soon(_stop_soon, runtime)
    return {"node": runtime.name, "left": True, "moved": moved, "still_voter": still_voter}


async def _stop_soon(runtime: Any) -> None:
    await trio.sleep(STOP_AFTER_LEAVE_S)
    runtime.node.request_stop()


async def forget(runtime: Any, node: str) -> dict[str, Any]:
    """Forget a node that is down: its queue memberships move, it is removed from the metadata (`RemoveNode`,
    force: a queue whose only member it was is deleted) and from the metadata group."""
    store: MetadataStore = runtime.store
    record = store.state.nodes.get(node)
    if record is None:
        raise MembershipError(404, f"no node {node!r} in the cluster metadata")
    moved = await evacuate(runtime, node)
    await _metadata(runtime, md.RemoveNode(node, force=True))
    if record.address in store.members():
        try:
            await store.change_member("remove", record.address)
        except MetadataError as exc:
            raise MembershipError(504, f"{node} removed from the metadata, not yet from its group: {exc}; "
                                       "run forget_cluster_node again") from None
    return {"moved": moved, "removed_from_group": record.address}
