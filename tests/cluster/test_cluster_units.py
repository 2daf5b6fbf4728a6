"""Unit tests of cluster mode's pure helpers: settings, definitions both ways, proposal and liveness tracking."""

from __future__ import annotations

import dataclasses

import pytest

from cluster.metadata import model as md
from node.broker import records as br
from node.clustering.definitions import (
    client_local_placement,
    commands_for,
    mirror_records,
    missing_bootstrap,
)
from node.clustering.proposals import PeerLiveness, Pending, ProposalTracker
from node.runtime.config import ConfigError, NodeConfig, cluster_layout, validate

SECRET = "0123456789abcdef-secret"


def _config(**values: object) -> NodeConfig:
    base: dict[str, object] = dict(node_name="a", cluster_nodes=("a=127.0.0.1:5000", "b=127.0.0.1:5001", "c=127.0.0.1:5002"),
                cluster_secret=SECRET)
    base.update(values)
    return dataclasses.replace(NodeConfig(), **base)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ settings


def test_layout_derives_ports_from_the_amqp_port() -> None:
    layout = cluster_layout(validate(_config()))
    assert layout.names == ("a", "b", "c")
    b = layout.members[1]
    assert (b.host, b.amqp_port, b.raft_port, b.metadata_port, b.management_port) == (
        "127.0.0.1", 5001, 25001, 26001, 15001)
    assert [p.name for p in layout.peers] == ["b", "c"]


def test_explicit_ports_apply_to_every_node() -> None:
    layout = cluster_layout(validate(_config(raft_port=7000, metadata_port=7001, management_port=7002)))
    assert {m.raft_port for m in layout.members} == {7000}
    assert {m.metadata_port for m in layout.members} == {7001}
    assert layout.me.management_port == 7002


@pytest.mark.parametrize("values, message", [
    (dict(cluster_secret="short"), "cluster_secret"),
    (dict(node_name="z"), "must include this node"),
    (dict(cluster_nodes=("a=127.0.0.1:5000", "a=127.0.0.1:5001")), "distinct"),
    (dict(cluster_nodes=("a=127.0.0.1",)), "name=host:amqp_port"),
    (dict(cluster_nodes=("a=127.0.0.1:60000",)), "out of range"),
])
def test_bad_cluster_settings_are_refused(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(_config(**values))


# ------------------------------------------------------------------------------------------------ definitions


def _state_with_nodes(*names: str) -> md.MetadataState:
    state = md.MetadataState()
    for name in names:
        state, _ = md.apply(state, md.AddNode(name, f"{name}:1", md.PROTOCOL_VERSION))
    return state


def _apply_all(state: md.MetadataState, commands: list[md.Command]) -> md.MetadataState:
    for command in commands:
        state, outcome = md.apply(state, command)
        assert outcome.ok, outcome.refused
    return state


def test_broker_records_become_commands_and_mirror_back() -> None:
    state = _state_with_nodes("a", "b", "c")
    place = client_local_placement("b", 3)
    persisted = [
        br.VHostRecord("v"),
        br.ExchangeRecord("v", "x", "topic", arguments={"k": 1}),
        br.QueueRecord("v", "q", arguments={"x-queue-type": "quorum"}),
        br.QueueRecord("v", "c1"),
        br.BindingRecord("v", "x", "queue", "q", "a.#"),
    ]
    after = _apply_all(state, commands_for(persisted, state, place))
    quorum = after.queues[("v", "q")]
    assert quorum.type == "quorum" and quorum.leader == "b" and set(quorum.members) == {"a", "b", "c"}
    classic = after.queues[("v", "c1")]
    assert classic.type == "classic" and classic.members == ("b",)
    mirrored = mirror_records(state, after)
    assert mirrored == [
        br.VHostRecord("v"),
        *(br.ExchangeRecord("v", name, kind, internal=name in md.PREDECLARED_INTERNAL)  # every vhost has them
          for name, kind in md.PREDECLARED_EXCHANGES),
        br.ExchangeRecord("v", "x", "topic", arguments={"k": 1}),
        br.QueueRecord("v", "q", arguments={"x-queue-type": "quorum"}),
        br.QueueRecord("v", "c1"),
        br.BindingRecord("v", "x", "queue", "q", "a.#"),
    ]
    assert mirror_records(after, after) == []


def test_deletions_mirror_children_first() -> None:
    state = _state_with_nodes("a")
    place = client_local_placement("a", 3)
    full = _apply_all(state, commands_for([br.VHostRecord("v"), br.QueueRecord("v", "q"),
                                           br.ExchangeRecord("v", "x", "direct"),
                                           br.BindingRecord("v", "x", "queue", "q", "k")], state, place))
    gone = _apply_all(full, [md.DeleteVhost("v")])
    records = mirror_records(full, gone)
    kinds = [type(r).__name__ for r in records]
    assert kinds == ["BindingRecord", "QueueRecord", *["ExchangeRecord"] * (1 + len(md.PREDECLARED_EXCHANGES)),
                     "VHostRecord"]
    assert all(r.deleted for r in records)


def test_group_size_argument_and_redeclare_keep_placement() -> None:
    state = _state_with_nodes("a", "b", "c")
    place = client_local_placement("c", 3)
    q = br.QueueRecord("/", "q", arguments={"x-queue-type": "quorum", "x-quorum-initial-group-size": 2})
    state = _apply_all(state, [md.PutVhost("/")])
    after = _apply_all(state, commands_for([q], state, place))
    placed = after.queues[("/", "q")]
    assert placed.leader == "c" and len(placed.members) == 2
    again = commands_for([q], after, client_local_placement("a", 3))
    _, outcome = md.apply(after, again[0])
    assert outcome.ok and not outcome.changes


def test_placement_change_alone_is_not_mirrored() -> None:
    state = _apply_all(_state_with_nodes("a", "b"), [md.PutVhost("/")])
    state = _apply_all(state, commands_for([br.QueueRecord("/", "q", arguments={"x-queue-type": "quorum"})],
                                           state, client_local_placement("a", 3)))
    moved = _apply_all(state, [md.SetQueueLeader("/", "q", "b")])
    assert mirror_records(state, moved) == []


def test_bootstrap_adds_only_what_the_cluster_lacks() -> None:
    state = _apply_all(md.MetadataState(), [md.PutVhost("/"), md.PutUser("guest", "h")])
    records = [br.VHostRecord("/"), br.UserRecord("guest", "other"), br.UserRecord("app", "h2"),
               br.PermissionRecord("guest", "/", ".*", ".*", ".*")]
    assert missing_bootstrap(records, state) == records[2:]


# ------------------------------------------------------------------------------------------------ tracking


def _pending(tracker: ProposalTracker, group: str, now_ms: int) -> Pending:
    pending = Pending(tracker.next_id(), group, "/", group, b"x", now_ms)
    tracker.add(pending)
    return pending


def test_tracker_retries_groups_in_id_order_and_expires() -> None:
    tracker = ProposalTracker(first_id=1000, retry_ms=500, timeout_ms=10_000)
    p1 = _pending(tracker, "g1", 0)
    p2 = _pending(tracker, "g1", 0)
    p3 = _pending(tracker, "g2", 0)
    assert (p1.proposal_id, p2.proposal_id, p3.proposal_id) == (1000, 1001, 1002)
    assert sorted(tracker.groups_due(0)) == ["g1", "g2"]  # never sent yet
    for p in (p1, p2, p3):
        p.sent_ms = 0
    assert tracker.groups_due(499) == []
    assert tracker.applied(1000) is p1
    assert tracker.of_group("g1") == [p2]
    assert sorted(tracker.groups_due(500)) == ["g1", "g2"]
    assert tracker.expired(9_999) == []
    assert tracker.expired(10_000) == [p2, p3]
    assert len(tracker) == 0 and tracker.groups_due(20_000) == []


def test_tracker_backs_off_while_the_leader_is_unchanged() -> None:
    """Resending every pending proposal at a fixed pace to a slow leader livelocks (docs/raft.md): each timer resend
    doubles the group's interval, up to retry_ms * retry_backoff_max; a new leader or an emptied group resets it."""
    tracker = ProposalTracker(first_id=1, retry_ms=500, timeout_ms=60_000, retry_backoff_max=4)
    p1 = _pending(tracker, "g", 0)
    tracker.retried("g")  # never sent yet: not a resend
    p1.sent_ms = 0
    assert tracker.groups_due(499) == [] and tracker.groups_due(500) == ["g"]
    sent = 500
    for interval in (1000, 2000, 2000):  # doubled, doubled again, then at the bound (500 * 4)
        tracker.retried("g")
        p1.sent_ms = sent
        assert tracker.groups_due(sent + interval - 1) == [] and tracker.groups_due(sent + interval) == ["g"]
        sent += interval
    tracker.leader_changed("g")
    assert tracker.groups_due(sent + 500) == ["g"]
    tracker.retried("g")
    tracker.applied(p1.proposal_id)  # the group emptied: a new proposal starts at retry_ms again
    p2 = _pending(tracker, "g", 0)
    p2.sent_ms = 0
    assert tracker.groups_due(500) == ["g"]


def test_tracker_drop_group_and_bound() -> None:
    tracker = ProposalTracker(first_id=1, pending_max=2)
    _pending(tracker, "g", 0)
    assert not tracker.full()
    _pending(tracker, "g", 0)
    assert tracker.full()
    assert len(tracker.drop_group("g")) == 2 and len(tracker) == 0
    assert tracker.applied(1) is None


def test_liveness_down_after_silence_and_back_up() -> None:
    live = PeerLiveness(("b", "c"), down_after_ms=5000, start_ms=0)
    assert live.observe({"b"}, 4999) == ([], [])
    assert live.observe({"b"}, 5000) == (["c"], [])
    assert live.down_since_ms == {"c": 5000}
    assert live.observe({"b"}, 9000) == ([], [])
    assert live.observe({"c"}, 9500) == ([], ["c"])
    assert live.down_since_ms == {}
    assert live.observe(set(), 13999) == ([], [])
    assert live.observe(set(), 14000) == (["b"], [])


def test_entries_may_name_raft_and_metadata_ports() -> None:
    layout = cluster_layout(validate(_config(cluster_nodes=(
        "a=127.0.0.1:5000:7000:7001", "b=[::1]:5001:7100", "c=127.0.0.1:5002"))))
    a, b, c = layout.members
    assert (a.raft_port, a.metadata_port) == (7000, 7001)
    assert (b.host, b.raft_port, b.metadata_port) == ("::1", 7100, 26001)
    assert (c.raft_port, c.metadata_port) == (25002, 26002)


def test_configured_nodes_not_yet_joined_count_as_up_but_down_nodes_do_not() -> None:
    state = _apply_all(_state_with_nodes("a"), [md.PutVhost("/")])
    quorum = br.QueueRecord("/", "q", arguments={"x-queue-type": "quorum"})
    place = client_local_placement("a", 3, ("a", "b", "c"))
    after = _apply_all(state, commands_for([quorum], state, place))
    assert sorted(after.queues[("/", "q")].members) == ["a", "b", "c"]
    state = _apply_all(_state_with_nodes("a", "b"), [md.PutVhost("/"), md.SetNodeState("b", "down")])
    after = _apply_all(state, commands_for([quorum], state, place))
    assert sorted(after.queues[("/", "q")].members) == ["a", "c"]
