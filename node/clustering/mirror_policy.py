"""Mirrored queues follow their policy after declare: which replica set each one should have now (pure).

What it is for: RabbitMQ changes a classic mirrored queue's mirrors when its policy's `ha-mode`/`ha-params`
change, when a node joins or leaves (`all`), and replaces a dead mirror for `exactly`. In a cluster the replica
set is the controller's `MirrorRecord` (cluster/metadata/mirror.py); `mirror_plan` compares every mirrored queue's
record with what its policy asks for now and returns the `AlterMirrorReplicas` commands that bring them in step.
Only the metadata leader's node runs it (node/runtime/cluster/liveness.py), so one node proposes; a command that
finds the record already as asked changes nothing.

How it works (per queue; the leader, or the first replica when nobody leads, anchors the ring of node names):
- `all`: every cluster node (`state.nodes`), up or down (a down replica catches up when it returns); a node
  removed from the cluster leaves.
- `exactly` N: the current replicas still in the cluster, less those down for `replace_after_ms` or more when an
  up node outside the set can take their place (0 = never replace), filled up to N with up nodes in ring order
  after the leader, or cut to N (down ones first, then out-of-sync ones, then the last in ring order; never the
  leader).
- `nodes`: the listed nodes that are in the cluster (up or down); none of them: unchanged (RabbitMQ keeps the
  queue where it is).
The leader leads the result when it is in it (the model moves leadership to a synced member first when it is
not). Only the set counts: the same nodes in another order is no change. `ha-min-insync` and
`ha-promote-on-failure` follow the policy too; under `ha-sync-mode: manual` new mirrors of a queue holding messages
are held out of the ISR (`hold_from`, node/clustering/mirror_sync.py). Queues without a leader, or whose policy no longer mirrors them,
are left alone (the latter: docs/mirrored_queues.md, "Not built yet").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from cluster.metadata import model as md
from cluster.metadata.mirror import AlterMirrorReplicas, MirrorRecord
from node.broker.ha_policy import HaSpec
from node.broker.policies import Policy
from node.clustering.definitions import mirror_spec_in, vhost_policies
from node.clustering.mirror_sync import MsgIdSpan, hold_from


def _ring(nodes: Collection[str], first: str) -> list[str]:
    ordered = sorted(set(nodes) | {first})
    at = ordered.index(first)
    return ordered[at:] + ordered[:at]


def wanted_replicas(spec: HaSpec, record: MirrorRecord, cluster: Collection[str], up: Collection[str],
                    gone: Collection[str]) -> tuple[str, ...]:
    """The replicas `spec` asks for now (leader first when kept). `cluster`: every node of the cluster; `up`: the
    nodes up; `gone`: the nodes down long enough to be replaced."""
    first = record.leader or record.replicas[0]
    ring = _ring(set(cluster) | set(record.replicas), first)
    current = [r for r in ring if r in record.replicas and r in cluster]
    if spec.mode == "all":
        wanted = [n for n in ring if n in cluster]
    elif spec.mode == "nodes":
        listed = spec.params if isinstance(spec.params, tuple) else ()
        wanted = [n for n in ring if n in listed and n in cluster] or list(record.replicas)
    else:
        count = max(1, spec.params if isinstance(spec.params, int) else 1)
        spare = [n for n in ring if n in up and n not in record.replicas]
        wanted = []
        for r in current:
            if r in gone and r != first and spare:
                wanted.append(spare.pop(0))  # a dead mirror replaced at once by an up non-replica
            else:
                wanted.append(r)
        wanted += spare[:max(0, count - len(wanted))]
        while len(wanted) > count:
            droppable = [r for r in wanted if r != first]
            wanted.remove(min(droppable, key=lambda r: (r in up, r in record.isr, -ring.index(r))))
    order = [n for n in ring if n in wanted]
    return tuple(order)


def mirror_plan(state: md.MetadataState, up: Collection[str], down_since_ms: Mapping[str, int], now_ms: int,
                replace_after_ms: int, span: MsgIdSpan | None = None) -> list[AlterMirrorReplicas]:
    """The commands that bring every mirrored queue's replicas (and min in-sync, promote-on-failure) to its policy.
    `span`: this node's copy of each queue's message ids, for the join point of mirrors added under
    `ha-sync-mode: manual` (node/clustering/mirror_sync.py; None: never held out)."""
    cluster = set(state.nodes)
    up_now = {n for n in up if n in cluster and state.nodes[n].state != "down" and n not in down_since_ms}
    gone = set() if replace_after_ms <= 0 else {
        n for n, since in down_since_ms.items() if now_ms - since >= replace_after_ms}
    commands: list[AlterMirrorReplicas] = []
    policies: dict[str, list[Policy]] = {}  # per vhost, made once per call (the plan runs every liveness poll)
    for key in sorted(state.mirrors):
        record = state.mirrors[key]
        queue = state.queues.get(key)
        vhost = key[0]
        if vhost not in policies:
            policies[vhost] = vhost_policies(state, vhost)
        spec = mirror_spec_in(state, *key, policies=policies[vhost])
        if spec is None or queue is None or queue.type != "mirrored" or not record.leader:
            continue
        wanted = wanted_replicas(spec, record, cluster, up_now, gone)
        min_insync = max(1, min(spec.min_insync, len(wanted)))
        if (set(wanted) == set(record.replicas) and min_insync == record.min_insync
                and spec.promote_on_failure == record.promote_on_failure):
            continue
        if set(wanted) == set(record.replicas):
            wanted = record.replicas
        hold = hold_from(spec, span(*key)) if span is not None and set(wanted) - set(record.replicas) else 0
        commands.append(AlterMirrorReplicas(record.vhost, record.name, wanted, tuple(sorted(up_now)), min_insync,
                                            spec.promote_on_failure, hold))
    return commands


def same_plan(a: AlterMirrorReplicas, b: AlterMirrorReplicas) -> bool:
    """The same command but for the join point (which moves with every publish)."""
    return replace(a, hold_from=0) == replace(b, hold_from=0)
