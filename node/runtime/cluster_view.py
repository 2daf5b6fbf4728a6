"""The management API's view of a cluster node (`ClusterView`, a `BrokerView` subclass).

What it is for: `/api/nodes` lists every cluster member with `running` as this node sees it (itself, and peers with
a live Raft connection that are not reported down); `/api/queues` fills each queue's `leader` (the Raft leader this
node knows, else the placement's) and `members` (the placement's voters) and adds `raft` (this node's
`group_status`: term, commit, applied index...), so a test or an operator can see a replica catch up;
`/api/policies` comes from the metadata. Admin changes (users, vhosts, permissions) go through the broker as on a
single node, and their `Persist` effects are replicated through the metadata group before the HTTP answer
(`apply_effects` is async). Cluster commands: `set_policy`/`clear_policy` (stored in the metadata; the broker does
not apply policies yet) and `rebalance` (`cluster.metadata.placement.rebalance_plan`: `SetQueueLeader`, then a
leadership transfer of the queue's group). The other membership commands answer 501 (not built).
"""

from __future__ import annotations

import fnmatch
from typing import Any

from cluster.metadata import model as md
from cluster.metadata import placement
from cluster.queue.replicated_codec import queue_group_id
from cluster.raft.core.types import GroupId, NodeId
from node.broker.effects import Persist
from node.runtime.management_api import CLUSTER_COMMANDS, CommandError
from node.runtime.management_view import BrokerView

NOT_BUILT = "not built yet in cluster mode"


class ClusterView(BrokerView):
    def __init__(self, cluster: Any, **kwargs: Any) -> None:
        super().__init__(cluster.broker, self._apply_admin_effects, **kwargs)
        self.cluster = cluster

    async def _apply_admin_effects(self, effects: list[Any]) -> None:
        """Persist effects are replicated (and released) before the HTTP answer; the rest dispatched."""
        rest: list[Any] = []
        for effect in effects:
            if isinstance(effect, Persist):
                await self.cluster.replicate_now(effect.records)
                rest.extend(self.broker.on_persisted(effect.token))
            else:
                rest.append(effect)
        self.cluster.dispatch(rest)

    # --- reads ----------------------------------------------------------------------------------------------

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
        group = GroupId(queue_group_id(queue.vhost, queue.name))
        leader = None
        raft: dict[str, Any] = {}
        if cluster.raft is not None:
            leader = cluster.raft.leader_of(group)
            try:
                raft = cluster.raft.group_status(group)
            except KeyError:
                raft = {}
        row["leader"] = leader or (record.leader if record is not None else None)
        row["members"] = list(record.members) if record is not None else []
        row["node"] = row["leader"]
        row["raft"] = raft
        return row

    def policies(self) -> list[dict[str, Any]]:
        return [{"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
                 "definition": p.definition, "priority": p.priority}
                for _, p in sorted(self.cluster.mirrored.policies.items())]

    # --- changes --------------------------------------------------------------------------------------------

    async def run_command(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name == "set_policy":
            created = (args["vhost"], args["name"]) not in self.cluster.mirrored.policies
            await self._metadata(md.SetPolicy(md.PolicyRecord(
                vhost=args["vhost"], name=args["name"], pattern=args["pattern"],
                apply_to=args.get("apply_to") or "all", definition=dict(args["definition"]),
                priority=int(args.get("priority") or 0))))
            return {"created": created}
        if name == "clear_policy":
            await self._metadata(md.ClearPolicy(args["vhost"], args["name"]))
            return {}
        if name == "rebalance":
            return {"moved": await self._rebalance(args)}
        if name in CLUSTER_COMMANDS:
            raise CommandError(501, f"{name}: {NOT_BUILT}")
        return await super().run_command(name, args)

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
            if self.cluster.raft is not None:
                self.cluster.raft.transfer_leadership(GroupId(queue_group_id(vhost, queue)), NodeId(leader))
            moved.append({"vhost": vhost, "queue": queue, "leader": leader})
        return moved
