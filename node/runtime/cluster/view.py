"""The management API's view of a cluster node (`ClusterView`, a `BrokerView` subclass).

What it is for: `/api/nodes` lists every cluster member with `running` as this node sees it (itself, and peers with
a live Raft connection that are not reported down); `/api/queues` fills each queue's `leader` (the Raft leader this
node knows; null while it knows none) and `members` (the placement's voters) and adds `raft` (this node's
`group_status`: term, commit, applied index...) and `group` (the queue's Raft group id here, incarnation included), so
a test or an operator can see a replica catch up;
`/api/policies` comes from the metadata. `read_barrier` (awaited by the API before a request that reads or changes
definitions) catches this node up with the metadata group first, so those reads see a change just made through
another node (docs/management.md, "Reads see every committed change"). Admin changes (users, vhosts, permissions) go through the broker as on a
single node (deletions too: node/broker/admin_delete.py; a vhost's deletion is the metadata's `DeleteVhost`, which
cascades to what it holds), and their `Persist` effects are replicated through the metadata group before the HTTP answer
(`apply_effects` is async;
a change the metadata refused or did not commit in time is answered 503, and the node keeps its local copy of a
user, vhost or permission change until the next restart mirrors the metadata: noted, not undone). Cluster commands: `set_policy`/`clear_policy` (validated here, 400 if invalid; stored in
the metadata, mirrored into every broker, whose queues' Raft leaders then propose `SetArgs`) and `rebalance`
(`cluster.metadata.placement.rebalance_plan`: `SetQueueLeader`, then a leadership transfer of the queue's group).
Membership: `add_member`, `delete_member`, `grow`, `shrink` change the queue's metadata members (the queue
group's Raft leader then changes the Raft membership to match, `node.clustering.reconcile`); `forget_cluster_node` moves a
down node's memberships away and removes it from the metadata and its group; `join_cluster {node}` (run on the
joining node) and `leave_cluster` change the cluster's members online (`members.py`; docs/cluster.md,
"Metadata membership"). Runtime parameters (shovels) are `SetParameter`/`ClearParameter` in the metadata;
`shovel_owner` picks the node that runs each shovel (docs/shovel.md, "Where a shovel runs").
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from cluster.metadata import model as md
from cluster.metadata import placement
from cluster.metadata.mirror import SyncMirror
from cluster.raft.core.types import NodeId
from node.broker import policies as pol
from node.broker.backend import PublishPath, backend_of
from node.broker.effects import Persist
from node.clustering.incarnations import queue_key
from node.runtime.cluster import members
from node.runtime.management_api import CLUSTER_COMMANDS, CommandError
from node.runtime.management_view import BrokerView

NOT_BUILT = "not built yet in cluster mode"


class ClusterView(BrokerView):
    def __init__(self, cluster: Any, **kwargs: Any) -> None:
        super().__init__(cluster.broker, self._apply_admin_effects, **kwargs)
        self.cluster = cluster

    async def _apply_admin_effects(self, effects: list[Any]) -> None:
        """Persist effects are replicated (and released) before the HTTP answer; the rest dispatched. A change the
        metadata group refused or did not commit in time is answered 503 with the reason, not 2xx."""
        rest: list[Any] = []
        failure: tuple[int, str] | None = None
        for effect in effects:
            if isinstance(effect, Persist):
                failure = failure or await self.cluster.replicate_now(effect.records)
                rest.extend(self.broker.on_persisted(effect.token))
            else:
                rest.append(effect)
        self.cluster.dispatch(rest)
        if failure is not None:
            raise CommandError(503, f"not committed by the cluster: {failure[1]}")

    # --- reads ----------------------------------------------------------------------------------------------

    async def read_barrier(self) -> bool:
        """Before a management request that reads or changes definitions (management_api.needs_read_barrier):
        `ClusterRuntime.catch_up_definitions`, so a GET through this node sees a change just made through another,
        as RabbitMQ's (Mnesia) does. False when it timed out (no metadata majority): the request is answered from
        what this node has."""
        return bool(await self.cluster.catch_up_definitions())

    def nodes(self) -> list[dict[str, Any]]:
        cluster = self.cluster
        own = super().nodes()[0]
        connected = cluster.raft.connected_peers() if cluster.raft is not None else frozenset()
        rows = []
        for name in cluster.layout.names:
            if name == cluster.name:
                own["metadata"] = cluster.store.status() if cluster.store is not None else {}
                rows.append(own)
                continue
            running = name in connected and name not in cluster.liveness.down
            rows.append({"name": name, "type": "disc", "running": running, "being_drained": False,
                         "partitions": [], "mem_alarm": False, "disk_free_alarm": False})
        return rows

    def queue_row(self, queue: Any) -> dict[str, Any]:
        row = super().queue_row(queue)
        cluster = self.cluster
        record = cluster.mirrored.queues.get((queue.vhost, queue.name))
        group = cluster.group_queues.group_of(queue_key(queue.vhost, queue.name))
        leader = None
        raft: dict[str, Any] = {}
        if cluster.raft is not None and group is not None:
            leader = cluster.raft.leader_of(group)
            try:
                raft = cluster.raft.group_status(group)
            except KeyError:
                raft = {}
        row["leader"] = leader  # the Raft leader this node knows; None while the group has none
        row["members"] = list(record.members) if record is not None else []
        row["metadata_leader"] = record.leader if record is not None else None
        row["node"] = leader if leader is not None else (record.leader if record is not None else None)
        row["raft"] = raft
        row["group"] = group  # the queue's Raft group id on this node (incarnation included); None while it has none
        status = cluster.mirror.status(group) if cluster.mirror is not None and group is not None else None
        if status is not None:  # a mirrored queue (mirror_groups.py): its leader, epoch, ISR, HW and LEOs
            followers = [n for n in status["replicas"] if n != status["leader"]]
            row.update({"leader": status["leader"], "node": status["leader"] or row["node"], "mirror": status,
                        "epoch": status["epoch"], "isr": status["isr"], "hw": status["hw"],
                        "slave_nodes": followers,
                        "synchronised_slave_nodes": [n for n in followers if n in status["isr"]]})
        return row

    def raft_groups(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(vhost, queue, `group_status`) of every queue group hosted here (the Prometheus raft metrics)."""
        cluster = self.cluster
        if cluster.raft is None:
            return []
        rows = []
        for vhost_name, vhost in self.broker.vhosts.items():
            for name in vhost.queues:
                group = cluster.group_queues.group_of(queue_key(vhost_name, name))
                if group is None:
                    continue
                try:
                    rows.append((vhost_name, name, cluster.raft.group_status(group)))
                except KeyError:
                    continue
        return rows

    def mirror_statuses(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(vhost, queue, mirror status) of each mirrored queue hosted here (node/runtime/cluster/mirror_groups.py)."""
        cluster = self.cluster
        if cluster.mirror is None:
            return []
        rows = []
        for group in list(cluster.mirror.groups):
            key = cluster.group_queues.get(group)
            status = cluster.mirror.status(group)
            if key is not None and status is not None:
                rows.append((key[0], key[1], status))
        return rows

    def peers(self) -> list[tuple[str, int]]:
        """(host, management port) of the other members, for the cluster-wide connection/channel/consumer lists."""
        return [(m.host, m.management_port) for m in self.cluster.layout.peers]

    def remote_queue_owners(self) -> dict[tuple[str, str], tuple[str, int]]:
        """(vhost, queue) -> (host, management port) of the node holding each exclusive queue a connection of
        another node owns (this node has an empty stand-in: node/runtime/management_queue_rows.py asks the owner)."""
        endpoints = {m.name: (m.host, m.management_port) for m in self.cluster.layout.peers}
        owners = {}
        for vhost_name, vhost in self.broker.vhosts.items():
            for name, queue in vhost.queues.items():
                if queue.backend is None or backend_of(queue).publish_path is not PublishPath.FORWARD:
                    continue  # (this node holds it)
                record = self.cluster.mirrored.queues.get((vhost_name, name))
                if record is not None and record.leader in endpoints:
                    owners[(vhost_name, name)] = endpoints[record.leader]
        return owners

    def policies(self) -> list[dict[str, Any]]:
        return [{"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
                 "definition": p.definition, "priority": p.priority}
                for _, p in sorted(self.cluster.mirrored.policies.items())]

    def _parameters_state(self) -> Any:
        return self.cluster.store.state.parameters if self.cluster.store is not None else {}

    def parameters(self) -> list[dict[str, Any]]:
        return [{"vhost": p.vhost, "component": p.component, "name": p.name, "value": json.loads(p.value)}
                for _, p in sorted(self._parameters_state().items())]

    def stored_shovels(self) -> dict[tuple[str, str], str]:
        return {(p.vhost, p.name): p.value for p in self._parameters_state().values() if p.component == "shovel"}

    def shovel_owner(self, vhost: str, name: str) -> str | None:
        """The node that should run the shovel (or federation link; the lease decides which node does,
        cluster/link/ownership.py): among the nodes not reported down here (`PeerLiveness`: no Raft link for
        `node_down_after_ms`, or refusing connections; a peer not connected yet after a start counts as up, so a
        restarted node does not take every shovel before its links are up), the highest rendezvous hash of
        (node, vhost, name); every node that sees the same nodes down picks the same one."""
        cluster = self.cluster
        up = [n for n in cluster.layout.names if n == cluster.name or n not in cluster.liveness.down]
        return max(up, key=lambda n: hashlib.sha256(f"{n}\0{vhost}\0{name}".encode()).digest(), default=None)

    async def set_parameter(self, component: str, vhost: str, name: str, value_json: str) -> bool:
        created = (vhost, component, name) not in self._parameters_state()
        await self._metadata(md.SetParameter(md.ParameterRecord(vhost, component, name, value_json)))
        return created

    async def clear_parameter(self, component: str, vhost: str, name: str) -> bool:
        if (vhost, component, name) not in self._parameters_state():
            return False
        await self._metadata(md.ClearParameter(vhost, component, name))
        return True

    # --- changes --------------------------------------------------------------------------------------------

    async def run_command(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name == "set_policy":
            return await self._set_cluster_policy(args)
        if name == "clear_policy":
            if (args["vhost"], args["name"]) not in self.cluster.mirrored.policies:
                raise CommandError(404, f"no policy {args['name']!r} in vhost {args['vhost']!r}")
            await self._metadata(md.ClearPolicy(args["vhost"], args["name"]))
            return {}
        if name == "delete_vhost":  # the metadata cascades (queues, exchanges, ...); every node's mirror follows
            if args["name"] not in self.cluster.mirrored.vhosts:
                raise CommandError(404, "Not Found")
            await self._metadata(md.DeleteVhost(args["name"]))
            return {}
        if name == "rebalance":
            return {"moved": await self._rebalance(args)}
        if name in ("sync_queue", "cancel_sync_queue"):
            return await self._sync_queue(name, args["vhost"], args["queue"])
        if name in MEMBER_COMMANDS:
            return await MEMBER_COMMANDS[name](self, args)
        if name in CLUSTER_COMMANDS:
            raise CommandError(501, f"{name}: {NOT_BUILT}")
        return await super().run_command(name, args)

    async def _set_cluster_policy(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            policy = pol.make_policy(args["vhost"], args["name"], args["pattern"], args.get("apply_to"),
                                     args["definition"], args.get("priority"))
        except pol.PolicyError as exc:
            raise CommandError(400, str(exc)) from None
        created = (policy.vhost, policy.name) not in self.cluster.mirrored.policies
        await self._metadata(md.SetPolicy(md.PolicyRecord(
            vhost=policy.vhost, name=policy.name, pattern=policy.pattern, apply_to=policy.apply_to,
            definition=dict(policy.definition), priority=policy.priority)))
        return {"created": created}

    # --- membership -----------------------------------------------------------------------------------------

    def _known_node(self, node: str) -> None:
        if node not in self.cluster.layout.names:
            raise CommandError(404, f"no node {node!r} in the cluster {list(self.cluster.layout.names)}")

    def _queue(self, vhost: str, queue: str) -> md.QueueRecord:
        record: md.QueueRecord | None = self.cluster.mirrored.queues.get((vhost, queue))
        if record is None:
            raise CommandError(404, f"no queue {queue!r} in vhost {vhost!r}")
        return record

    def _members_now(self, record: md.QueueRecord) -> list[str]:
        """The members in this node's metadata replica (which has applied the command just committed)."""
        now = self.cluster.store.state.queues.get((record.vhost, record.name))
        return list(now.members) if now is not None else []

    async def _add_member(self, args: dict[str, Any]) -> dict[str, Any]:
        self._known_node(args["node"])
        record = self._queue(args["vhost"], args["queue"])
        await self._metadata(md.AddQueueMember(record.vhost, record.name, args["node"]))
        return {"members": self._members_now(record)}

    async def _delete_member(self, args: dict[str, Any]) -> dict[str, Any]:
        record = self._queue(args["vhost"], args["queue"])
        await self._metadata(md.RemoveQueueMember(record.vhost, record.name, args["node"]))
        return {"members": self._members_now(record)}

    async def _grow(self, args: dict[str, Any]) -> dict[str, Any]:
        """Add `node` to every matching quorum queue (strategy "all"), or only to those with an even number of
        members ("even"), as `rabbitmq-queues grow`."""
        node, strategy = args["node"], args["strategy"]
        if strategy not in ("all", "even"):
            raise CommandError(400, f"strategy must be all or even, not {strategy!r}")
        self._known_node(node)
        grown = []
        for record in self._matching_quorum_queues(args):
            if node in record.members or (strategy == "even" and len(record.members) % 2):
                continue
            await self._metadata(md.AddQueueMember(record.vhost, record.name, node))
            grown.append({"vhost": record.vhost, "queue": record.name})
        return {"grown": grown}

    async def _shrink(self, args: dict[str, Any]) -> dict[str, Any]:
        """Remove `node` from every quorum queue's members (a queue whose only member it is stays)."""
        node = args["node"]
        shrunk, skipped = [], []
        for record in self._matching_quorum_queues({}):
            if node not in record.members:
                continue
            if record.members == (node,):
                skipped.append({"vhost": record.vhost, "queue": record.name, "reason": "last member"})
                continue
            await self._metadata(md.RemoveQueueMember(record.vhost, record.name, node))
            shrunk.append({"vhost": record.vhost, "queue": record.name})
        return {"shrunk": shrunk, "skipped": skipped}

    def _matching_quorum_queues(self, args: dict[str, Any]) -> list[md.QueueRecord]:
        vhost_pattern, queue_pattern = args.get("vhost_pattern") or "*", args.get("queue_pattern") or "*"
        return [q for _, q in sorted(self.cluster.mirrored.queues.items())
                if q.type == "quorum" and fnmatch.fnmatchcase(q.vhost, vhost_pattern)
                and fnmatch.fnmatchcase(q.name, queue_pattern)]

    async def _forget_cluster_node(self, args: dict[str, Any]) -> dict[str, Any]:
        """Forget a node that is down: its queue memberships move to other up nodes
        (`placement.evacuation_plan`), `RemoveNode(force)` drops what could not move (a queue whose only member
        it was is deleted, as `rabbitmqctl forget_cluster_node`), then it leaves the metadata group
        (`members.forget`)."""
        node = args["node"]
        cluster = self.cluster
        if node == cluster.name:
            raise CommandError(400, "a node cannot forget itself; run forget_cluster_node on another node")
        if node not in cluster.mirrored.nodes:
            raise CommandError(404, f"no node {node!r} in the cluster metadata")
        connected = cluster.raft.connected_peers() if cluster.raft is not None else frozenset()
        if node in connected:
            raise CommandError(409, f"node {node} is running; stop it before forgetting it")
        return await _membership(members.forget(cluster, node))

    async def _join_cluster(self, args: dict[str, Any]) -> dict[str, Any]:
        """Run on the joining node (as `rabbitmqctl join_cluster`): `node` is a member to join through
        (`rabbit@host`, `host:amqp_port`, or a `cluster_nodes` entry `name=host:amqp[:raft[:metadata]]`)."""
        return await _membership(members.join(self.cluster, args["node"]))

    async def _leave_cluster(self, args: dict[str, Any]) -> dict[str, Any]:
        """This node leaves: queue memberships moved away, removed from the metadata and its group, then it stops."""
        return await _membership(members.leave(self.cluster))

    async def _sync_queue(self, name: str, vhost: str, queue: str) -> dict[str, Any]:
        """ha-sync-mode manual: `sync_queue` releases every held-out mirror (`SyncMirror`: they join the ISR once
        they fetched up to the leader's log end, at once as they hold the whole log); `cancel_sync_queue` has no
        sync to stop (a sync here is only a permission), as RabbitMQ's answer for a queue not syncing."""
        record = self.cluster.mirrored.mirrors.get((vhost, queue))
        if record is None:
            return {"mirrored": False}
        if name == "cancel_sync_queue":
            return {"mirrored": True, "syncing": False}
        if record.held_out:
            await self._metadata(SyncMirror(vhost, queue))
        return {"mirrored": True, "synchronised": sorted(record.held_out)}

    async def _metadata(self, command: md.Command) -> md.Outcome:
        outcome: md.Outcome | None = await self.cluster.apply_definition(command)
        if outcome is None:
            raise CommandError(503, "the metadata group did not commit the change in time (outcome unknown)")
        if not outcome.ok:
            raise CommandError(400, outcome.refused)
        return outcome

    async def _rebalance(self, args: dict[str, Any]) -> list[dict[str, str]]:
        kind = args.get("type") or "all"
        vhost_pattern, queue_pattern = args.get("vhost_pattern") or "*", args.get("queue_pattern") or "*"
        state = self.cluster.mirrored
        moved = []
        for vhost, queue, leader in placement.rebalance_plan(state):
            record = state.queues.get((vhost, queue))
            if record is None or (kind != "all" and record.type != kind):
                continue
            if not (fnmatch.fnmatchcase(vhost, vhost_pattern) and fnmatch.fnmatchcase(queue, queue_pattern)):
                continue
            await self._metadata(md.SetQueueLeader(vhost, queue, leader))
            group = self.cluster.group_queues.group_of(queue_key(vhost, queue))
            if self.cluster.raft is not None and group is not None:
                self.cluster.raft.transfer_leadership(group, NodeId(leader))
            moved.append({"vhost": vhost, "queue": queue, "leader": leader})
        return moved


async def _membership(work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    try:
        return await work
    except members.MembershipError as exc:
        raise CommandError(exc.status, exc.reason) from None


MEMBER_COMMANDS: dict[str, Callable[[ClusterView, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "add_member": ClusterView._add_member, "delete_member": ClusterView._delete_member,
    "grow": ClusterView._grow, "shrink": ClusterView._shrink,
    "forget_cluster_node": ClusterView._forget_cluster_node, "join_cluster": ClusterView._join_cluster,
    "leave_cluster": ClusterView._leave_cluster,
}
