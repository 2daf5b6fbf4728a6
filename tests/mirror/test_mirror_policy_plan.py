"""mirror_plan (node/clustering/mirror_policy.py): the replica set each mirrored queue's policy asks for after
declare, applied through model.apply as the metadata leader's node does (pure)."""

from __future__ import annotations

from typing import Any

from cluster.metadata import model
from cluster.metadata.mirror import AlterMirrorIsr, DeclareMirror, MirrorRecord
from cluster.metadata.model import (
    AddNode,
    DeclareQueue,
    MetadataState,
    PolicyRecord,
    PutVhost,
    QueueRecord,
    SetNodeState,
    SetPolicy,
)
from node.clustering.mirror_policy import mirror_plan

NODES = ("a", "b", "c", "d")


def _state(replicas: tuple[str, ...], definition: dict[str, Any]) -> MetadataState:
    s = MetadataState()
    commands: list[Any] = [AddNode(n, f"{n}:1", model.PROTOCOL_VERSION) for n in NODES]
    commands += [PutVhost("/"), SetPolicy(PolicyRecord("/", "ha", "^q$", "queues", definition)),
                 DeclareQueue(QueueRecord("/", "q", type="mirrored", leader=replicas[0], members=replicas)),
                 DeclareMirror("/", "q", replicas)]
    for command in commands:
        s, outcome = model.apply(s, command)
        assert outcome.ok, outcome.refused
    return s


def _policy(s: MetadataState, definition: dict[str, Any]) -> MetadataState:
    s, _ = model.apply(s, SetPolicy(PolicyRecord("/", "ha", "^q$", "queues", definition)))
    return s


def _settle(s: MetadataState, up: tuple[str, ...] = NODES, down_since: dict[str, int] | None = None,
            now: int = 0, replace_after: int = 5_000) -> tuple[MetadataState, int]:
    """Apply the plan until it changes nothing (as the leader's node does, once per liveness poll); how many
    commands changed something."""
    sent = 0
    for _ in range(5):
        changed = 0
        for command in mirror_plan(s, up, down_since or {}, now, replace_after):
            s, outcome = model.apply(s, command)
            assert outcome.ok, outcome.refused
            changed += bool(outcome.changes)
        if not changed:
            return s, sent
        sent += changed
    raise AssertionError("the plan does not settle")


def _rec(s: MetadataState) -> MirrorRecord:
    return s.mirrors[("/", "q")]


def test_unchanged_policy_plans_nothing() -> None:
    s = _state(("a", "b"), {"ha-mode": "exactly", "ha-params": 2})
    assert mirror_plan(s, NODES, {}, 0, 5_000) == []


def test_exactly_grows_and_shrinks_with_ha_params_keeping_the_leader() -> None:
    s = _state(("b",), {"ha-mode": "exactly", "ha-params": 1})
    s, sent = _settle(_policy(s, {"ha-mode": "exactly", "ha-params": 3, "ha-min-insync": 2}))
    assert sent == 1 and _rec(s).replicas == ("b", "c", "d") and _rec(s).min_insync == 2
    assert s.queues[("/", "q")].members == ("b", "c", "d")
    s, _ = model.apply(s, AlterMirrorIsr("/", "q", "b", 0, ("b", "c", "d")))
    s, sent = _settle(_policy(s, {"ha-mode": "exactly", "ha-params": 2}))
    assert _rec(s).replicas == ("b", "c") and _rec(s).isr == ("b", "c") and _rec(s).min_insync == 1


def test_all_follows_the_cluster_and_nodes_moves_the_leader_first() -> None:
    s = _state(("a",), {"ha-mode": "exactly", "ha-params": 1})
    s, _ = _settle(_policy(s, {"ha-mode": "all"}))
    assert _rec(s).replicas == NODES
    s, _ = model.apply(s, model.RemoveNode("d", force=True))
    s, _ = _settle(s)
    assert _rec(s).replicas == ("a", "b", "c")
    s = _policy(s, {"ha-mode": "nodes", "ha-params": ["c", "b", "zz"]})
    s, _ = _settle(s)  # a leads and nobody else is in sync yet: a stays until one is
    assert (_rec(s).replicas, _rec(s).leader) == (("a", "b", "c"), "a")
    s, _ = model.apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a", "c")))
    s, _ = _settle(s)
    assert (_rec(s).replicas, _rec(s).leader, _rec(s).epoch) == (("b", "c"), "c", 1)


def test_exactly_replaces_a_dead_mirror_after_the_grace_period_only() -> None:
    s = _state(("a", "b"), {"ha-mode": "exactly", "ha-params": 2})
    s, _ = model.apply(s, SetNodeState("b", "down"))
    up = ("a", "c", "d")
    assert mirror_plan(s, up, {"b": 1_000}, 5_999, 5_000) == []
    assert mirror_plan(s, up, {"b": 1_000}, 60_000, 0) == []  # 0: never
    s, sent = _settle(s, up, {"b": 1_000}, 6_000)
    assert sent == 1 and _rec(s).replicas == ("a", "c") and _rec(s).isr == ("a",)


def test_a_dead_mirror_stays_when_no_node_can_take_its_place() -> None:
    s = _state(("a", "b", "c", "d"), {"ha-mode": "exactly", "ha-params": 4})
    assert mirror_plan(s, ("a", "c", "d"), {"b": 0}, 60_000, 5_000) == []


def test_queues_the_policy_no_longer_mirrors_and_leaderless_ones_are_left_alone() -> None:
    s = _state(("a",), {"ha-mode": "exactly", "ha-params": 1})
    assert mirror_plan(_policy(s, {"max-length": 5}), NODES, {}, 0, 5_000) == []
    s, _ = model.apply(s, model.ClearPolicy("/", "ha"))
    assert mirror_plan(s, NODES, {}, 0, 5_000) == []
