"""`ha-sync-mode: manual` (pure): held-out mirrors in the metadata (cluster/metadata/mirror.py, through the codec),
the core's ISR expansion skipping them, the join point and release rule (node/clustering/mirror_sync.py) and the
queue machine's oldest message id that the rule reads. The real-cluster side is in tests/mirror/test_mirror_cluster.py."""

from __future__ import annotations

from typing import Any

import cbor2

from cluster.metadata import model
from cluster.metadata.mirror import (
    AlterMirrorIsr,
    AlterMirrorReplicas,
    MirrorRecord,
    MirrorReplicaDown,
    SyncMirror,
    TransferMirror,
)
from cluster.metadata.mirror_convert import ConvertToMirror
from cluster.metadata.model import AddNode, DeclareQueue, PolicyRecord, QueueRecord, SetPolicy
from cluster.metadata.state import restore, snapshot
from cluster.mirror_queues.core.replica import Replica
from cluster.mirror_queues.core.types import FetchRequest, IsrChanged, Settings
from cluster.queue import Enqueue, Get, Queue, QueuedMessage, Return, Settle
from node.broker.ha_policy import ha_spec
from node.clustering.mirror_policy import mirror_plan
from node.clustering.mirror_sync import hold_from, sync_plan
from tests.metadata.test_mirror_controller import ABC, _apply, _rec, _state


def _held(s: model.MetadataState) -> dict[str, int]:
    return _rec(s).held_out


def test_a_mirror_added_under_manual_is_held_out_until_synced() -> None:
    s = _state(("a",))
    s, outcome = _apply(s, AlterMirrorReplicas("/", "q", ("a", "b"), ABC, hold_from=7))
    assert outcome.ok and _held(s) == {"b": 7} and _rec(s).isr == ("a",)
    _, outcome = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a", "b")))  # caught up, but not synchronised
    assert "not synchronised" in outcome.refused
    again, outcome = _apply(s, AlterMirrorReplicas("/", "q", ("a", "b"), ABC, hold_from=9))  # a repeat: no-op
    assert not outcome.changes and again == s
    s, outcome = _apply(s, SyncMirror("/", "q"))
    assert outcome.ok and _held(s) == {}
    s, outcome = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a", "b")))
    assert outcome.ok and _rec(s).isr == ("a", "b")
    _, outcome = _apply(s, SyncMirror("/", "q"))  # nothing held out: nothing to do
    assert outcome.ok and not outcome.changes


def test_automatic_or_an_empty_queue_holds_nothing_and_removal_clears_the_hold() -> None:
    s, _ = _apply(_state(("a",)), AlterMirrorReplicas("/", "q", ("a", "b"), ABC))  # hold_from 0
    assert _held(s) == {}
    s, _ = _apply(s, AlterMirrorReplicas("/", "q", ABC, ABC, hold_from=3))
    assert _held(s) == {"c": 3}  # only the new one
    s, _ = _apply(s, SyncMirror("/", "q", ("b",)))  # b is not held: c stays held
    assert _held(s) == {"c": 3}
    s, _ = _apply(s, AlterMirrorReplicas("/", "q", ("a", "b"), ABC))
    assert _held(s) == {}


def test_when_synced_never_promotes_a_held_out_mirror_and_always_clears_its_hold() -> None:
    for promote, leader in (("when-synced", ""), ("always", "b")):
        s = _state(("a",), promote_on_failure=promote)
        s, _ = _apply(s, AlterMirrorReplicas("/", "q", ("a", "b"), ABC, hold_from=5))
        _, outcome = _apply(s, TransferMirror("/", "q", "b", ("a", "b")))  # orderly shutdown: not to b
        assert not outcome.changes
        s, _ = _apply(s, MirrorReplicaDown("/", "q", "a", 0, ("b",)))
        assert _rec(s).leader == leader
        assert _held(s) == ({} if leader else {"b": 5})


def test_held_out_survives_the_codec_and_old_records_decode_without_it() -> None:
    s = _state(("a",))
    s, _ = _apply(s, AlterMirrorReplicas("/", "q", ("a", "b"), ABC, hold_from=11))
    back = restore(cbor2.loads(cbor2.dumps(snapshot(s))))
    assert back.mirrors == s.mirrors and back.mirrors[("/", "q")].held_out == {"b": 11}
    old = model.from_plain({"t": "MirrorRecord", "vhost": "/", "name": "q", "replicas": ["a"], "leader": "a"})
    assert isinstance(old, MirrorRecord) and old.held_out == {}


def test_a_converted_queue_holds_its_other_replicas_out_under_manual() -> None:
    s = model.MetadataState()
    for command in (model.PutVhost("/"), DeclareQueue(QueueRecord("/", "q", leader="a", members=("a",)))):
        s, _ = model.apply(s, command)
    incarnation = s.queues[("/", "q")].incarnation
    held, outcome = _apply(s, ConvertToMirror("/", "q", incarnation, "a", ABC, hold_from=4))
    assert outcome.ok and _held(held) == {"b": 4, "c": 4} and _rec(held).isr == ("a",)
    plain, _ = _apply(s, ConvertToMirror("/", "q", incarnation, "a", ABC))
    assert _held(plain) == {}


def test_the_leader_does_not_take_a_held_out_follower_into_the_isr() -> None:
    a = Replica("a", Settings())
    a.become_leader(0, frozenset({"a"}), 0)
    a.publish("m0")
    a.held_out = frozenset({"b"})
    effects = a.handle(FetchRequest("b", 0, 1), 10)  # b has everything: still not in the ISR
    assert a.isr == {"a"} and not [e for e in effects if isinstance(e, IsrChanged)]
    a.held_out = frozenset()
    effects = a.handle(FetchRequest("b", 0, 1), 20)
    assert a.isr == {"a", "b"} and IsrChanged("a", 0, frozenset({"a", "b"})) in effects


def test_the_join_point_is_the_next_message_id_of_a_queue_holding_messages() -> None:
    manual, automatic = ha_spec({"ha-mode": "all"}), ha_spec({"ha-mode": "all", "ha-sync-mode": "automatic"})
    assert manual is not None and manual.sync_mode == "manual"  # RabbitMQ's default
    assert hold_from(manual, (8, 3)) == 8
    assert hold_from(manual, (8, None)) == 0  # empty: nothing below the join, synchronised at once
    assert hold_from(automatic, (8, 3)) == 0 and hold_from(manual, None) == 0


def _policy_state(definition: dict[str, Any]) -> model.MetadataState:
    s = _state(("a",))
    for command in [AddNode(n, f"{n}:1", model.PROTOCOL_VERSION) for n in ABC] + [
            SetPolicy(PolicyRecord("/", "ha", "^q$", "queues", definition))]:
        s, outcome = model.apply(s, command)
        assert outcome.ok, outcome.refused
    return s


def test_the_policy_plan_holds_new_mirrors_and_the_leader_releases_them() -> None:
    s = _policy_state({"ha-mode": "exactly", "ha-params": 2})
    (command,) = mirror_plan(s, ABC, {}, 0, 5_000, lambda _v, _q: (10, 4))
    assert command.hold_from == 10
    s, _ = _apply(s, command)
    assert _held(s) == {"b": 10}
    assert sync_plan(s, "b", lambda _v, _q: (12, 10)) == []  # only the leader's node proposes
    assert sync_plan(s, "a", lambda _v, _q: (12, 9)) == []  # message 9 (below the join) is still there
    assert sync_plan(s, "a", lambda _v, _q: (12, 10)) == [SyncMirror("/", "q", ("b",))]
    assert sync_plan(s, "a", lambda _v, _q: (12, None)) == [SyncMirror("/", "q", ("b",))]
    s, _ = model.apply(s, SetPolicy(PolicyRecord("/", "ha", "^q$", "queues", {
        "ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"})))
    assert sync_plan(s, "a", lambda _v, _q: (12, 1)) == [SyncMirror("/", "q", ("b",))]


def test_mirrors_needed_for_min_insync_are_synchronised_at_once() -> None:
    s = _policy_state({"ha-mode": "exactly", "ha-params": 3, "ha-min-insync": 2})
    (command,) = mirror_plan(s, ABC, {}, 0, 5_000, lambda _v, _q: (10, 4))
    s, _ = _apply(s, command)
    assert _held(s) == {"b": 10, "c": 10} and _rec(s).min_insync == 2
    assert sync_plan(s, "a", lambda _v, _q: (12, 4)) == [SyncMirror("/", "q", ("b",))]  # one more makes 2


def test_the_oldest_message_id_counts_ready_unacked_and_requeued_messages() -> None:
    q = Queue("q")
    assert q.oldest_msg_id() is None
    for i in range(4):
        q.apply(Enqueue(QueuedMessage(f"m{i}", 1, True), i))
    assert q.oldest_msg_id() == 1
    q.apply(Get("g", False, 10))  # 1 unacked, 2..4 ready
    q.apply(Get("g", True, 11))  # 2 gone (no ack)
    assert q.oldest_msg_id() == 1
    q.apply(Settle("g", (1,)))
    assert q.oldest_msg_id() == 3
    q.apply(Get("g", False, 12))
    q.apply(Return("g", (3,), 13))  # back at its place
    assert q.oldest_msg_id() == 3
    q.apply(Get("g", False, 14))
    q.apply(Get("g", False, 15))
    q.apply(Settle("g", (3, 4)))
    assert q.oldest_msg_id() is None and q.msg_ids_used + 1 == 5
